import Glibc
import MetricsdConfiguration
import MetricsdPostgres
import MetricsdReads

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

extension ConfigCheck {
    /// Each read server of `METRICSD_READ_DATABASE_URL` (nothing when unset): reachable on its own, a standby (or the
    /// primary itself) that follows DATABASE_URL's primary, whose schema is this build's, and how long it takes to
    /// replay the primary's present WAL position — the staleness the daemon bounds with
    /// `METRICSD_READ_MAX_LAG_SECONDS`. A server that cannot be reached, follows another primary or has another
    /// schema is a problem; one that lags is a note (the daemon reads from it once it catches up).
    mutating func checkReadServers(_ database: DatabaseSettings, environment: [String: String]) async {
        guard database.readURL != nil else { return }
        let servers: [ConnectionSettings.ReadServer]
        let primary: ConnectionSettings?
        do {
            servers = try database.readServers(environment: environment)
            primary = try? database.primary(environment: environment)
        } catch {
            if !self.problems.contains(where: { $0.setting == "METRICSD_READ_DATABASE_URL" }) {
                self.problem("METRICSD_READ_DATABASE_URL", .readDatabaseURLInvalid, error.message)
            }
            return
        }
        let maxLag = database.readMaxLag.seconds
        // libpq blocks: as in checkDatabase, the probes run in a detached task, off the cooperative pool's threads, and
        // are awaited here at once (their results are the check's), so nothing outlives this function.
        let results = await Task.detached { servers.map { Self.probe($0, primary: primary, maxLag: maxLag) } }.value
        for (server, result) in zip(servers, results) {
            switch result {
            case .success(let text): self.note("read server", "\(server.label): \(text)")
            case .failure(let error):
                self.problem("METRICSD_READ_DATABASE_URL", error.errorCode, "\(server.label): \(error.message)")
            }
        }
    }

    /// One read server: its role and schema, and the seconds it took to replay what the primary had written when
    /// asked (more than `maxLag`: it would not be read from now).
    private static func probe(_ server: ConnectionSettings.ReadServer, primary: ConnectionSettings?, maxLag: Double)
        -> Result<String, PostgresError>
    {
        do {
            let connection = try PostgresConnection(settings: server.settings)
            let standby = try connection.query("SELECT pg_is_in_recovery()").bool(0, 0)
            let status = try Migrator().status(on: connection)
            guard status.isCurrent else {
                return .failure(
                    PostgresError(
                        code: .unexpectedResult,
                        message: "its schema is not this build's: \(PostgresStore.describe(status))"))
            }
            let text = standby ? "standby" : "a primary (not in recovery)"
            guard let primary, let source = try? PostgresConnection(settings: primary) else {
                return .success(text + ", schema current; lag not measured (DATABASE_URL not reachable)")
            }
            if let mismatch = try ReadReplicas.mismatch(
                of: connection, primary: source, standbysOnly: server.standbysOnly)
            {
                return .failure(PostgresError(code: .unexpectedResult, message: "not read from: \(mismatch)"))
            }
            let asked = ContinuousClock.now
            let target = try source.query("SELECT (pg_current_wal_insert_lsn() - '0/0')::text").requiredString(0, 0)
            func caughtUp() throws -> Bool {
                try connection.prepared(
                    "replayed_past",
                    """
                    SELECT coalesce((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                          ELSE pg_current_wal_insert_lsn() END - '0/0') >= $1::numeric, false)
                    """, [target]
                ).bool(0, 0)
            }
            while try !caughtUp() {
                if Self.seconds(ContinuousClock.now - asked) > maxLag {
                    return .success(
                        text
                            + ", schema current; more than \(Setting.format(maxLag)) s behind the primary (METRICSD_READ_MAX_LAG_SECONDS): not read from until it catches up"
                    )
                }
                usleep(100_000)
            }
            let seconds = Self.seconds(ContinuousClock.now - asked)
            return .success(
                text
                    + ", schema current; replayed the primary's present position within \((seconds * 100).rounded() / 100) s"
            )
        } catch let error as PostgresError {
            return .failure(PostgresError(code: error.code, message: "cannot use it: \(Self.oneLine(error.message))"))
        } catch {
            return .failure(
                PostgresError(code: .unexpectedResult, message: "cannot use it: \(Self.oneLine("\(error)"))"))
        }
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
