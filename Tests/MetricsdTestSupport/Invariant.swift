import Foundation
import HealthMetrics
import MetricsdPostgres
import NIOPosix
import Testing

/// A database the fault-injection scenarios talk to by URL: a test database on the shared server or the
/// database of a ``ThrowawayCluster``. Every call opens its own short connection on a blocking thread (never the
/// cooperative pool), named `applicationName`, so that `pg_terminate_backend` aimed at the daemon's backends
/// (`application_name = 'metricsd'`) never hits the test's own connections.
package struct FaultDatabase: Sendable {
    package let url: String

    package init(url: String, applicationName: String = "metricsd-fault-test") {
        self.url = Self.url(url, applicationName: applicationName)
    }

    /// `url` with `application_name` set (a URI gets a query parameter, a keyword string a keyword).
    package static func url(_ url: String, applicationName: String) -> String {
        guard url.contains("://") else { return url + " application_name=\(applicationName)" }
        return url + (url.contains("?") ? "&" : "?") + "application_name=\(applicationName)"
    }

    /// Threads for the fault scenarios' own libpq calls: not `TestDatabase.blocking`, which the other suites
    /// running in parallel keep busy (database creation retries, held locks): a scenario polling every 25 ms
    /// must neither wait behind them nor crowd them out.
    package static let threads: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 4)
        pool.start()
        return pool
    }()

    /// Runs `body` on a new connection, on a blocking thread; the connection closes afterwards.
    package func withConnection<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws
        -> T
    {
        let settings = try ConnectionSettings(conninfo: self.url, environment: [:])
        return try await Self.threads.runIfActive {
            let connection = try PostgresConnection(settings: settings)
            return try body(connection)
        }
    }

    /// Runs SQL without parameters (several statements separated by `;` are allowed).
    package func execute(_ sql: String) async throws {
        try await self.withConnection { try $0.execute(sql) }
    }

    /// A query's rows as text.
    package func rows(_ sql: String, _ parameters: [String?] = []) async throws -> [[String?]] {
        try await self.withConnection { connection in
            let result = try connection.query(sql, parameters)
            return (0..<result.rowCount).map { row in (0..<result.columnCount).map { result.string(row, $0) } }
        }
    }

    /// The single value of a one-row, one-column query.
    package func value(_ sql: String, _ parameters: [String?] = []) async throws -> String? {
        try await self.rows(sql, parameters).first?.first ?? nil
    }

    /// The single integer of a one-row, one-column query (0 for NULL).
    package func int(_ sql: String, _ parameters: [String?] = []) async throws -> Int {
        Int(try await self.value(sql, parameters) ?? "0") ?? 0
    }

    /// Records every row written to `profile_metrics` (insert or update, with the writer's `application_name`) in
    /// `fault_audit`. Rolled-back batches leave no trace, so a (user, date, version) audited twice was written
    /// twice. And every change of a chunk's lease, cursor or state in `fault_chunk_log` (when `work_chunks`
    /// exists), with the database clock of the statement: who held which chunk when.
    package func installAudit() async throws {
        try await self.execute(
            """
            CREATE TABLE fault_audit (
              user_id BIGINT NOT NULL, metrics_date DATE NOT NULL, version INTEGER NOT NULL, op TEXT NOT NULL,
              app TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
            CREATE FUNCTION fault_audit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO fault_audit (user_id, metrics_date, version, op, app)
              VALUES (NEW.user_id, NEW.metrics_date, NEW.version, TG_OP, current_setting('application_name'));
              RETURN NULL;
            END $$;
            CREATE TRIGGER fault_audit AFTER INSERT OR UPDATE ON profile_metrics
              FOR EACH ROW EXECUTE FUNCTION fault_audit();
            """)
        guard try await self.value("SELECT to_regclass('work_chunks') IS NOT NULL") == "t" else { return }
        try await self.execute(
            """
            CREATE TABLE fault_chunk_log (
              chunk_id BIGINT NOT NULL, old_owner TEXT, new_owner TEXT, old_state TEXT, new_state TEXT,
              old_lease_until TIMESTAMPTZ, new_lease_until TIMESTAMPTZ, old_cursor BIGINT, new_cursor BIGINT,
              statement_now TIMESTAMPTZ NOT NULL, app TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
            CREATE FUNCTION fault_chunk_log() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO fault_chunk_log (chunk_id, old_owner, new_owner, old_state, new_state, old_lease_until,
                                           new_lease_until, old_cursor, new_cursor, statement_now, app)
              VALUES (NEW.id, OLD.lease_owner, NEW.lease_owner, OLD.state, NEW.state, OLD.lease_until,
                      NEW.lease_until, OLD.cursor_user_id, NEW.cursor_user_id, now(), current_setting('application_name'));
              RETURN NULL;
            END $$;
            CREATE TRIGGER fault_chunk_log AFTER UPDATE ON work_chunks
              FOR EACH ROW EXECUTE FUNCTION fault_chunk_log();
            """)
    }
}

/// The closing check of every fault-injection scenario, the same for all of them.
///
/// What rows *should* exist is read from the work the daemons were given: every daily unit that is not superseded
/// (pending, running or done; a unit that exists must be finished, so its missing rows count as lost) means "every
/// user of the zone has a row for (unit date, version)"; every recompute job that is not cancelled or failed means
/// "every user has a row for the job's version on their local date" (the date when the job was created or when it
/// finished, in case a zone passed midnight meanwhile). Whether a user is valid for that date is decided by the
/// pure core (`MetricsFormula.evaluate` on the settings exactly as stored, the daemon's own input), never by SQL.
///
/// - lost: a valid user without the row;
/// - duplicated: more than one row for one (user, date, version), plus every (user, date, version) *written* more
///   than once (the `fault_audit` trigger, when installed: a resumed chunk must not rewrite committed rows);
/// - wrong: a row for an invalid user, or a row whose values are not the pure core's for its date and version;
/// - unexplained: a skipped user without a `metrics_skips` record whose reasons are the pure core's.
package enum Invariant {
    package struct Report: Sendable {
        package let scenario: String
        package let faults: Int
        package var rowsChecked = 0
        package var lost = 0
        package var duplicated = 0
        package var writtenTwice = 0
        package var wrong = 0
        package var unexplained = 0
        package var validUsers = 0
        package var skippedUsers = 0
        package var unitsUnfinished = 0
        /// The pure core's reasons for every user skipped for some expected row.
        package var expectedSkips: [Int64: [SkipReason]] = [:]
        /// The first few problems, for the failure message.
        package var examples: [String] = []

        /// `scenario: faults injected N, rows checked M, lost L, duplicated D`.
        package var line: String {
            "\(self.scenario): faults injected \(self.faults), rows checked \(self.rowsChecked), lost \(self.lost), duplicated \(self.duplicated)"
        }

        package var details: String {
            "\(self.scenario): \(self.validUsers) valid and \(self.skippedUsers) skipped users, wrong rows \(self.wrong), skips without their reason \(self.unexplained), keys written twice \(self.writtenTwice), unfinished units \(self.unitsUnfinished)"
        }

        package mutating func note(_ problem: String) {
            if self.examples.count < 8 { self.examples.append(problem) }
        }

        /// The test's assertions: nothing lost, nothing duplicated, nothing wrong, every skip explained.
        package func assertHolds(sourceLocation: SourceLocation = #_sourceLocation) {
            let context = "\(self.details)\n\(self.examples.joined(separator: "\n"))"
            #expect(self.rowsChecked > 0, "nothing was checked", sourceLocation: sourceLocation)
            #expect(self.lost == 0, "\(context)", sourceLocation: sourceLocation)
            #expect(self.duplicated == 0, "\(context)", sourceLocation: sourceLocation)
            #expect(self.wrong == 0, "\(context)", sourceLocation: sourceLocation)
            #expect(self.unexplained == 0, "\(context)", sourceLocation: sourceLocation)
        }
    }

    private struct User {
        package let id: Int64
        package let timezone: String
        package let known: Bool
        package let settings: RawSettings
    }

    private struct Expectation {
        package let version: Int
        /// Usually one date; two when a recompute job spanned a local midnight.
        package let dates: [LocalDate]
        package let source: String
    }

    private struct Row {
        package let date: LocalDate
        package let version: Int
        package let bmi: String
        package let bmr: Int64
        package let tdee: Int64
    }

    /// Runs the check, prints the scenario's one-line figure, and returns the report (call `assertHolds()`).
    ///
    /// - Parameter dailyVersion: when set, every time zone that has users must have a daily unit of this formula
    ///   version (a zone without one counts its valid users as lost).
    package static func check(
        _ database: FaultDatabase, scenario: String, faults: Int, dailyVersion: Int? = nil
    ) async throws -> Report {
        let report = try await database.withConnection { connection in
            try Self.check(on: connection, scenario: scenario, faults: faults, dailyVersion: dailyVersion)
        }
        print(report.line)
        print(report.details)
        for example in report.examples { print("  \(example)") }
        return report
    }

    private static func check(
        on connection: PostgresConnection, scenario: String, faults: Int, dailyVersion: Int?
    ) throws -> Report {
        var report = Report(scenario: scenario, faults: faults)

        // The users and their settings exactly as stored (the daemon's input), and whether PostgreSQL knows the zone.
        let userResult = try connection.query(
            """
            WITH known AS MATERIALIZED (SELECT DISTINCT name FROM pg_timezone_names)
            SELECT u.id, u.timezone, k.name IS NOT NULL, s.user_id IS NOT NULL, coalesce(s.onboarding_completed, false),
                   s.date_of_birth::text, s.gender, s.current_weight::text, s.height::text, s.activity_level
            FROM users u LEFT JOIN user_settings s ON s.user_id = u.id LEFT JOIN known k ON k.name = u.timezone
            ORDER BY u.id
            """)
        var users: [User] = []
        users.reserveCapacity(userResult.rowCount)
        for row in 0..<userResult.rowCount {
            users.append(
                User(
                    id: try userResult.int(row, 0), timezone: try userResult.requiredString(row, 1),
                    known: try userResult.bool(row, 2),
                    settings: RawSettings(
                        exists: try userResult.bool(row, 3), onboardingCompleted: try userResult.bool(row, 4),
                        dateOfBirth: userResult.string(row, 5), gender: userResult.string(row, 6),
                        weightKilograms: userResult.string(row, 7), heightCentimetres: userResult.string(row, 8),
                        activityLevel: userResult.string(row, 9))))
        }
        let usersByID = Dictionary(uniqueKeysWithValues: users.map { ($0.id, $0) })

        // What should exist, per zone: daily units (not superseded; a unit without chunks had no users) …
        var expectations: [String: [Expectation]] = [:]
        let units = try connection.query(
            """
            SELECT d.timezone, d.local_date::text, d.version, d.state FROM daily_units d
            WHERE d.state <> 'superseded'
              AND EXISTS (SELECT 1 FROM work_chunks c WHERE c.kind = 'daily' AND c.timezone = d.timezone
                            AND c.local_date = d.local_date AND c.version = d.version)
            """)
        for row in 0..<units.rowCount {
            let zone = try units.requiredString(row, 0)
            guard let date = LocalDate(iso: try units.requiredString(row, 1)) else { continue }
            let version = Int(try units.int(row, 2))
            if try units.requiredString(row, 3) != "done" {
                report.unitsUnfinished += 1
                report.note("daily unit \(zone) \(date) v\(version) is \(try units.requiredString(row, 3))")
            }
            expectations[zone, default: []].append(
                Expectation(version: version, dates: [date], source: "daily \(zone) \(date)"))
        }
        // … and recompute jobs (every user; their local date when the job was created or finished).
        let jobs = try connection.query(
            """
            WITH known AS MATERIALIZED (SELECT DISTINCT name FROM pg_timezone_names),
            zones AS (SELECT DISTINCT u.timezone, k.name IS NOT NULL AS known
                      FROM users u LEFT JOIN known k ON k.name = u.timezone)
            SELECT j.id, j.version, j.state, z.timezone,
                   (j.created_at AT TIME ZONE CASE WHEN z.known THEN z.timezone ELSE 'UTC' END)::date::text,
                   (coalesce(j.finished_at, now()) AT TIME ZONE CASE WHEN z.known THEN z.timezone ELSE 'UTC' END)::date::text
            FROM recompute_jobs j CROSS JOIN zones z
            WHERE j.state IN ('pending', 'running', 'done')
            """)
        for row in 0..<jobs.rowCount {
            let zone = try jobs.requiredString(row, 3)
            guard let first = LocalDate(iso: try jobs.requiredString(row, 4)),
                let last = LocalDate(iso: try jobs.requiredString(row, 5))
            else { continue }
            if try jobs.requiredString(row, 2) != "done" {
                report.note("recompute job \(try jobs.int(row, 0)) is \(try jobs.requiredString(row, 2))")
                report.unitsUnfinished += 1
            }
            expectations[zone, default: []].append(
                Expectation(
                    version: Int(try jobs.int(row, 1)), dates: first == last ? [first] : [first, last],
                    source: "recompute job \(try jobs.int(row, 0))"))
        }
        // A zone with users but no daily unit at all (when one was due).
        if let dailyVersion {
            let missing = try connection.query(
                """
                WITH known AS MATERIALIZED (SELECT DISTINCT name FROM pg_timezone_names)
                SELECT z.timezone,
                       (now() AT TIME ZONE CASE WHEN k.name IS NOT NULL THEN z.timezone ELSE 'UTC' END)::date::text
                FROM (SELECT DISTINCT timezone FROM users) z LEFT JOIN known k ON k.name = z.timezone
                WHERE NOT EXISTS (SELECT 1 FROM daily_units d WHERE d.timezone = z.timezone AND d.version = $1
                                    AND d.state <> 'superseded')
                """, [String(dailyVersion)])
            for row in 0..<missing.rowCount {
                let zone = try missing.requiredString(row, 0)
                guard let date = LocalDate(iso: try missing.requiredString(row, 1)) else { continue }
                report.note("zone \(zone) has users but no daily unit of version \(dailyVersion)")
                report.unitsUnfinished += 1
                expectations[zone, default: []].append(
                    Expectation(version: dailyVersion, dates: [date], source: "missing daily unit \(zone)"))
            }
        }

        // What exists.
        var rows: [Int64: [Row]] = [:]
        let rowResult = try connection.query(
            "SELECT user_id, metrics_date::text, version, bmi::text, bmr, tdee FROM profile_metrics")
        for row in 0..<rowResult.rowCount {
            guard let date = LocalDate(iso: try rowResult.requiredString(row, 1)) else { continue }
            rows[try rowResult.int(row, 0), default: []].append(
                Row(
                    date: date, version: Int(try rowResult.int(row, 2)), bmi: try rowResult.requiredString(row, 3),
                    bmr: try rowResult.int(row, 4), tdee: try rowResult.int(row, 5)))
        }
        var skips: [Int64: (codes: String, reasons: String, date: LocalDate?)] = [:]
        let skipResult = try connection.query(
            "SELECT user_id, array_to_string(reason_codes, ','), reasons, metrics_date::text FROM metrics_skips")
        for row in 0..<skipResult.rowCount {
            skips[try skipResult.int(row, 0)] = (
                try skipResult.requiredString(row, 1), try skipResult.requiredString(row, 2),
                skipResult.string(row, 3).flatMap { LocalDate(iso: $0) }
            )
        }
        if try connection.query("SELECT to_regclass('fault_audit') IS NOT NULL").bool(0, 0) {
            report.writtenTwice = Int(
                try connection.query(
                    """
                    SELECT coalesce(sum(n - 1), 0) FROM (
                      SELECT count(*) AS n FROM fault_audit GROUP BY user_id, metrics_date, version) x
                    """
                ).int(0, 0))
            if report.writtenTwice > 0 {
                let examples = try connection.query(
                    """
                    SELECT user_id, metrics_date::text, version, string_agg(op || ' by ' || app || ' at ' || at::text, '; ')
                    FROM fault_audit GROUP BY user_id, metrics_date, version HAVING count(*) > 1 LIMIT 3
                    """)
                for row in 0..<examples.rowCount {
                    report.note(
                        "user \(try examples.int(row, 0)) \(try examples.requiredString(row, 1)) v\(try examples.int(row, 2)) written twice: \(examples.string(row, 3) ?? "")"
                    )
                }
            }
        }
        report.duplicated += report.writtenTwice

        // The pure core's verdict, cached per (user, date, version).
        var verdicts: [String: MetricsFormula.Outcome] = [:]
        func outcome(_ user: User, _ date: LocalDate, _ version: Int) -> MetricsFormula.Outcome {
            let key = "\(user.id)|\(date)|\(version)"
            if let cached = verdicts[key] { return cached }
            let computed = MetricsFormula.rehearsal(version: version).evaluate(
                user.settings, on: date, timezoneKnown: user.known, timezone: user.timezone)
            verdicts[key] = computed
            return computed
        }

        // Every expected (user, date, version): exactly one row for a valid user, none and a reason for an invalid one.
        var skippedIDs: Set<Int64> = []
        var validIDs: Set<Int64> = []
        for user in users {
            let userRows = rows[user.id] ?? []
            for expectation in expectations[user.timezone] ?? [] {
                report.rowsChecked += 1
                var validDates: [LocalDate] = []
                var invalidReasons: [SkipReason]?
                for date in expectation.dates {
                    switch outcome(user, date, expectation.version) {
                    case .computed: validDates.append(date)
                    case .skipped(let reasons): invalidReasons = invalidReasons ?? reasons
                    }
                }
                let matching = userRows.filter {
                    $0.version == expectation.version && expectation.dates.contains($0.date)
                }
                if !validDates.isEmpty {
                    validIDs.insert(user.id)
                    let onValid = matching.filter { validDates.contains($0.date) }
                    if onValid.isEmpty {
                        report.lost += 1
                        report.note(
                            "lost: user \(user.id) (\(user.timezone)) has no row for \(expectation.source) v\(expectation.version)"
                        )
                    } else if Set(onValid.map(\.date)).count > 1 {
                        // One job, one row per user: rows on both sides of a midnight are one too many.
                        // (Rows sharing a key are counted below, once per key.)
                        report.duplicated += Set(onValid.map(\.date)).count - 1
                        report.note(
                            "duplicated: user \(user.id) has rows on \(Set(onValid.map(\.date)).count) dates for \(expectation.source)"
                        )
                    }
                } else if let reasons = invalidReasons {
                    skippedIDs.insert(user.id)
                    report.expectedSkips[user.id] = reasons
                    guard let skip = skips[user.id] else {
                        report.unexplained += 1
                        report.note(
                            "unexplained: user \(user.id) is skipped (\(reasons.map(\.code.rawValue))) but not in metrics_skips"
                        )
                        continue
                    }
                    // The recorded reasons must be the core's for the date they were recorded for.
                    let recordedFor = skip.date ?? expectation.dates[0]
                    guard case .skipped(let expected) = outcome(user, recordedFor, expectation.version),
                        skip.codes == expected.map(\.code.rawValue).joined(separator: ","),
                        skip.reasons == expected.map(\.description).joined(separator: "; ")
                    else {
                        report.unexplained += 1
                        report.note(
                            "unexplained: user \(user.id) skip record '\(skip.codes)' '\(skip.reasons)' is not the core's \(reasons.map(\.code.rawValue))"
                        )
                        continue
                    }
                }
            }
        }
        report.validUsers = validIDs.count
        report.skippedUsers = skippedIDs.count

        // Every row that exists: its user must be valid for its date and version, with exactly the core's values.
        var perKey: [String: Int] = [:]
        for (userID, userRows) in rows {
            for row in userRows {
                perKey["\(userID)|\(row.date)|\(row.version)", default: 0] += 1
                guard let user = usersByID[userID] else {
                    report.wrong += 1
                    report.note("wrong: row for unknown user \(userID)")
                    continue
                }
                switch outcome(user, row.date, row.version) {
                case .skipped(let reasons):
                    report.wrong += 1
                    report.note(
                        "wrong: user \(userID) has a row for \(row.date) v\(row.version) but is invalid: \(reasons.map(\.description))"
                    )
                case .computed(let metrics):
                    let bmi = FixedPoint(parsing: row.bmi, scale: 1)?.units
                    if bmi != metrics.bmiTenths || row.bmr != metrics.bmr || row.tdee != metrics.tdee {
                        report.wrong += 1
                        report.note(
                            "wrong: user \(userID) \(row.date) v\(row.version) has \(row.bmi)/\(row.bmr)/\(row.tdee), the core says \(metrics.bmi)/\(metrics.bmr)/\(metrics.tdee)"
                        )
                    }
                }
            }
        }
        let sameKey = perKey.values.reduce(0) { $0 + max(0, $1 - 1) }
        if sameKey > 0 { report.note("duplicated: \(sameKey) extra rows share a (user, date, version)") }
        report.duplicated += sameKey
        return report
    }
}
