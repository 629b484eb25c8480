import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import MetricsdPostgres
import MetricsdSystemd
import MetricsdTestSupport
import NIOPosix
import NotifyTestSupport
import Synchronization
import Testing

/// The test acts as systemd's service manager: it binds the notify socket (abstract `@name` or a socket file),
/// runs the real `metricsd serve` with `NOTIFY_SOCKET` (and `WATCHDOG_USEC` …) and checks what arrives, with the
/// kernel's `SO_PASSCRED` pid of every sender (the manager side of the notify protocol, as systemd implements it).
@Suite struct SystemdProtocolTests {
    // MARK: The whole life

    /// READY → WATCHDOG pings → RELOADING+MONOTONIC_USEC → READY → STOPPING → exit 0; every datagram from the
    /// daemon's own pid, never `MAINPID=`, never a second READY without a reload.
    @Test(arguments: [true, false])
    func wholeLifeComesFromTheMainPid(abstractSocket: Bool) async throws {
        try await withTestDatabase { database in
            let manager = try NotifyRecorder(abstract: abstractSocket)
            defer { manager.stop() }
            #expect(manager.address.hasPrefix("@") == abstractSocket)
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: ["NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "2000000"]),
                port: port)
            let ready = try await Self.ready(manager, daemon)
            #expect(ready.value("STATUS")?.hasPrefix("serving on 127.0.0.1:\(port)") == true)
            let pinged = await manager.first(from: manager.count, timeout: .seconds(5)) { $0.has("WATCHDOG=1") }
            #expect(pinged != nil, "no watchdog ping after READY")

            daemon.signal(SIGHUP)
            let reloading = try #require(
                await manager.first(timeout: .seconds(10)) { $0.has("RELOADING=1") },
                "no RELOADING=1: \(manager.transcript)")
            let reloaded = await manager.first(timeout: .seconds(10)) {
                $0.has("READY=1") && $0.receivedAt > reloading.receivedAt
            }
            #expect(reloaded != nil, "no READY=1 after the reload: \(manager.transcript)")

            daemon.signal(SIGTERM)
            let status = await daemon.waitForExit(timeout: .seconds(30))
            #expect(
                status == 0 && daemon.process.terminationReason == .exit,
                "exit \(String(describing: status)):\n\(daemon.log)")
            try await Task.sleep(for: .milliseconds(200))  // the last datagrams
            let datagrams = manager.datagrams
            #expect(
                datagrams.allSatisfy { $0.pid == daemon.pid },
                "a datagram not from pid \(daemon.pid): \(manager.transcript)")
            #expect(
                !datagrams.contains { $0.lines.contains { $0.hasPrefix("MAINPID=") } },
                "MAINPID sent: \(manager.transcript)")
            let kinds = datagrams.compactMap { datagram -> String? in
                for key in ["READY=1", "RELOADING=1", "STOPPING=1"] where datagram.has(key) { return key }
                return nil
            }
            #expect(kinds == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"], "\(manager.transcript)")
        }
    }

    // MARK: Readiness

    /// Database down at start: `STATUS=waiting for database: <why>`, one log line for the unchanged reason, no
    /// listener and no READY. Once the database is up: READY, and at the moment it arrives a TCP connect works.
    @Test func readyOnlyOnceTheDatabaseIsUpAndTheListenerIsBound() async throws {
        try await withThrowawayCluster("dbdown") { cluster in
            let port = DaemonProcess.freePort()
            let connectedAtReady = Mutex<Bool?>(nil)
            let manager = try NotifyRecorder(abstract: true) { datagram in
                if datagram.has("READY=1") {
                    let connected = RawHTTP.canConnect(port: port)
                    connectedAtReady.withLock { if $0 == nil { $0 = connected } }
                }
            }
            defer { manager.stop() }
            let daemon = try DaemonProcess(
                arguments: ["serve", "--migrate"],
                environment: DaemonProcess.environment(
                    databaseURL: cluster.url, port: port, extra: ["NOTIFY_SOCKET": manager.address]),
                port: port)

            let waiting = try #require(
                await manager.first(timeout: .seconds(20)) {
                    $0.value("STATUS")?.hasPrefix("waiting for database: ") == true
                },
                "no 'waiting for database' status: \(manager.transcript)\n\(daemon.log)")
            let reason = waiting.value("STATUS") ?? ""
            #expect(reason.contains("port \(cluster.port)") && reason.contains("Connection refused"), "\(reason)")
            // While it waits (at least two more retries): no READY, nothing listening, /readyz unreachable.
            try await Task.sleep(for: .milliseconds(800))
            #expect(!manager.datagrams.contains { $0.has("READY=1") })
            #expect(!RawHTTP.canConnect(port: port), "the port is open before the database is reachable")
            await #expect(throws: (any Error).self) { try await daemon.request("/readyz") }
            #expect(daemon.log.components(separatedBy: "Waiting for database").count - 1 == 1, "\(daemon.log)")

            try await cluster.start()
            let ready = try await Self.ready(manager, daemon, timeout: .seconds(30))
            #expect(connectedAtReady.withLock { $0 } == true, "READY=1 arrived before the port accepted connections")
            #expect(ready.value("STATUS")?.hasPrefix("serving on 127.0.0.1:\(port)") == true, "\(ready)")
            #expect(try await daemon.request("/readyz").status.code == 200)
            #expect(await DaemonProcess.eventually(timeout: .seconds(5)) { daemon.log.contains("Database reachable") })
            #expect(manager.datagrams.filter { $0.has("READY=1") }.count == 1)

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
        }
    }

    /// `--migrate` on an empty database: `EXTEND_TIMEOUT_USEC=` before each of the migrations and again between the
    /// last one and READY, each with a useful extension.
    @Test func migrateExtendsTheStartTimeoutBeforeEachStepAndBeforeReady() async throws {
        try await withEmptyDatabase { url in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                arguments: ["serve", "--migrate"],
                environment: DaemonProcess.environment(
                    databaseURL: url, port: port, extra: ["NOTIFY_SOCKET": manager.address]),
                port: port)
            _ = try await Self.ready(manager, daemon)
            let datagrams = manager.datagrams
            let total = Migration.all.count
            #expect(total >= 2, "several migrations, so several steps")
            var previous = 0
            for step in 1...total {
                let index = try #require(
                    datagrams.firstIndex { $0.value("STATUS")?.hasPrefix("migrating \(step)/\(total): ") == true },
                    "no status for migration \(step): \(manager.transcript)")
                let extensions = datagrams[previous..<index].compactMap {
                    $0.value("EXTEND_TIMEOUT_USEC").flatMap { UInt64($0) }
                }
                #expect(
                    extensions.contains { $0 >= 10_000_000 },
                    "no EXTEND_TIMEOUT_USEC before step \(step): \(manager.transcript)")
                previous = index + 1
            }
            let readyIndex = try #require(datagrams.firstIndex { $0.has("READY=1") })
            #expect(previous <= readyIndex)
            let beforeReady = datagrams[previous..<readyIndex].compactMap {
                $0.value("EXTEND_TIMEOUT_USEC").flatMap { UInt64($0) }
            }
            #expect(
                !beforeReady.isEmpty,
                "no EXTEND_TIMEOUT_USEC after the last migration, before READY: \(manager.transcript)")
            #expect(datagrams.allSatisfy { $0.pid == daemon.pid })
            #expect(try await daemon.request("/readyz").status.code == 200)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// Without `--migrate` an empty database is fatal: one `Error: … schema is behind …` line, `STATUS=`+`ERRNO=`,
    /// exit 1, no READY.
    @Test func schemaBehindWithoutMigrateIsFatal() async throws {
        try await withEmptyDatabase { url in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: url, port: port, extra: ["NOTIFY_SOCKET": manager.address]),
                port: port)
            #expect(await daemon.waitForExit(timeout: .seconds(20)) == 1, "\(daemon.log)")
            #expect(daemon.process.terminationReason == .exit)
            let lines = daemon.log.split(separator: "\n")
            #expect(lines.count == 1 && lines.first?.hasPrefix("Error: schema is behind: ") == true, "\(daemon.log)")
            #expect(lines.first?.hasSuffix(" [schema.behind]") == true, "\(daemon.log)")
            Self.expectNoCrashReport(daemon.log)
            let fatal = await manager.first(timeout: .seconds(2)) { $0.value("ERRNO") != nil }
            #expect(fatal?.value("STATUS")?.contains("schema is behind") == true, "\(manager.transcript)")
            #expect(fatal?.value("ERRNO") == String(EINVAL))
            #expect(!manager.datagrams.contains { $0.has("READY=1") })
        }
    }

    // MARK: Watchdog

    /// `WATCHDOG_USEC=2000000`: a ping about every second (half the interval), never a gap near the timeout.
    @Test func watchdogPingsAtHalfTheInterval() async throws {
        try await withTestDatabase { database in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: ["NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "2000000"]),
                port: port)
            _ = try await Self.ready(manager, daemon)
            let start = manager.count
            try await Task.sleep(for: .seconds(5))
            let pings = manager.datagrams(from: start).filter { $0.has("WATCHDOG=1") }
            #expect((3...7).contains(pings.count), "\(pings.count) pings in 5 s: \(manager.transcript)")
            let gaps = zip(pings.dropFirst(), pings).map { Double($0.receivedAt - $1.receivedAt) / 1_000_000 }
            #expect(gaps.allSatisfy { $0 < 1.9 }, "gaps between pings: \(gaps)")
            #expect(pings.allSatisfy { $0.pid == daemon.pid })
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// A stalled scheduler loop (`METRICSD_FAULTS=stall-scheduler-after=3`) stops the pings: "Not alive" is logged
    /// and nothing follows for 4 s (systemd would kill the service after 2 s).
    @Test func watchdogPingsStopWhenTheSchedulerStalls() async throws {
        try await withTestDatabase { database in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "2000000",
                        "METRICSD_FAULTS": "stall-scheduler-after=3", "METRICSD_TICK_SECONDS": "0.5",
                        "METRICSD_SHUTDOWN_SECONDS": "2",  // the stalled loop only ends when cancelled
                    ]),
                port: port)
            _ = try await Self.ready(manager, daemon)
            let stalled = await DaemonProcess.eventually(timeout: .seconds(10)) {
                daemon.log.contains("scheduler loop stalled")
            }
            #expect(stalled, "\(daemon.log)")
            #expect(manager.datagrams.contains { $0.has("WATCHDOG=1") }, "no ping before the stall")
            let notAlive = await DaemonProcess.eventually(timeout: .seconds(10)) { daemon.log.contains("Not alive") }
            try #require(notAlive, "no 'Not alive' log line: \(daemon.log)")
            try await Task.sleep(for: .milliseconds(300))  // a ping sent just before the log line
            let after = manager.count
            try await Task.sleep(for: .seconds(4))
            let late = manager.datagrams(from: after).filter { $0.has("WATCHDOG=1") }
            #expect(late.isEmpty, "pings after 'Not alive': \(manager.transcript)")
            let lastPing = try #require(manager.datagrams.last { $0.has("WATCHDOG=1") })
            #expect(SystemdNotifier.monotonicMicroseconds() - lastPing.receivedAt >= 4_000_000)
            #expect(daemon.process.isRunning)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
        }
    }

    /// No `WATCHDOG_USEC`, or a `WATCHDOG_PID` that is another process: no `WATCHDOG=1` at all.
    @Test(arguments: [[:], ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"]])
    func noWatchdogPingsWhenTheWatchdogIsNotOurs(watchdog: [String: String]) async throws {
        try await withTestDatabase { database in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: watchdog.merging(["NOTIFY_SOCKET": manager.address]) { $1 }),
                port: port)
            _ = try await Self.ready(manager, daemon)
            try await Task.sleep(for: .seconds(4))
            #expect(!manager.datagrams.contains { $0.has("WATCHDOG=1") }, "\(manager.transcript)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// `WATCHDOG_PID` naming the daemon itself does enable the watchdog. The pid is unknown before the spawn, so a
    /// shell sets `WATCHDOG_PID=$$` and `exec`s the daemon, which keeps the shell's pid.
    @Test func watchdogPidOfTheDaemonItselfPings() async throws {
        try await withTestDatabase { database in
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            var environment = DaemonProcess.environment(
                databaseURL: database.url, port: port,
                extra: [
                    "NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "2000000",
                    "METRICSD_BINARY_PATH": try DaemonProcess.binary(),
                ])
            environment["METRICSD_LOG_LEVEL"] = "warning"
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", #"WATCHDOG_PID=$$ exec "$METRICSD_BINARY_PATH" serve"#]
            process.environment = environment
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
            let ready = try #require(
                await manager.first(timeout: .seconds(30)) { $0.has("READY=1") }, "\(manager.transcript)")
            #expect(ready.pid == process.processIdentifier)
            let ping = await manager.first(timeout: .seconds(5)) { $0.has("WATCHDOG=1") }
            #expect(ping?.pid == process.processIdentifier, "\(manager.transcript)")
            kill(process.processIdentifier, SIGTERM)
            let exited = await DaemonProcess.eventually(timeout: .seconds(30)) { !process.isRunning }
            #expect(exited && process.terminationReason == .exit && process.terminationStatus == 0)
        }
    }

    /// A database outage is not a hang: pings continue, STATUS and `/readyz` say what is wrong, and both recover.
    @Test func databaseOutageKeepsPingingAndShowsInStatus() async throws {
        try await withThrowawayCluster("outage") { cluster in
            try await cluster.start()
            let migrated = try await Subprocess.run(
                try DaemonProcess.binary(), ["migrate"], environment: ["DATABASE_URL": cluster.url])
            try #require(migrated.status == 0, "\(migrated.output)")
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: cluster.url, port: port,
                    extra: ["NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "2000000"]),
                port: port)
            _ = try await Self.ready(manager, daemon)

            let down = manager.count  // before the stop: the daemon may notice while pg_ctl is still waiting
            try await cluster.stop()
            let unavailable = await manager.first(from: down, timeout: .seconds(15)) {
                $0.value("STATUS")?.contains("database unavailable") == true
            }
            #expect(unavailable != nil, "no STATUS about the database: \(manager.transcript)")
            #expect(try await daemon.request("/readyz").status.code == 503)
            let before = manager.count
            try await Task.sleep(for: .seconds(3))
            let pings = manager.datagrams(from: before).filter { $0.has("WATCHDOG=1") }
            #expect(pings.count >= 2, "pings stopped during a database outage: \(manager.transcript)")

            let up = manager.count  // before the start: the daemon may recover while pg_ctl is still waiting
            try await cluster.start()
            let recovered = await manager.first(from: up, timeout: .seconds(30)) {
                guard let status = $0.value("STATUS") else { return false }
                return status.hasPrefix("serving on") && !status.contains("database unavailable")
            }
            #expect(recovered != nil, "STATUS did not recover: \(manager.transcript)")
            let readyAgain = await DaemonProcess.eventually(timeout: .seconds(15)) {
                (try? await daemon.request("/readyz").status.code) == 200
            }
            #expect(readyAgain)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
        }
    }

    // MARK: Reload

    /// SIGHUP: the next datagram is `RELOADING=1` with `MONOTONIC_USEC` taken after the signal and before it arrived,
    /// then READY. The reload re-reads the config file (log level) and the admin token file; a broken config file
    /// keeps the previous settings and still answers READY.
    @Test func sighupReloadsLogLevelAndAdminToken() async throws {
        try await withTestDatabase { database in
            let directory = try Self.scratchDirectory("reload")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let configFile = directory + "/metricsd.conf"
            let tokenFile = directory + "/admin-token"
            let (oldToken, newToken) = ("old-admin-token-0123456789", "new-admin-token-9876543210")
            try "METRICSD_LOG_LEVEL=info\n".write(toFile: configFile, atomically: true, encoding: .utf8)
            try oldToken.write(toFile: tokenFile, atomically: true, encoding: .utf8)

            let manager = try NotifyRecorder(abstract: false)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": manager.address, "METRICSD_CONFIG_FILE": configFile,
                        "METRICSD_ADMIN_TOKEN_FILE": tokenFile, "METRICSD_WORKERS": "0",
                    ]),
                port: port)
            _ = try await Self.ready(manager, daemon)
            #expect(try await Self.admin(daemon, token: oldToken) == 200)
            #expect(
                try await daemon.request("/v1/profile/metrics/today", headers: TestTokens.bearer("not-a-jwt")).status
                    .code == 401)
            #expect(try await Self.admin(daemon, token: newToken) == 401)
            // Its notice line comes after where the refused user token's debug line would be.
            #expect(await DaemonProcess.eventually(timeout: .seconds(5)) { daemon.log.contains("Admin token refused") })
            #expect(!daemon.log.contains(" debug metricsd: "), "a debug line at level info:\n\(daemon.log)")

            try "METRICSD_LOG_LEVEL=debug\n".write(toFile: configFile, atomically: true, encoding: .utf8)
            try newToken.write(toFile: tokenFile, atomically: true, encoding: .utf8)
            let mark = manager.count
            let signalled = SystemdNotifier.monotonicMicroseconds()
            daemon.signal(SIGHUP)
            let next = try #require(await manager.first(from: mark, timeout: .seconds(10)) { _ in true })
            #expect(next.has("RELOADING=1"), "\(manager.transcript)")
            let monotonic = try #require(next.value("MONOTONIC_USEC").flatMap { UInt64($0) }, "\(next)")
            #expect(
                signalled <= monotonic && monotonic <= next.receivedAt,
                "MONOTONIC_USEC=\(monotonic) not between \(signalled) and \(next.receivedAt)")
            let ready = await manager.first(from: mark + 1, timeout: .seconds(10)) { $0.has("READY=1") }
            #expect(ready?.value("STATUS")?.hasPrefix("serving on 127.0.0.1:\(port)") == true, "\(manager.transcript)")
            #expect(await DaemonProcess.eventually(timeout: .seconds(5)) { daemon.log.contains("Reloaded") })
            // The accepted algorithms are named, not redacted: a list of algorithms is no secret.
            let reloaded = daemon.log.split(separator: "\n").first { $0.contains(" Reloaded ") }.map(String.init) ?? ""
            #expect(reloaded.contains("metricsd.jwt.algorithms=HS256"), "\(reloaded)")

            #expect(try await Self.admin(daemon, token: newToken) == 200)
            #expect(try await Self.admin(daemon, token: oldToken) == 401)
            #expect(
                try await daemon.request("/v1/profile/metrics/today", headers: TestTokens.bearer("not-a-jwt")).status
                    .code == 401)
            #expect(
                await DaemonProcess.eventually(timeout: .seconds(5)) { daemon.log.contains("Token refused") },
                "no debug line after reload")

            // A broken file: RELOADING, then READY saying so; the previous settings stay.
            try "METRICSD_LOG_LEVEL=loud\n".write(toFile: configFile, atomically: true, encoding: .utf8)
            let brokenMark = manager.count
            daemon.signal(SIGHUP)
            let failed = await manager.first(from: brokenMark, timeout: .seconds(10)) { $0.has("READY=1") }
            #expect(failed?.value("STATUS")?.hasPrefix("reload failed: ") == true, "\(manager.transcript)")
            #expect(manager.datagrams(from: brokenMark).first?.has("RELOADING=1") == true)
            #expect(try await Self.admin(daemon, token: newToken) == 200)
            #expect(daemon.process.isRunning)

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            #expect(manager.datagrams.allSatisfy { $0.pid == daemon.pid })
        }
    }

    // MARK: Stop

    /// SIGTERM while 100 keep-alive requests are in flight (held up by a table lock): STOPPING=1, the daemon waits
    /// for them, every one gets a whole 200 response, new connections are refused, exit 0.
    @Test func sigtermLetsEveryRequestInFlightFinish() async throws {
        try await withTestDatabase { database in
            let users = (1...100).map { SeedUser.valid(Int64($0)) }
            try await database.seed(users)
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": manager.address, "METRICSD_WORKERS": "0", "METRICSD_DB_POOL_SIZE": "8",
                        "METRICSD_READ_BATCHES": "2",
                        "METRICSD_DB_ACQUIRE_TIMEOUT_MS": "30000",
                        "METRICSD_MAX_IN_FLIGHT": "200",  // all 100 (and /metrics) in flight, none refused with a 503
                    ]),
                port: port)
            _ = try await Self.ready(manager, daemon)

            // Hold every latest read (of profile_metrics_latest) until the stop is under way (libpq calls on a
            // blocking thread).
            let settings = try ConnectionSettings(conninfo: database.url, environment: [:])
            let locker = try await TestDatabase.blocking.runIfActive {
                let connection = try PostgresConnection(settings: settings)
                try connection.execute("BEGIN")
                try connection.execute("LOCK TABLE profile_metrics_latest IN ACCESS EXCLUSIVE MODE")
                return connection
            }
            var connections: [Int32] = []
            for user in users {
                let descriptor = try #require(RawHTTP.connect(port: port))
                connections.append(descriptor)
                let request = RawHTTP.get(
                    "/v1/profile/metrics/today", port: port,
                    headers: ["Authorization": "Bearer \(TestTokens.user(user.id))"])
                #expect(RawHTTP.send(descriptor, request))
            }
            let responses = Task { await RawHTTP.readResponses(connections, timeout: .seconds(40)) }
            // Every connection accepted by the daemon and its request waiting on the lock or for a pooled connection.
            let accepted = await DaemonProcess.eventually(timeout: .seconds(10)) {
                RawHTTP.acceptQueueLength(port: port) == 0
            }
            #expect(accepted)
            var waitingOnLock: String?
            let blocked = await DaemonProcess.eventually(timeout: .seconds(10)) {
                let count = try? await database.value(
                    """
                    SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'profile_metrics_latest'::regclass
                        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    """)
                waitingOnLock = count
                // (≥: the scheduler's own writes, whose triggers keep that table, may wait on it too)
                return (count.flatMap { Int($0) } ?? 0) >= 1
            }
            #expect(
                blocked,
                "the daemon's batched read is not waiting on the lock: \(String(describing: waitingOnLock)) waiting")
            // …and every request read and in its handler (in the batch on the lock, or waiting for the next one). A request still unread in the socket when the stop begins is not in flight: its idle
            // connection is closed.
            var inFlight: Int?
            let allInHandlers = await DaemonProcess.eventually(timeout: .seconds(15)) {
                inFlight = try? await Self.gauge("metricsd_http_requests_in_flight", port: port)
                return (inFlight ?? 0) >= users.count
            }
            #expect(allInHandlers, "requests in flight: \(String(describing: inFlight))")

            daemon.signal(SIGTERM)
            let stopping = await manager.first(timeout: .seconds(10)) { $0.has("STOPPING=1") }
            #expect(stopping != nil, "\(manager.transcript)")
            let refused = await DaemonProcess.eventually(timeout: .seconds(5)) { !RawHTTP.canConnect(port: port) }
            #expect(refused, "still accepting connections while stopping")
            try await Task.sleep(for: .seconds(1))
            #expect(daemon.process.isRunning, "exited with requests in flight:\n\(daemon.log)")
            try await TestDatabase.blocking.runIfActive { try locker.execute("COMMIT") }

            let outcomes = await responses.value
            let bad = outcomes.filter { $0.status != 200 }
            #expect(bad.isEmpty, "\(bad.count) of \(outcomes.count) requests did not get a whole 200: \(bad.prefix(3))")
            let status = await daemon.waitForExit(timeout: .seconds(30))
            #expect(status == 0 && daemon.process.terminationReason == .exit, "\(daemon.log)")
            #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "100")
        }
    }

    /// A second SIGTERM while the graceful stop waits for a slow batch (`batch-delay-ms`) exits at once.
    @Test func secondSigtermExitsAtOnce() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...20).map { SeedUser.valid(Int64($0)) })
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": manager.address, "METRICSD_DAILY_AT": "00:00", "METRICSD_WORKERS": "1",
                        "METRICSD_BATCH_SIZE": "5", "METRICSD_FAULTS": "batch-delay-ms=20000",
                    ]),
                port: port)
            _ = try await Self.ready(manager, daemon)
            let working = await manager.first(timeout: .seconds(15)) {
                $0.value("STATUS")?.contains("daily UTC") == true
            }
            try #require(working != nil, "no batch in progress: \(manager.transcript)\n\(daemon.log)")

            daemon.signal(SIGTERM)
            #expect(await manager.first(timeout: .seconds(5)) { $0.has("STOPPING=1") } != nil)
            try await Task.sleep(for: .seconds(1))
            #expect(daemon.process.isRunning, "the first SIGTERM did not wait for the batch:\n\(daemon.log)")
            let second = ContinuousClock.now
            daemon.signal(SIGTERM)
            let status = await daemon.waitForExit(timeout: .seconds(10))
            let took = ContinuousClock.now - second
            #expect(status != nil && took < .seconds(2), "took \(took) after the second SIGTERM")
            #expect(status == 1 && daemon.process.terminationReason == .exit, "\(daemon.log)")
            #expect(await DaemonProcess.eventually(timeout: .seconds(2)) { daemon.log.contains("Second stop signal") })
        }
    }

    /// A notify socket nobody listens on: the daemon runs normally and logs the failed send once, not per ping.
    @Test func unreachableNotifySocketIsLoggedOnce() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": "@metricsd-test-nobody-\(UUID().uuidString.prefix(8))",
                        "WATCHDOG_USEC": "1000000",
                    ]),
                port: port)
            try await daemon.waitUntilReady()
            try await Task.sleep(for: .seconds(2))  // a few failed pings
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
            #expect(daemon.log.components(separatedBy: "sd_notify failed").count - 1 == 1, "\(daemon.log)")
        }
    }

    // MARK: Fatal start-up errors

    /// Port in use: one `Error: cannot listen on …: address already in use` line, `STATUS=failed: …` with
    /// `ERRNO=98`, exit 1, no READY, no crash report, and no work (daily units, instance row) from an instance that
    /// never served.
    @Test func portInUseIsOneLineAndErrno() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...5).map { SeedUser.valid(Int64($0)) })
            let (holder, port) = try Self.listeningSocket()
            defer { close(holder) }
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: ["NOTIFY_SOCKET": manager.address, "METRICSD_DAILY_AT": "00:00"]),
                port: port)
            #expect(await daemon.waitForExit(timeout: .seconds(20)) == 1, "\(daemon.log)")
            #expect(daemon.process.terminationReason == .exit)
            // The whole output is that one line: nothing started work before the listener was bound.
            #expect(
                daemon.log.split(separator: "\n")
                    == ["Error: cannot listen on 127.0.0.1:\(port): address already in use [startup.listen_failed]"],
                "\(daemon.log)")
            Self.expectNoCrashReport(daemon.log)
            let fatal = await manager.first(timeout: .seconds(2)) { $0.value("ERRNO") != nil }
            #expect(fatal?.value("ERRNO") == "98", "\(manager.transcript)")
            #expect(fatal?.value("STATUS")?.contains("failed") == true)
            #expect(!manager.datagrams.contains { $0.has("READY=1") })
            #expect(try await database.value("SELECT count(*) FROM daily_units") == "0", "\(daemon.log)")
            #expect(try await database.value("SELECT count(*) FROM metricsd_instances") == "0", "\(daemon.log)")
        }
    }

    /// Configuration errors found at start: exactly one line of output (`Error: …`), exit 1, quickly (no waiting
    /// for a database), and `STATUS=`/`ERRNO=` to the manager.
    @Test(arguments: [
        ("METRICSD_JWT_SECRET_FILE", "/nonexistent", "config.secret_unreadable"),
        ("DATABASE_URL", "postgresql://host:notaport/x", "config.database_url_invalid"),
        ("DATABASE_URL", "host", "config.database_url_invalid"),
    ])
    func configurationErrorIsOneLine(variable: String, value: String, code: String) async throws {
        let manager = try NotifyRecorder(abstract: true)
        defer { manager.stop() }
        let port = DaemonProcess.freePort()
        var environment = DaemonProcess.environment(
            databaseURL: "postgresql://postgres@127.0.0.1:\(DaemonProcess.freePort())/x", port: port,
            extra: ["NOTIFY_SOCKET": manager.address])
        environment[variable] = value
        let started = ContinuousClock.now
        let daemon = try DaemonProcess(environment: environment, port: port)
        #expect(await daemon.waitForExit(timeout: .seconds(10)) == 1, "\(daemon.log)")
        #expect(ContinuousClock.now - started < .seconds(5))
        let lines = daemon.log.split(separator: "\n")
        #expect(lines.count == 1 && lines.first?.hasPrefix("Error: configuration error: ") == true, "\(daemon.log)")
        #expect(lines.first?.hasSuffix(" [\(code)]") == true, "\(daemon.log)")
        let fatal = await manager.first(timeout: .seconds(2)) { $0.value("ERRNO") != nil }
        #expect(fatal?.value("ERRNO") == String(EINVAL), "\(manager.transcript)")
        #expect(fatal?.value("STATUS")?.hasPrefix("failed: configuration error: ") == true)
    }

    /// `metricsd migrate` against a database nobody serves: one line, exit 1.
    @Test func migrateAgainstUnreachableDatabaseIsOneLine() async throws {
        let port = DaemonProcess.freePort()
        let (status, stdout, stderr) = try await Subprocess.capture(
            try DaemonProcess.binary(), ["migrate"],
            environment: ["DATABASE_URL": "postgresql://postgres@127.0.0.1:\(port)/x?connect_timeout=3"])
        #expect(status == 1)
        #expect(stdout.isEmpty)
        let lines = stderr.split(separator: "\n")
        #expect(
            lines.count == 1 && lines.first?.hasPrefix("Error: cannot connect to the database: ") == true, "\(stderr)")
        #expect(lines.first?.hasSuffix(" [database.connection_failed]") == true, "\(stderr)")
        #expect(lines.first?.contains("port \(port)") == true)
    }

    // MARK: Helpers

    /// Waits for the first `READY=1`.
    static func ready(
        _ manager: NotifyRecorder, _ daemon: DaemonProcess, timeout: Duration = .seconds(30)
    ) async throws -> NotifyRecorder.Datagram {
        try #require(
            await manager.first(timeout: timeout) { $0.has("READY=1") },
            "no READY=1 within \(timeout): \(manager.transcript)\nlog:\n\(daemon.log.suffix(3000))")
    }

    /// The value of an unlabelled gauge on `GET /metrics`.
    static func gauge(_ name: String, port: Int) async throws -> Int? {
        let text = try await HTTP.request(port: port, "/metrics").text
        let line = text.split(separator: "\n").first { $0.hasPrefix(name + " ") }
        return line.flatMap { Double($0.dropFirst(name.count + 1)) }.map { Int($0) }
    }

    /// `GET /v1/admin/recompute` with an admin bearer token; the status code.
    static func admin(_ daemon: DaemonProcess, token: String) async throws -> Int {
        try await daemon.request("/v1/admin/recompute", headers: TestTokens.bearer(token)).status.code
    }

    /// No Swift runtime crash report or backtrace in the output.
    static func expectNoCrashReport(_ output: String, sourceLocation: SourceLocation = #_sourceLocation) {
        for marker in ["Fatal error", "Stack dump", "Backtrace", "backtrace", "Crash", "💣"] {
            #expect(!output.contains(marker), "crash report (\(marker)) in:\n\(output)", sourceLocation: sourceLocation)
        }
    }

    /// A TCP socket listening on a free port of 127.0.0.1.
    static func listeningSocket() throws -> (Int32, Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, length) == 0 && listen(descriptor, 16) == 0
                    && getsockname(descriptor, $0, &length) == 0
            }
        }
        guard bound else {
            close(descriptor)
            throw NotifySocketError(errno: errno)
        }
        return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
    }

    /// A new directory under `METRICSD_TEST_TMP` (or the temporary directory).
    static func scratchDirectory(_ label: String) throws -> String {
        let base =
            ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
            ?? NSTemporaryDirectory()
        let path = URL(fileURLWithPath: base).appendingPathComponent(
            "\(label)-" + UUID().uuidString.prefix(8).lowercased()
        ).path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }
}
