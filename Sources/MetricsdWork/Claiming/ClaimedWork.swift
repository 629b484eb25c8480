import MetricsdPostgres

/// What a claim gives a worker: a chunk of users to compute (a daily unit's or a recompute job's), or a chunk of
/// old rows to remove (a retention run's). Both come from the same queue, by the same claim, under the same lease.
public enum ClaimedWork: Sendable, Hashable {
    case users(ClaimedChunk)
    case retention(RetentionChunk)

    public var id: Int64 {
        switch self {
        case .users(let chunk): chunk.id
        case .retention(let chunk): chunk.id
        }
    }

    /// The instance whose expired lease this claim took over, if any.
    public var takenOverFrom: String? {
        switch self {
        case .users(let chunk): chunk.takenOverFrom
        case .retention(let chunk): chunk.takenOverFrom
        }
    }
}
