import HealthMetrics
import MetricsdPostgres
import MetricsdWork

extension SQL {
    // MARK: History

    /// Whose history is asked for: the user's current local date by the database clock (UTC for a zone the
    /// database does not know, as the daily work reads it) and their skip record's reasons, if any. No row: no
    /// such user. `$1` user id.
    static let historyUser = """
        SELECT CASE WHEN k.name IS NOT NULL THEN (now() AT TIME ZONE u.timezone)::date
                    ELSE (now() AT TIME ZONE 'UTC')::date END::text,
               sk.reasons
        FROM users u
        LEFT JOIN known_timezones k ON k.name = u.timezone
        LEFT JOIN metrics_skips sk ON sk.user_id = u.id
        WHERE u.id = $1
        """

    /// The user's rows of one version dated `$3` through `$4`, oldest first, at most `$5`, each with the
    /// acknowledgement of exactly that row. The date range prunes the monthly partitions (at execution, from the
    /// parameters); in each month left the user's rows are found through the read index
    /// `(user_id, computed_at DESC)` — a month holds at most a few dozen of one user's rows — and the few found
    /// are sorted by date. `$1` user id, `$2` version.
    ///
    /// Sent unprepared, so that each execution is planned for its values: a prepared statement's generic plan
    /// knows neither the range nor the user and reads the date-first key `(metrics_date, version, user_id)` in
    /// date order instead — every user's entries of every date in the range, to keep one user's. The store sends
    /// it for a range that ended a month or more ago; a recent one is ``historyRecent``.
    static let historyRange =
        historyRows + """
             AND pm.metrics_date <= $4::date
            ORDER BY pm.metrics_date
            LIMIT $5
            """

    /// What both history statements select: the user's rows of one version from `$3` on, each with its
    /// acknowledgement; each adds its upper bound, order and limit.
    private static let historyRows = """
        SELECT pm.metrics_date::text, pm.bmi::text, pm.bmr, pm.tdee,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint
        FROM profile_metrics pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = $1 AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        WHERE pm.user_id = $1 AND pm.version = $2 AND pm.metrics_date >= $3::date
        """

    /// `historyRange` for a range that ends within the last month (the app's default, the last 90 days), as a
    /// prepared statement: planning the range statement was most of the database's work per read (pgbench on
    /// 20,000 users with 90 days each, the user's statement beside it: 1,413 reads/s planned at each execution,
    /// 3,741 prepared). Its generic plan must still reach the user's entries of the read index, whatever the
    /// statistics say, and two things would draw it to the date-first key: the range itself (a range with both
    /// ends unknown is deemed a two-hundredth of each month) and the order (the key gives the rows in date order,
    /// so a limit could stop early). So the upper bound is written as a difference (`metrics_date - $4 <= 0`),
    /// which no index and no partition bound can use, leaving the key an open-ended lower bound the planner deems
    /// a third of each month; and the order is `metrics_date + 0`, which no index gives (the same order: the few
    /// rows found are sorted). The read index then wins. The lower bound prunes the months before the range at
    /// execution; the months after it are the current one and the empty ones made ahead.
    static let historyRecent =
        historyRows + """
             AND pm.metrics_date - $4::date <= 0
            ORDER BY pm.metrics_date + 0
            LIMIT $5
            """
}

extension PostgresStore: MetricsHistoryStore {
    public func history(userID: Int64, query: HistoryQuery) async throws -> HistoryOutcome {
        try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            let user = try connection.prepared("history_user", SQL.historyUser, [String(userID)])
            guard user.rowCount == 1 else { return .unknownUser }
            if let reasons = user.string(0, 1) { return .invalidSettings(reasons) }
            let todayText = try user.requiredString(0, 0)
            guard let today = LocalDate(iso: todayText) else {
                throw PostgresError(
                    code: .unexpectedResult, message: "local date \(todayText) of user \(userID) is not a date")
            }
            let to = query.to ?? today
            guard let from = query.from ?? to.adding(days: 1 - HistoryQuery.defaultSpanDays) else {
                return .badRange(from: to, to: to)
            }
            guard from <= to, to.daysSinceEpoch - from.daysSinceEpoch < HistoryQuery.maxSpanDays else {
                return .badRange(from: from, to: to)
            }
            let start = query.resumeAt ?? from
            guard start >= from, start <= to else { return .cursorOutsideRange(start) }
            let parameters = [
                String(userID), String(query.version), start.description, to.description, String(query.limit + 1),
            ]
            let recent = to.daysSinceEpoch >= today.daysSinceEpoch - 31
            let result =
                try recent
                ? connection.prepared("history_recent", SQL.historyRecent, parameters)
                : connection.query(SQL.historyRange, parameters)
            var entries: [HistoryEntry] = []
            entries.reserveCapacity(min(result.rowCount, query.limit))
            var next: LocalDate?
            for row in 0..<result.rowCount {
                let entry = try Self.decodeHistory(result, row: row, version: query.version, userID: userID)
                if entries.count == query.limit {
                    next = entry.date
                    break
                }
                entries.append(entry)
            }
            return .page(HistoryPage(from: from, to: to, entries: entries, next: next))
        }
    }

    /// One row of `historyRange`.
    static func decodeHistory(_ result: PostgresResult, row: Int, version: Int, userID: Int64) throws -> HistoryEntry {
        let dateText = try result.requiredString(row, 0)
        let bmiText = try result.requiredString(row, 1)
        guard let date = LocalDate(iso: dateText), let bmi = FixedPoint(parsing: bmiText, scale: 1) else {
            throw PostgresError(
                code: .unexpectedResult,
                message: "history row \(dateText) of user \(userID) has an unreadable date or bmi")
        }
        return HistoryEntry(
            date: date,
            metrics: ComputedMetrics(
                bmiTenths: bmi.units, bmr: try result.int(row, 2), tdee: try result.int(row, 3), version: version),
            computedAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 4)),
            acknowledgedAt: try result.optionalInt(row, 5).map { Timestamp(millisecondsSinceEpoch: $0) })
    }
}
