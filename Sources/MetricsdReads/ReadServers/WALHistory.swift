import MetricsdPostgres
import MetricsdWork

/// The primary's WAL position over the last seconds: tells how stale a standby's data is from the position it has
/// replayed, on a busy primary and an idle one alike.
///
/// Each sample is (an instant, the primary's WAL insert position read *after* that instant): every transaction
/// committed on the primary before the instant has its commit record at or below the position. A standby that has
/// replayed position R therefore shows every commit made before the newest sample whose position is at or below R:
/// that instant is how fresh its data is, and the time since then is its staleness. On an idle primary the position
/// stands still, every sample equals R, and the standby counts as fresh as the newest sample; a standby that stops
/// replaying keeps its R and grows staler by the second whatever the primary does.
/// (`pg_last_xact_replay_timestamp()` instead says when the last replayed transaction committed, which on an idle
/// primary is long ago although the standby lacks nothing.)
///
/// Staleness measured this way is never less than the truth: samples only get older, and a standby only gets
/// fresher after it was asked.
struct WALHistory: Sendable {
    struct Sample: Sendable {
        let at: ContinuousClock.Instant
        let position: UInt64
    }

    /// Oldest first.
    private(set) var samples: [Sample] = []
    /// How far back samples are kept: a standby whose replay position is older than every kept sample is at least
    /// this stale (``freshness(replayed:)`` returns nil).
    let horizon: Duration

    init(horizon: Duration) {
        self.horizon = horizon
    }

    /// Records a sample (the primary's position read after `at`) and forgets those older than the horizon.
    mutating func record(at: ContinuousClock.Instant, position: UInt64) {
        self.samples.append(Sample(at: at, position: position))
        let cutoff = at - self.horizon
        if let keep = self.samples.firstIndex(where: { $0.at >= cutoff }), keep > 0 {
            self.samples.removeFirst(keep)
        }
    }

    /// The instant up to which a server that replayed `replayed` holds every commit of the primary: the newest
    /// sample at or below it; nil when it is behind every kept sample (staler than the horizon) or no sample exists.
    /// Searched from the newest: a new primary after a failover may sit at positions below the old one's last ones.
    func freshness(replayed: UInt64) -> ContinuousClock.Instant? {
        self.samples.last { $0.position <= replayed }?.at
    }
}
