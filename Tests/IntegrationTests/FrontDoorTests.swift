import Foundation
import Glibc
import HTTPTypes
import MetricsdTestSupport
import Testing

/// How the real daemon faces its clients: the listening socket systemd passes (through systemd's own
/// `systemd-socket-activate`), the internal listener, TLS with a certificate reload, the client address behind a
/// trusted proxy, and a stop that answers a keep-alive client's last request instead of resetting it. The
/// restart, upgrade and crash scenarios under load, with systemd as PID 1, are the package's tests
/// (systemd/debian/tests/restarts, upgrade, frontdoor).
@Suite struct FrontDoorTests {
    static let socketActivate = "/usr/bin/systemd-socket-activate"
    static let openssl = "/usr/bin/openssl"
    static let curl = "/usr/bin/curl"

    static func require(_ tool: String) throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: tool),
            "\(tool) is missing: install it (systemd, openssl, curl)")
    }

    @Test func servesTheSocketSystemdPasses() async throws {
        try Self.require(Self.socketActivate)
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let unused = DaemonProcess.freePort()
            let environment = DaemonProcess.environment(databaseURL: database.url, port: unused)
            // systemd-socket-activate listens, and starts metricsd with the socket (LISTEN_FDS, LISTEN_FDNAMES) once
            // a connection arrives; the environment goes through -E.
            let launcher =
                [Self.socketActivate, "--listen=127.0.0.1:\(port)", "--fdname=public"]
                + environment.keys.sorted().flatMap { ["-E", $0] }
            let daemon = try DaemonProcess(environment: environment, port: port, launcher: launcher)
            // The first connection waits in the socket's backlog while metricsd starts, then is served.
            let listening = await DaemonProcess.eventually(timeout: .seconds(10)) {
                RawHTTP.connect(port: port).map { close($0) } != nil
            }
            try #require(listening, "systemd-socket-activate does not listen on \(port): \(daemon.log)")
            let first = try RawConnection(port: port)
            first.send(RawHTTP.get("/healthz", port: port))
            let answer = await first.readResponse(timeout: .seconds(60))
            #expect(answer?.hasPrefix("HTTP/1.1 200") == true, "\(answer ?? "no answer")\n\(daemon.log.suffix(2000))")
            try await daemon.waitUntilReady()
            #expect(daemon.log.contains("Listening sockets from systemd"), "\(daemon.log.suffix(2000))")
            #expect(!RawHTTP.canConnect(port: unused), "METRICSD_LISTEN was bound besides the socket from systemd")
            await daemon.stop()
        }
    }

    @Test func theInternalListenerTakesMetricsAndTheAdminAPI() async throws {
        try Self.require(Self.curl)
        try await withTestDatabase { database in
            let internalPort = DaemonProcess.freePort()
            let daemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(internalPort)"])
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let user = TestTokens.bearer(TestTokens.user(1))
            #expect(try await daemon.send("/v1/admin/recompute", method: .post, headers: admin).status == 404)
            #expect(try await daemon.send("/metrics").status == 404)
            #expect(try await daemon.send("/healthz").status == 200)
            // User 1 has no metrics here (a 404 of its own): the route is served, not unknown.
            #expect(try await !daemon.send("/v1/profile/metrics/today", headers: user).text.contains("no such route"))
            let metrics = try await API.send(port: internalPort, "/metrics")
            #expect(metrics.status == 200 && metrics.text.contains("metricsd_build_info"), "\(metrics)")
            let trigger = try await API.send(port: internalPort, "/v1/admin/recompute", method: .post, headers: admin)
            #expect((200..<300).contains(trigger.status), "\(trigger)")
            #expect(try await API.send(port: internalPort, "/readyz").status == 200)
            #expect(
                try await API.send(port: internalPort, "/v1/profile/metrics/today", headers: user).text.contains(
                    "no such route"))
            await daemon.stop()

            // A Unix socket as the internal listener.
            let path = try scratchFile("placeholder", "") + ".sock"
            let unixDaemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_INTERNAL_LISTEN": "unix:\(path)"])
            let scrape = try await Subprocess.capture(
                Self.curl,
                ["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", path, "http://localhost/metrics"])
            #expect(scrape.stdout == "200", "\(scrape.stdout) \(scrape.stderr)")
            #expect(try await unixDaemon.send("/metrics").status == 404)
            await unixDaemon.stop()
        }
    }

    /// A self-signed P-256 certificate for localhost and 127.0.0.1: its PEM files.
    static func certificate(_ name: String) async throws -> (certificate: String, key: String) {
        let base = try scratchFile("\(name).crt", "")
        let key = base.replacingOccurrences(of: ".crt", with: ".key")
        let made = try await Subprocess.capture(
            Self.openssl,
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj",
                "/CN=\(name)", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", base,
            ])
        try #require(made.status == 0, "openssl req: \(made.stderr)")
        return (base, key)
    }

    /// The SHA-256 fingerprint of the certificate a new TLS connection to `port` gets ("" when none).
    static func servedFingerprint(port: Int) async throws -> String {
        try await Subprocess.capture(
            "/bin/bash",
            [
                "-c",
                "\(Self.openssl) s_client -connect 127.0.0.1:\(port) -servername localhost </dev/null 2>/dev/null | \(Self.openssl) x509 -noout -fingerprint -sha256",
            ]
        ).stdout
    }

    static func fingerprint(_ file: String) async throws -> String {
        try await Subprocess.capture(Self.openssl, ["x509", "-in", file, "-noout", "-fingerprint", "-sha256"]).stdout
    }

    /// Whether a TLS handshake with these `openssl s_client` options succeeds.
    static func handshake(port: Int, _ options: [String]) async throws -> Bool {
        let result = try await Subprocess.capture(
            "/bin/bash",
            [
                "-c",
                "\(Self.openssl) s_client -connect 127.0.0.1:\(port) -servername localhost \(options.joined(separator: " ")) </dev/null",
            ])
        return result.stdout.contains("Cipher is ") && !result.stdout.contains("Cipher is (NONE)")
    }

    @Test func tlsFromFilesAndAReloadedCertificate() async throws {
        try Self.require(Self.openssl)
        try Self.require(Self.curl)
        try await withTestDatabase { database in
            let first = try await Self.certificate("first")
            let renewed = try await Self.certificate("renewed")
            let served = (certificate: first.certificate + ".served", key: first.key + ".served")
            try FileManager.default.copyItem(atPath: first.certificate, toPath: served.certificate)
            try FileManager.default.copyItem(atPath: first.key, toPath: served.key)
            let publicPort = DaemonProcess.freePort()
            let internalPort = DaemonProcess.freePort()
            // The internal listener stays plain: readiness is asked there.
            let environment = DaemonProcess.environment(
                databaseURL: database.url, port: publicPort,
                extra: [
                    "METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(internalPort)", "METRICSD_TLS": "public",
                    "METRICSD_TLS_CERTIFICATE_FILE": served.certificate, "METRICSD_TLS_KEY_FILE": served.key,
                ])
            let daemon = try DaemonProcess(environment: environment, port: internalPort)
            try await daemon.waitUntilReady()

            let https = try await Subprocess.capture(
                Self.curl,
                [
                    "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", first.certificate,
                    "https://localhost:\(publicPort)/healthz",
                ])
            #expect(https.stdout == "200", "\(https.stdout) \(https.stderr)")
            #expect(try await Self.handshake(port: publicPort, ["-tls1_3"]))
            #expect(
                try await Self.handshake(port: publicPort, ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]))
            #expect(try await !Self.handshake(port: publicPort, ["-tls1_1", "-cipher", "'DEFAULT:@SECLEVEL=0'"]))
            #expect(
                try await !Self.handshake(
                    port: publicPort, ["-tls1_2", "-cipher", "'ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0'"]))
            let plain = try await Subprocess.capture(
                Self.curl, ["-sS", "--max-time", "3", "http://127.0.0.1:\(publicPort)/healthz"])
            #expect(plain.status != 0, "plain HTTP answered on the TLS port: \(plain.stdout)")

            // A renewed certificate, then SIGHUP: new connections get it, the process stays.
            try FileManager.default.removeItem(atPath: served.certificate)
            try FileManager.default.removeItem(atPath: served.key)
            try FileManager.default.copyItem(atPath: renewed.certificate, toPath: served.certificate)
            try FileManager.default.copyItem(atPath: renewed.key, toPath: served.key)
            daemon.signal(SIGHUP)
            let expected = try await Self.fingerprint(renewed.certificate)
            let switched = try await DaemonProcess.eventually(timeout: .seconds(10)) {
                try await Self.servedFingerprint(port: publicPort) == expected
            }
            #expect(switched, "\(daemon.log.suffix(2000))")

            // A key that does not match: the reload fails, the renewed certificate stays.
            try FileManager.default.removeItem(atPath: served.key)
            try FileManager.default.copyItem(atPath: first.key, toPath: served.key)
            daemon.signal(SIGHUP)
            let failed = await DaemonProcess.eventually(timeout: .seconds(10)) { daemon.log.contains("Reload failed") }
            #expect(failed, "\(daemon.log.suffix(2000))")
            #expect(try await Self.servedFingerprint(port: publicPort) == expected)
            await daemon.stop()

            // A key that does not match at start: one line, exit 1.
            let mismatched = try DaemonProcess(environment: environment, port: internalPort)
            #expect(await mismatched.waitForExit(timeout: .seconds(20)) == 1)
            let lines = mismatched.log.split(separator: "\n")
            #expect(
                lines.count == 1 && lines[0].hasPrefix("Error: configuration error: METRICSD_TLS: "),
                "\(mismatched.log)")
        }
    }

    @Test func theForwardedClientIsLoggedOnlyFromATrustedProxy() async throws {
        try await withTestDatabase { database in
            let forwarded: HTTPFields = [
                HTTPField.Name("X-Forwarded-For")!: "203.0.113.9, 198.51.100.7",
                HTTPField.Name("X-Request-Id")!: "via-proxy",
            ]
            let trusted = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_TRUSTED_PROXIES": "127.0.0.1,::1", "METRICSD_REQUEST_LOG": "all"])
            #expect(try await trusted.send("/healthz", headers: forwarded).status == 200)
            let logged = await DaemonProcess.eventually(timeout: .seconds(5)) {
                trusted.log.contains("metricsd.request.id=via-proxy")
            }
            let line = trusted.log.split(separator: "\n").first { $0.contains("metricsd.request.id=via-proxy") } ?? ""
            #expect(logged && line.contains("metricsd.http.client=198.51.100.7"), "\(line)")
            await trusted.stop()

            let untrusted = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_TRUSTED_PROXIES": "10.0.0.0/8", "METRICSD_REQUEST_LOG": "all"])
            #expect(try await untrusted.send("/healthz", headers: forwarded).status == 200)
            _ = await DaemonProcess.eventually(timeout: .seconds(5)) {
                untrusted.log.contains("metricsd.request.id=via-proxy")
            }
            let direct =
                untrusted.log.split(separator: "\n").first { $0.contains("metricsd.request.id=via-proxy") } ?? ""
            #expect(direct.contains("metricsd.http.client=127.0.0.1") && !direct.contains("198.51.100.7"), "\(direct)")
            await untrusted.stop()
        }
    }

    /// Stopping: a keep-alive client whose next request is on its way gets an answer that closes the connection,
    /// not a reset; a client that sends nothing is closed after the grace (0.5 s).
    @Test func aStopAnswersTheLastRequestOfAKeepAliveClient() async throws {
        try await withTestDatabase { database in
            let daemon = try await DaemonProcess.start(database: database)
            let busy = try RawConnection(port: daemon.port)
            let idle = try RawConnection(port: daemon.port)
            for connection in [busy, idle] {
                connection.send(RawHTTP.get("/healthz", port: daemon.port))
                let first = await connection.readResponse()
                #expect(first?.hasPrefix("HTTP/1.1 200") == true)
            }
            daemon.signal(SIGTERM)
            try await Task.sleep(for: .milliseconds(100))
            busy.send(RawHTTP.get("/healthz", port: daemon.port))
            let last = await busy.readResponse()
            #expect(last?.hasPrefix("HTTP/1.1 200") == true, "\(last ?? "no answer")")
            #expect(last?.lowercased().contains("connection: close") == true, "\(last ?? "no answer")")
            var received: [UInt8] = []
            #expect(await busy.waitForClose(timeout: .seconds(3), received: &received) != nil)
            var idleReceived: [UInt8] = []
            let closedAfter = await idle.waitForClose(timeout: .seconds(5), received: &idleReceived)
            #expect(
                closedAfter != nil && idleReceived.isEmpty, "the idle connection: \(String(describing: closedAfter))")
            #expect(await daemon.waitForExit(timeout: .seconds(20)) == 0, "\(daemon.log.suffix(2000))")
        }
    }
}
