/// One stored row of a user's history: their metrics for one local date and formula version.
public struct HistoryEntry: Hashable, Sendable {
    /// The user's local date the row is for.
    public let date: LocalDate
    public let metrics: ComputedMetrics
    /// `computed_at`, millisecond precision.
    public let computedAt: Timestamp
    /// When the user acknowledged exactly this row (same version and `computed_at`), or nil. Only the user's
    /// latest acknowledgement is kept, so at most one entry has one.
    public let acknowledgedAt: Timestamp?

    public init(date: LocalDate, metrics: ComputedMetrics, computedAt: Timestamp, acknowledgedAt: Timestamp?) {
        self.date = date
        self.metrics = metrics
        self.computedAt = computedAt
        self.acknowledgedAt = acknowledgedAt
    }
}

/// What a history read asks for. Dates left nil take their defaults from the user's current local date.
public struct HistoryQuery: Hashable, Sendable {
    /// The longest range one request may span, first and last date included: two years and a leap day.
    public static let maxSpanDays = 731
    /// How many days a range spans when `from` is not given: the last 90 days up to `to`.
    public static let defaultSpanDays = 90
    /// Entries per page at most, and by default.
    public static let maxLimit = 731
    public static let defaultLimit = 100

    public var from: LocalDate?
    public var to: LocalDate?
    public var version: Int
    /// The first date of this page (from a cursor), nil for the first page.
    public var resumeAt: LocalDate?
    public var limit: Int

    public init(from: LocalDate?, to: LocalDate?, version: Int, resumeAt: LocalDate?, limit: Int) {
        self.from = from
        self.to = to
        self.version = version
        self.resumeAt = resumeAt
        self.limit = limit
    }
}

/// One page of a user's history, oldest date first.
public struct HistoryPage: Hashable, Sendable {
    /// The range the query resolved to (defaults filled in from the user's current local date).
    public let from: LocalDate
    public let to: LocalDate
    public let entries: [HistoryEntry]
    /// The first date of the next page, when there are more entries in the range.
    public let next: LocalDate?

    public init(from: LocalDate, to: LocalDate, entries: [HistoryEntry], next: LocalDate?) {
        self.from = from
        self.to = to
        self.entries = entries
        self.next = next
    }
}

/// What a history read gave.
public enum HistoryOutcome: Hashable, Sendable {
    case page(HistoryPage)
    /// No such user.
    case unknownUser
    /// The latest verdict on the user's settings is that they are missing or invalid (every reason,
    /// `; `-separated): the stored rows no longer match what the person entered.
    case invalidSettings(String)
    /// The range the query resolves to is wrong: `from` after `to`, or longer than ``HistoryQuery/maxSpanDays``;
    /// the resolved range, for the message.
    case badRange(from: LocalDate, to: LocalDate)
    /// The cursor's date is outside the range it was given with.
    case cursorOutsideRange(LocalDate)
}

/// The storage port of the history read (`GET /v1/profile/metrics/history`).
public protocol MetricsHistoryStore: Sendable {
    /// One page of the user's rows of `query.version` dated in the range, oldest first.
    func history(userID: Int64, query: HistoryQuery) async throws -> HistoryOutcome
}
