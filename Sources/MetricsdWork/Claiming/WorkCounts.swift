import MetricsdPostgres

/// What a unit, job or chunk came to, in the words every report uses: of the users **examined**, **written**
/// (row inserted or changed), **already current** (the same row was there) and **skipped** (settings give no
/// metrics).
public struct WorkCounts: Sendable, Hashable {
    /// Users when the unit or job was created.
    public var total: Int64
    public var written: Int64
    public var alreadyCurrent: Int64
    public var skipped: Int64
    public var examined: Int64 { self.written + self.alreadyCurrent + self.skipped }

    public init(total: Int64, written: Int64, alreadyCurrent: Int64, skipped: Int64) {
        self.total = total
        self.written = written
        self.alreadyCurrent = alreadyCurrent
        self.skipped = skipped
    }

    /// From the chunk columns: `done` users have the row after the chunk (written or already there).
    init(total: Int64, done: Int64, written: Int64, skipped: Int64) {
        self.init(total: total, written: written, alreadyCurrent: max(0, done - written), skipped: skipped)
    }
}
