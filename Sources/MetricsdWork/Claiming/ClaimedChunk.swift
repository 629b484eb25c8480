import HealthMetrics
import MetricsdPostgres
import Tracing

/// A chunk this worker holds.
public struct ClaimedChunk: Sendable, Hashable {
    public enum Kind: Sendable, Hashable {
        case daily(timezone: String, localDate: LocalDate)
        case recompute(jobID: Int64)
    }
    public let id: Int64
    public let kind: Kind
    public let version: Int
    public let rangeStart: Int64
    public let rangeEnd: Int64
    /// The last user id committed before this claim (resume point).
    public let cursor: Int64
    public let attempts: Int
    /// The instance whose lease on this chunk had expired while it was running (it crashed or stalled), when
    /// that was another instance; nil for a fresh chunk, a retry after a failure, or one handed back on shutdown.
    public let takenOverFrom: String?
    /// A daily chunk's due instant (its unit's local daily time on its date, as seconds since the epoch on the
    /// database's clock) and its zone's UTC offset at that instant, in seconds; nil for recompute chunks, and the
    /// offset nil for a zone the database does not know.
    public let dueEpochSeconds: Double?
    public let utcOffsetSeconds: Int?

    init(_ result: PostgresResult, row: Int) throws(PostgresError) {
        self.id = try result.int(row, 0)
        let kind = try result.requiredString(row, 1)
        if kind == "daily" {
            let dateText = try result.requiredString(row, 3)
            guard let date = LocalDate(iso: dateText) else {
                throw PostgresError(code: .unexpectedResult, message: "chunk date \(dateText) is not a date")
            }
            self.kind = .daily(timezone: try result.requiredString(row, 2), localDate: date)
        } else {
            self.kind = .recompute(jobID: try result.int(row, 5))
        }
        self.version = Int(try result.int(row, 4))
        self.rangeStart = try result.int(row, 6)
        self.rangeEnd = try result.int(row, 7)
        self.cursor = try result.int(row, 8)
        self.attempts = Int(try result.int(row, 9))
        self.takenOverFrom = result.string(row, 10)
        self.dueEpochSeconds = result.string(row, 12).flatMap(Double.init)
        self.utcOffsetSeconds = result.string(row, 13).flatMap(Int.init)
    }

    /// The name of the chunk's span.
    var spanName: String {
        switch self.kind {
        case .daily: "daily unit chunk"
        case .recompute: "recompute-all chunk"
        }
    }

    /// What the chunk's span says about it (no user's data: the zone, the date, the id range).
    var spanAttributes: [(String, SpanAttribute)] {
        var attributes: [(String, SpanAttribute)] = [
            ("metricsd.chunk.id", .int64(self.id)), ("metricsd.chunk.range_start", .int64(self.rangeStart)),
            ("metricsd.chunk.range_end", .int64(self.rangeEnd)),
            ("metricsd.formula.version", .int64(Int64(self.version))),
        ]
        switch self.kind {
        case .daily(let zone, let date):
            attributes.append(("metricsd.zone", .string(zone)))
            attributes.append(("metricsd.date", .string(date.description)))
        case .recompute(let job):
            attributes.append(("metricsd.recompute.job", .int64(job)))
        }
        return attributes
    }

    var conflict: SQL.Conflict {
        switch self.kind {
        case .daily: .updateIfChanged
        case .recompute: .keep
        }
    }

    var source: String {
        switch self.kind {
        case .daily: "daily"
        case .recompute: "recompute"
        }
    }
}
