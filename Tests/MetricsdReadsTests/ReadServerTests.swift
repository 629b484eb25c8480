import MetricsdMasking
import Testing

@testable import MetricsdPostgres
@testable import MetricsdReads

/// `METRICSD_READ_DATABASE_URL` taken apart into one server per host, and the replay-lag arithmetic (``WALHistory``)
/// on instants the test chooses.
@Suite struct ReadServerTests {
    static func servers(_ conninfo: String) throws -> [ConnectionSettings.ReadServer] {
        try ConnectionSettings(conninfo: conninfo, environment: [:], setting: "METRICSD_READ_DATABASE_URL")
            .readServers()
    }

    @Test func aMultiHostURLBecomesOneServerPerHost() throws {
        let servers = try Self.servers(
            "postgresql://metricsd@db2:5433,db3/metricsd?sslmode=verify-full&target_session_attrs=standby&connect_timeout=2"
        )
        #expect(servers.map(\.label) == ["db2:5433", "db3:5432"])
        #expect(servers.allSatisfy { $0.settings.acceptsReadOnly })
        #expect(servers.allSatisfy { $0.settings.setting == "METRICSD_READ_DATABASE_URL" })
        let first = servers[0].settings.conninfo
        for part in [
            "host='db2'", "port='5433'", "dbname='metricsd'", "user='metricsd'", "sslmode='verify-full'",
            "connect_timeout='2'",
        ] {
            #expect(first.contains(part), "\(first)")
        }
        // libpq would check target_session_attrs=standby only when connecting: metricsd checks the role at every
        // probe instead, and does not pass it on.
        #expect(!first.contains("target_session_attrs"), "\(first)")
        #expect(servers.allSatisfy { $0.standbysOnly })
        #expect(servers.allSatisfy { $0.settings.connectTimeoutSeconds == 2 })
        #expect(servers[1].settings.conninfo.contains("host='db3'") && !servers[1].settings.conninfo.contains("port="))
        // Each server's string is one libpq accepts, naming that host alone.
        #expect(try servers[1].settings.readServers().map(\.label) == ["db3:5432"])
    }

    @Test func whichTargetSessionAttributesAskForStandbysOnly() throws {
        for (value, standbysOnly) in [
            ("standby", true), ("prefer-standby", true), ("any", false), ("read-only", false),
        ] {
            let servers = try Self.servers("host=a,b dbname=m target_session_attrs=\(value)")
            #expect(servers.allSatisfy { $0.standbysOnly == standbysOnly }, "\(value)")
            #expect(
                servers.allSatisfy { $0.settings.conninfo.contains("target_session_attrs") != standbysOnly }, "\(value)"
            )
        }
        #expect(
            try Self.servers("host=a dbname=m").allSatisfy {
                !$0.standbysOnly && $0.settings.connectTimeoutSeconds == 5
            })
        // libpq waits at least 2 s per host, and 0 means no limit.
        #expect(try Self.servers("host=a dbname=m connect_timeout=1").first?.settings.connectTimeoutSeconds == 2)
        #expect(try Self.servers("host=a dbname=m connect_timeout=0").first?.settings.connectTimeoutSeconds == nil)
    }

    // MARK: Following the primary

    static let primary = ReadReplicas.Identity(systemIdentifier: "7301", timeline: 2, startedAt: "1767225600.123456")

    @Test func aStandbyFollowsThePrimaryOnItsSystemAndTimeline() {
        let standby = ReadReplicas.Identity(systemIdentifier: "7301", timeline: 2, startedAt: "1767225000.5")
        #expect(
            ReadReplicas.mismatch(observed: standby, inRecovery: true, standbysOnly: true, primary: Self.primary) == nil
        )
        let other = ReadReplicas.Identity(systemIdentifier: "9999", timeline: 2, startedAt: "1767225000.5")
        #expect(
            ReadReplicas.mismatch(observed: other, inRecovery: true, standbysOnly: false, primary: Self.primary)?
                .problem == .otherCluster)
        let behind = ReadReplicas.Identity(systemIdentifier: "7301", timeline: 1, startedAt: "1767225000.5")
        let mismatch = ReadReplicas.mismatch(
            observed: behind, inRecovery: true, standbysOnly: false, primary: Self.primary)
        #expect(mismatch?.problem == .otherTimeline)
        #expect(
            mismatch?.detail == "a standby on timeline 1, the primary on timeline 2: it does not follow the primary")
        // The primary not known yet: nothing to compare with (and no server can be shown fresh either).
        #expect(ReadReplicas.mismatch(observed: other, inRecovery: true, standbysOnly: false, primary: nil) == nil)
    }

    @Test func aServerNotInRecoveryIsReadFromOnlyWhenItIsThePrimaryItself() {
        #expect(
            ReadReplicas.mismatch(observed: Self.primary, inRecovery: false, standbysOnly: false, primary: Self.primary)
                == nil)
        #expect(
            ReadReplicas.mismatch(observed: Self.primary, inRecovery: false, standbysOnly: true, primary: Self.primary)?
                .problem
                == .primaryNotWanted)
        // Promoted apart from the primary onto the same timeline: only its start time tells it from the primary.
        let twin = ReadReplicas.Identity(systemIdentifier: "7301", timeline: 2, startedAt: "1767225000.5")
        #expect(
            ReadReplicas.mismatch(observed: twin, inRecovery: false, standbysOnly: false, primary: Self.primary)?
                .problem == .otherPrimary)
        let old = ReadReplicas.Identity(systemIdentifier: "7301", timeline: 1, startedAt: "1767225600.123456")
        #expect(
            ReadReplicas.mismatch(observed: old, inRecovery: false, standbysOnly: true, primary: Self.primary)?.problem
                == .otherPrimary)
    }

    @Test func oneHostOnePortAndKeywordStrings() throws {
        #expect(
            try Self.servers("host=/var/run/postgresql dbname=metricsd").map(\.label) == ["/var/run/postgresql:5432"])
        #expect(
            try Self.servers("hostaddr=10.0.0.2,10.0.0.3 port=6432 dbname=m").map(\.label) == [
                "10.0.0.2:6432", "10.0.0.3:6432",
            ])
        #expect(try Self.servers("dbname=metricsd").map(\.label) == ["default host:5432"])
    }

    @Test func valuesAreQuotedBackExactly() throws {
        let servers = try Self.servers(#"host=a,b dbname='my db' password='it\'s a \\ secret'"#)
        #expect(servers.count == 2)
        #expect(
            servers[0].settings.conninfo.contains(#"password='it\'s a \\ secret'"#), "\(servers[0].settings.conninfo)")
        #expect(servers[0].settings.conninfo.contains("dbname='my db'"))
        // The password is masked in every error the server's connection makes.
        #expect(servers[0].settings.mask.apply("password it's a \\ secret") == "password ***")
    }

    @Test func listsOfTheWrongLengthAreNamed() {
        let error = #expect(throws: PostgresError.self) { try Self.servers("host=a,b,c port=1,2 dbname=m") }
        #expect(error?.message == "METRICSD_READ_DATABASE_URL is not valid: 2 values of port for 3 hosts")
        let malformed = #expect(throws: PostgresError.self) { try Self.servers("postgresql://u:Pw%zzLeak@db2/m") }
        #expect(malformed?.code == .badConnectionString)
        #expect(malformed?.message.hasPrefix("METRICSD_READ_DATABASE_URL is not valid: ") == true)
        #expect(malformed?.message.contains("zzLeak") == false, "\(malformed?.message ?? "")")
    }

    // MARK: Replay lag

    @Test func anIdlePrimaryLeavesAStandbyThatKeptUpFresh() {
        let start = ContinuousClock.now
        var history = WALHistory(horizon: .seconds(12))
        for second in 0..<10 { history.record(at: start + .seconds(second), position: 5000) }
        // Nothing was written for ten seconds: the standby at 5000 lacks nothing as of the newest sample.
        #expect(history.freshness(replayed: 5000) == start + .seconds(9))
        #expect(history.freshness(replayed: 4999) == nil, "behind every sample kept")
    }

    @Test func aStandbyThatStopsReplayingGrowsStale() {
        let start = ContinuousClock.now
        var history = WALHistory(horizon: .seconds(12))
        for second in 0..<10 { history.record(at: start + .seconds(second), position: UInt64(1000 + 100 * second)) }
        // Replayed up to the position the primary had at second 4 (and a little past it).
        #expect(history.freshness(replayed: 1450) == start + .seconds(4))
        #expect(history.freshness(replayed: 1400) == start + .seconds(4))
        #expect(history.freshness(replayed: 1399) == start + .seconds(3))
        // Samples older than the horizon go: a standby behind all of them is staler than the horizon.
        for second in 10..<17 { history.record(at: start + .seconds(second), position: UInt64(1000 + 100 * second)) }
        #expect(history.samples.first.map { $0.at >= start + .seconds(4) } == true)
        #expect(history.freshness(replayed: 1350) == nil)
    }

    @Test func aNewPrimaryBelowTheOldOnesPositionsCounts() {
        let start = ContinuousClock.now
        var history = WALHistory(horizon: .seconds(30))
        history.record(at: start, position: 9000)
        history.record(at: start + .seconds(1), position: 9500)  // the old primary's last writes, lost in a failover
        history.record(at: start + .seconds(2), position: 9200)  // the promoted standby
        #expect(history.freshness(replayed: 9200) == start + .seconds(2))
    }
}
