import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import MetricsdCLI
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdTestSupport
import Testing

/// The listeners as they are served, against the real binary: the address behind the shipped nginx example, the
/// trusted-proxy ranges that trust too much, `METRICSD_TLS` naming a listener that does not exist, `check-config`
/// beside a daemon that speaks TLS, the internal listener's own connection limit, and a dual-stack socket unit
/// (two sockets of one name from `systemd-socket-activate`).
@Suite struct ListenerTests {
    static let nginx = "/usr/sbin/nginx"

    // MARK: The forwarded address

    /// Through the shipped nginx example (only its ports and certificate changed), a client that sends its own
    /// `Forwarded` or `X-Forwarded-For` is still logged with the address nginx saw.
    @Test func behindTheNginxExampleTheClientCannotChooseItsLoggedAddress() async throws {
        for tool in [Self.nginx, FrontDoorTests.curl, FrontDoorTests.openssl] { try FrontDoorTests.require(tool) }
        try await withTestDatabase { database in
            let daemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_TRUSTED_PROXIES": "127.0.0.1,::1", "METRICSD_REQUEST_LOG": "all"])
            let proxy = try await NginxExample.start(upstreamPort: daemon.port)
            defer { proxy.stop() }
            let forged: [(id: String, headers: [String])] = [
                ("forged-forwarded", ["Forwarded: for=198.51.100.66"]),
                ("forged-both", ["Forwarded: for=198.51.100.66", "X-Forwarded-For: 203.0.113.9"]),
                ("forwarded-proto", ["Forwarded: proto=https"]),
                ("forged-x-forwarded-for", ["X-Forwarded-For: 203.0.113.9"]),
            ]
            for (id, headers) in forged {
                // From 127.0.0.5, which is no trusted proxy: the log must name it, whatever the client claims.
                let status = try await proxy.get(
                    "/healthz", from: "127.0.0.5", headers: headers + ["X-Request-Id: \(id)"])
                #expect(status == "200", "\(id): \(status)\n\(proxy.errors)")
                let line = await Self.requestLogLine(daemon, id: id)
                #expect(line.contains("metricsd.http.client=127.0.0.5"), "\(id): \(line)\n\(daemon.log.suffix(1500))")
            }
            await daemon.stop()
        }
    }

    /// `METRICSD_FORWARDED_HEADER` names the one header read; the other is ignored even from a trusted proxy.
    @Test(arguments: [("x-forwarded-for", "203.0.113.9"), ("forwarded", "198.51.100.66")])
    func oneForwardedHeaderIsRead(setting: String, logged: String) async throws {
        try await withTestDatabase { database in
            let daemon = try await DaemonProcess.start(
                database: database,
                extra: [
                    "METRICSD_TRUSTED_PROXIES": "127.0.0.1", "METRICSD_REQUEST_LOG": "all",
                    "METRICSD_FORWARDED_HEADER": setting,
                ])
            let connection = try RawConnection(port: daemon.port)
            connection.send(
                RawHTTP.get(
                    "/healthz", port: daemon.port,
                    headers: [
                        "Forwarded": "for=198.51.100.66", "X-Forwarded-For": "203.0.113.9",
                        "X-Request-Id": "one-header",
                    ]))
            #expect(await connection.readResponse()?.hasPrefix("HTTP/1.1 200") == true)
            let line = await Self.requestLogLine(daemon, id: "one-header")
            #expect(line.contains("metricsd.http.client=\(logged)"), "\(line)")
            await daemon.stop()
        }
    }

    /// A trusted range that holds much of the internet is accepted with a warning, at start and by check-config;
    /// proxies on private networks and loopback are not warned about.
    @Test func aTrustedRangeOfTheWholeInternetIsWarnedAbout() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            for (ranges, warned) in [
                ("0.0.0.0/0", true), ("127.0.0.1,2000::/2", true), ("10.0.0.0/8,127.0.0.1,::1,fc00::/7", false),
            ] {
                let environment = DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_TRUSTED_PROXIES": ranges])
                let check = try await Subprocess.capture(
                    try DaemonProcess.binary(), ["check-config"], environment: environment)
                let warning = check.stderr.split(separator: "\n").first {
                    $0.hasPrefix("metricsd: warning: METRICSD_TRUSTED_PROXIES: ")
                }
                #expect((warning != nil) == warned, "\(ranges): \(check.stderr)")
                if warned {
                    #expect(warning?.contains("list only your proxies' addresses") == true, "\(warning ?? "")")
                    #expect(check.status == 0, "a warning does not fail the check: \(check.stderr)")
                }
            }
            let daemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_TRUSTED_PROXIES": "0.0.0.0/0"])
            #expect(
                daemon.log.contains("warning") && daemon.log.contains("METRICSD_TRUSTED_PROXIES"),
                "\(daemon.log.suffix(2000))")
            await daemon.stop()
        }
    }

    // MARK: TLS and the listeners that exist

    /// `METRICSD_TLS=internal` (or `both`) without an internal listener: serve refuses in one line naming what to
    /// change, instead of serving everything in clear text on the public port.
    @Test(arguments: ["internal", "both"])
    func tlsNamingAMissingInternalListenerIsRefused(mode: String) async throws {
        let certificate = try await FrontDoorTests.certificate("refused")
        let port = DaemonProcess.freePort()
        let environment = DaemonProcess.environment(
            databaseURL: "postgresql://postgres@127.0.0.1:\(DaemonProcess.freePort())/x?connect_timeout=1", port: port,
            extra: [
                "METRICSD_TLS": mode, "METRICSD_TLS_CERTIFICATE_FILE": certificate.certificate,
                "METRICSD_TLS_KEY_FILE": certificate.key,
            ])
        let daemon = try DaemonProcess(environment: environment, port: port)
        #expect(await daemon.waitForExit(timeout: .seconds(20)) == 1, "\(daemon.log)")
        let lines = daemon.log.split(separator: "\n")
        #expect(lines.count == 1, "\(daemon.log)")
        #expect(
            lines.first?.hasPrefix("Error: configuration error: METRICSD_TLS=\(mode) needs the internal listener")
                == true, "\(daemon.log)")
        #expect(
            lines.first?.contains("METRICSD_INTERNAL_LISTEN") == true
                && lines.first?.contains("metricsd-internal.socket") == true)
        #expect(lines.first?.hasSuffix("[config.invalid_value]") == true, "\(daemon.log)")
        #expect(!RawHTTP.canConnect(port: port), "the public port was opened")

        let check = try await Subprocess.capture(try DaemonProcess.binary(), ["check-config"], environment: environment)
        #expect(check.status == 78)
        #expect(
            check.stderr.contains("metricsd: METRICSD_TLS: METRICSD_TLS=\(mode) needs the internal listener"),
            "\(check.stderr)")
    }

    /// The internal socket from systemd is the internal listener `METRICSD_TLS=internal` names: it speaks TLS, the
    /// public one plain HTTP.
    @Test func tlsOnTheInternalSocketFromSystemd() async throws {
        for tool in [FrontDoorTests.socketActivate, FrontDoorTests.curl, FrontDoorTests.openssl] {
            try FrontDoorTests.require(tool)
        }
        try await withTestDatabase { database in
            let certificate = try await FrontDoorTests.certificate("internal")
            let (publicPort, internalPort) = (DaemonProcess.freePort(), DaemonProcess.freePort())
            let environment = DaemonProcess.environment(
                databaseURL: database.url, port: DaemonProcess.freePort(),
                extra: [
                    "METRICSD_TLS": "internal", "METRICSD_TLS_CERTIFICATE_FILE": certificate.certificate,
                    "METRICSD_TLS_KEY_FILE": certificate.key,
                ])
            let launcher =
                [
                    FrontDoorTests.socketActivate, "--listen=127.0.0.1:\(publicPort)",
                    "--listen=127.0.0.1:\(internalPort)", "--fdname=public:internal",
                ]
                + environment.keys.sorted().flatMap { ["-E", $0] }
            let daemon = try DaemonProcess(environment: environment, port: publicPort, launcher: launcher)
            try await Self.activate(daemon, port: publicPort)
            let scrape = try await Self.curl([
                "--cacert", certificate.certificate, "https://localhost:\(internalPort)/metrics",
            ])
            #expect(scrape == "200", "\(scrape)\n\(daemon.log.suffix(2000))")
            #expect(try await Self.curl(["http://127.0.0.1:\(publicPort)/metrics"]) == "404")
            #expect(
                try await Self.curl(["--max-time", "3", "http://127.0.0.1:\(internalPort)/healthz"]) != "200",
                "plain HTTP on the TLS port")
            await daemon.stop()
        }
    }

    /// check-config beside a running daemon that speaks TLS on both listeners: it asks in TLS and recognises
    /// metricsd by its /healthz answer (a plain request gets no answer there); a port held by something else is
    /// still a problem.
    @Test func checkConfigRecognisesTheRunningDaemonOverTLS() async throws {
        try await withTestDatabase { database in
            let certificate = try await FrontDoorTests.certificate("check")
            let (publicPort, internalPort) = (DaemonProcess.freePort(), DaemonProcess.freePort())
            var environment = DaemonProcess.environment(
                databaseURL: database.url, port: publicPort,
                extra: [
                    "METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(internalPort)", "METRICSD_TLS": "both",
                    "METRICSD_TLS_CERTIFICATE_FILE": certificate.certificate, "METRICSD_TLS_KEY_FILE": certificate.key,
                ])
            let daemon = try DaemonProcess(environment: environment, port: publicPort)
            let up = await DaemonProcess.eventually(timeout: .seconds(30)) {
                (try? await Self.curl(["--cacert", certificate.certificate, "https://localhost:\(internalPort)/readyz"]))
                    == "200"
            }
            try #require(up, "\(daemon.log.suffix(2000))")

            let check = try await Subprocess.capture(
                try DaemonProcess.binary(), ["check-config"], environment: environment)
            #expect(check.status == 0, "\(check.stderr)\n\(check.stdout)")
            #expect(
                check.stdout.contains("  listen:       127.0.0.1:\(publicPort) (in use by a running metricsd, TLS)"),
                "\(check.stdout)")
            #expect(
                check.stdout.contains("  internal:     127.0.0.1:\(internalPort) (in use by a running metricsd, TLS)"),
                "\(check.stdout)")

            // Something else on the public port: not metricsd, whether asked in TLS or in plain HTTP.
            let (holder, heldPort) = try SystemdProtocolTests.listeningSocket()
            defer { close(holder) }
            environment["METRICSD_LISTEN"] = "127.0.0.1:\(heldPort)"
            let held = try await Subprocess.capture(
                try DaemonProcess.binary(), ["check-config"], environment: environment)
            #expect(held.status == 78)
            #expect(
                held.stderr.contains(
                    "metricsd: METRICSD_LISTEN: 127.0.0.1:\(heldPort) is in use by another program [config.listen_unavailable]"
                ),
                "\(held.stderr)")
            await daemon.stop()
        }
    }

    // MARK: Connection limits

    /// The internal listener has its own limit inside the descriptor budget: with the hard limit at the budget,
    /// more idle connections to the internal port than it allows are refused (503, closed, logged) and the
    /// public health checks still answer.
    @Test func theInternalListenerHasItsOwnConnectionLimit() async throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: DescriptorLimitTests.prlimit), "install util-linux (prlimit)")
        try await withTestDatabase { database in
            let (maxConnections, internalLimit, pool) = (150, 64, 8)
            let internalPort = DaemonProcess.freePort()
            let port = DaemonProcess.freePort()
            let environment = DaemonProcess.environment(
                databaseURL: database.url, port: port,
                extra: [
                    "METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(internalPort)",
                    "METRICSD_MAX_CONNECTIONS": "\(maxConnections)",
                    "METRICSD_DB_POOL_SIZE": "\(pool)",
                ])
            // Both listeners' connections and refusals finishing, the pool, the settings listener's session, two listening sockets, the reserve.
            let budget =
                maxConnections + internalLimit + 2 * ConnectionLimit.lingeringRefusals + pool + 1 + 2
                + DescriptorBudget.reserve()
            let daemon = try DaemonProcess(
                environment: environment, port: port,
                launcher: [DescriptorLimitTests.prlimit, "--nofile=\(budget):\(budget)", "--"])
            try await daemon.waitUntilReady()

            var idle: [RawConnection] = []
            for _ in 0..<(budget + 20) { idle.append(try RawConnection(port: internalPort)) }
            // Every connection over the limit is answered 503 (the limit's own reply) without having sent anything.
            var received = [[UInt8]](repeating: [], count: idle.count)
            let opened = ContinuousClock.now
            let refusedAll = await DaemonProcess.eventually(timeout: .seconds(10)) {
                for (index, connection) in idle.enumerated() {
                    if case .data(let bytes) = connection.readNow() { received[index] += bytes }
                }
                return received.filter { String(decoding: $0, as: UTF8.self).hasPrefix("HTTP/1.1 503") }.count >= idle
                    .count - internalLimit
            }
            let refused = received.filter { String(decoding: $0, as: UTF8.self).hasPrefix("HTTP/1.1 503") }.count
            #expect(
                refusedAll,
                "\(refused) of the \(idle.count - internalLimit) connections over the limit were answered 503")
            let refusedAfter = ContinuousClock.now - opened
            for path in ["/healthz", "/readyz"] {
                let started = ContinuousClock.now
                let status = try? await daemon.request(path).status.code
                let took = ContinuousClock.now - started
                #expect(
                    status == 200,
                    "public \(path) while the internal port is flooded: \(String(describing: status))\n\(daemon.log.suffix(2000))"
                )
                #expect(took < .seconds(5))
                print(
                    "internal port flooded (\(idle.count) idle, limit \(internalLimit), budget \(budget)): \(refused) answered 503 within \(refusedAfter); public \(path) \(String(describing: status)) in \(took)"
                )
            }
            let logged = await DaemonProcess.eventually(timeout: .seconds(5)) {
                daemon.log.contains("Too many connections")
            }
            let line = daemon.log.split(separator: "\n").first { $0.contains("Too many connections") } ?? ""
            #expect(
                logged && line.contains("metricsd.listener=internal")
                    && line.contains("METRICSD_INTERNAL_MAX_CONNECTIONS"), "\(line)")
            idle.removeAll()
            await daemon.stop()
            #expect(!daemon.log.contains("Too many open files"), "\(daemon.log.suffix(2000))")
        }
    }

    // MARK: Socket activation

    /// A dual-stack socket unit: two sockets named public (IPv4 and IPv6 loopback, one port), both served.
    @Test func aDualStackSocketUnitIsServedOnBothSockets() async throws {
        for tool in [FrontDoorTests.socketActivate, FrontDoorTests.curl] { try FrontDoorTests.require(tool) }
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let environment = DaemonProcess.environment(databaseURL: database.url, port: DaemonProcess.freePort())
            let launcher =
                [
                    FrontDoorTests.socketActivate, "--listen=127.0.0.1:\(port)", "--listen=[::1]:\(port)",
                    "--fdname=public:public",
                ]
                + environment.keys.sorted().flatMap { ["-E", $0] }
            let daemon = try DaemonProcess(environment: environment, port: port, launcher: launcher)
            try await Self.activate(daemon, port: port)
            #expect(try await Self.curl(["http://127.0.0.1:\(port)/healthz"]) == "200", "\(daemon.log.suffix(2000))")
            #expect(try await Self.curl(["-g", "http://[::1]:\(port)/healthz"]) == "200", "\(daemon.log.suffix(2000))")
            #expect(
                daemon.log.contains("127.0.0.1:\(port), [::1]:\(port)"),
                "the ready line names both: \(daemon.log.suffix(2000))")
            await daemon.stop()
        }
    }

    // MARK: Helpers

    /// The first connection to a socket of `systemd-socket-activate` starts metricsd; waits until it is ready.
    static func activate(_ daemon: DaemonProcess, port: Int) async throws {
        let listening = await DaemonProcess.eventually(timeout: .seconds(10)) {
            RawHTTP.connect(port: port).map { close($0) } != nil
        }
        try #require(listening, "systemd-socket-activate does not listen on \(port): \(daemon.log)")
        let ready = await DaemonProcess.eventually(timeout: .seconds(60)) {
            guard daemon.process.isRunning else { return false }
            return (try? await Self.curl(["http://127.0.0.1:\(port)/readyz"])) == "200"
        }
        try #require(ready, "metricsd did not become ready: \(daemon.log.suffix(3000))")
    }

    /// curl's status code for a GET ("000" when there was no answer).
    static func curl(_ arguments: [String]) async throws -> String {
        try await Subprocess.capture(
            FrontDoorTests.curl, ["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"] + arguments
        ).stdout
    }

    /// The request log line of the request with this `X-Request-Id` ("" when none within 5 s).
    static func requestLogLine(_ daemon: DaemonProcess, id: String) async -> String {
        _ = await DaemonProcess.eventually(timeout: .seconds(5)) { daemon.log.contains("metricsd.request.id=\(id)") }
        return daemon.log.split(separator: "\n").first { $0.contains("metricsd.request.id=\(id)") }.map(String.init)
            ?? ""
    }
}

/// nginx running the shipped example site (systemd/examples/nginx-metricsd.conf) as it is, but for its ports,
/// certificate and server name, in the foreground as a single process with its files in a scratch directory.
final class NginxExample: @unchecked Sendable {  // the process is started once and only stopped after
    let port: Int
    let certificate: String
    let directory: String
    private let process: Process

    static let example = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("systemd/examples/nginx-metricsd.conf")

    private init(port: Int, certificate: String, directory: String, process: Process) {
        (self.port, self.certificate, self.directory, self.process) = (port, certificate, directory, process)
    }

    static func start(upstreamPort: Int) async throws -> NginxExample {
        let certificate = try await FrontDoorTests.certificate("nginx")
        let directory = try SystemdProtocolTests.scratchDirectory("nginx")
        let port = DaemonProcess.freePort()
        var site = try String(contentsOf: Self.example, encoding: .utf8)
        let replacements = [
            ("server 127.0.0.1:8080;", "server 127.0.0.1:\(upstreamPort);"),
            ("listen 443 ssl;", "listen 127.0.0.1:\(port) ssl;"),
            ("listen [::]:443 ssl;", ""),
            ("server_name api.example.com;", "server_name localhost;"),
            ("/etc/letsencrypt/live/api.example.com/fullchain.pem", certificate.certificate),
            ("/etc/letsencrypt/live/api.example.com/privkey.pem", certificate.key),
        ]
        for (old, new) in replacements {
            try #require(site.contains(old), "the nginx example no longer contains \(old)")
            site = site.replacingOccurrences(of: old, with: new)
        }
        try site.write(toFile: directory + "/site.conf", atomically: true, encoding: .utf8)
        let temporary = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map {
            "    \($0)_temp_path \(directory)/\($0);"
        }
        let main = """
            daemon off;
            master_process off;
            pid \(directory)/nginx.pid;
            error_log \(directory)/error.log;
            events { worker_connections 256; }
            http {
                access_log off;
            \(temporary.joined(separator: "\n"))
                include \(directory)/site.conf;
            }
            """
        try main.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: ListenerTests.nginx)
        process.arguments = ["-p", directory, "-e", directory + "/error.log", "-c", directory + "/nginx.conf"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let proxy = NginxExample(
            port: port, certificate: certificate.certificate, directory: directory, process: process)
        let listening = await DaemonProcess.eventually(timeout: .seconds(10)) { RawHTTP.canConnect(port: port) }
        try #require(listening, "nginx does not listen on \(port): \(proxy.errors)")
        return proxy
    }

    /// nginx's error log.
    var errors: String { (try? String(contentsOfFile: self.directory + "/error.log", encoding: .utf8)) ?? "" }

    /// A GET through nginx over TLS from the local address `source`, with extra header lines; curl's status code.
    func get(_ path: String, from source: String, headers: [String]) async throws -> String {
        let arguments =
            [
                "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "--interface", source, "--cacert",
                self.certificate,
            ]
            + ["--resolve", "localhost:\(self.port):127.0.0.1"] + headers.flatMap { ["-H", $0] } + [
                "https://localhost:\(self.port)\(path)"
            ]
        let result = try await Subprocess.capture(FrontDoorTests.curl, arguments)
        return result.stdout + (result.stderr.isEmpty ? "" : " " + result.stderr)
    }

    /// SIGKILL: the test's process blocks SIGTERM in the threads nginx inherits its signal mask from, and nginx
    /// without a master process never unblocks it.
    func stop() {
        guard self.process.isRunning else { return }
        kill(self.process.processIdentifier, SIGKILL)
        self.process.waitUntilExit()
    }
}
