import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import Synchronization
import Testing

/// The real `metricsd` binary, run as a child process the way systemd or an operator would run it.
// The Process is only touched under `lock`-free reads after start.
package final class DaemonProcess: @unchecked Sendable {
    package let process: Process
    package let port: Int
    private let output: OutputBuffer
    private let outputPipe: Pipe

    /// `METRICSD_BINARY` (set by `scripts/test`), else the debug build next to the tests.
    package static func binary() throws -> String {
        if let path = ProcessInfo.processInfo.environment["METRICSD_BINARY"], !path.isEmpty { return path }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let path = root.appendingPathComponent(".build/debug/metricsd").path
        try #require(
            FileManager.default.isExecutableFile(atPath: path),
            "build the daemon first: swift build (scripts/test does)")
        return path
    }

    /// A free TCP port below the kernel's ephemeral range (32768–60999 here): a port picked from that range can be
    /// taken, between the pick and the daemon's bind, as the local port of some outgoing connection (the
    /// daemons' own connections to PostgreSQL), and the daemon then fails with "address already in use".
    package static func freePort() -> Int {
        let ephemeralStart =
            (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))
            .flatMap { $0.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.flatMap { Int($0) } }
            ?? 32768
        let range = 20000..<max(20001, min(ephemeralStart, 32768))
        for _ in 0..<200 {
            let port = Int.random(in: range)
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            close(descriptor)
            if bound == 0 { return port }
        }
        return Self.kernelPickedPort()
    }

    /// A port the kernel picks (port 0), when no port below the ephemeral range is free.
    private static func kernelPickedPort() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(descriptor, pointer, length) == 0 && getsockname(descriptor, pointer, &length) == 0
            }
        }
        return bound ? Int(UInt16(bigEndian: address.sin_port)) : 0
    }

    /// A directory with a JWT secret and an admin token, for `METRICSD_JWT_SECRET_FILE` / `…_ADMIN_TOKEN_FILE`.
    package static let secrets: (directory: String, jwtSecret: String, adminToken: String) = {
        let directory = NSTemporaryDirectory() + "metricsd-test-secrets-\(getpid())"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let secret = "test-jwt-secret-0123456789-abcdefghijklmnopqrstuvwxyz"
        let admin = "test-admin-token-0123456789"
        // 0600, as a secret file should be (the daemon warns about one that every local user can read).
        for (name, text) in [("jwt-secret", secret), ("admin-token", admin)] {
            let written = FileManager.default.createFile(
                atPath: directory + "/" + name, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600])
            precondition(written, "cannot write \(directory)/\(name)")
        }
        return (directory, secret, admin)
    }()

    /// The environment of a daemon against `databaseURL` on `port`, with test secrets and fast ticks.
    package static func environment(databaseURL: String, port: Int, extra: [String: String] = [:]) -> [String: String] {
        var environment: [String: String] = [
            "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            "DATABASE_URL": databaseURL,
            "METRICSD_LISTEN": "127.0.0.1:\(port)",
            "METRICSD_JWT_SECRET_FILE": Self.secrets.directory + "/jwt-secret",
            "METRICSD_ADMIN_TOKEN_FILE": Self.secrets.directory + "/admin-token",
            "METRICSD_LOG_FORMAT": "text",
            "METRICSD_LOG_LEVEL": "info",
            "METRICSD_TICK_SECONDS": "0.5",
            "METRICSD_IDLE_POLL_SECONDS": "0.2",
            // Exactly these settings: never the host's /etc/metricsd/metricsd.env or /etc/credstore.
            "METRICSD_ENV_FILE": "-/nonexistent/metricsd.env",
            "METRICSD_CREDSTORE": "/nonexistent",
        ]
        environment.merge(extra) { $1 }
        return environment
    }

    /// The fault-injecting build beside the daemon (`metricsd-faults`, never shipped), which takes its faults from
    /// `METRICSD_FAULTS` (e.g. `batch-delay-ms=60`, `stall-scheduler-after=3`) and sets them as the daemon's test
    /// seams.
    package static func faultInjectingBinary() throws -> String {
        let path = URL(fileURLWithPath: try Self.binary()).deletingLastPathComponent().appendingPathComponent(
            "metricsd-faults"
        ).path
        try #require(
            FileManager.default.isExecutableFile(atPath: path),
            "build the tests first: swift build --build-tests (scripts/test does)")
        return path
    }

    /// Starts `metricsd <arguments>` with exactly `environment` (nothing inherited); with `METRICSD_FAULTS` in
    /// it, the fault-injecting build. `launcher` runs it through a program that then executes it (the same
    /// process), e.g. `["/usr/bin/prlimit", "--nofile=200:200", "--"]`.
    package init(arguments: [String] = ["serve"], environment: [String: String], port: Int = 0, launcher: [String] = [])
        throws
    {
        let process = Process()
        let binary = environment["METRICSD_FAULTS"] == nil ? try Self.binary() : try Self.faultInjectingBinary()
        if let program = launcher.first {
            process.executableURL = URL(fileURLWithPath: program)
            process.arguments = Array(launcher.dropFirst()) + [binary] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: binary)
            process.arguments = arguments
        }
        process.environment = environment
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        let output = OutputBuffer()
        pipe.fileHandleForReading.readabilityHandler = { handle in
            let data = handle.availableData
            if !data.isEmpty { output.append(String(decoding: data, as: UTF8.self)) }
        }
        self.process = process
        self.output = output
        self.outputPipe = pipe
        self.port = port
        try process.run()
    }

    deinit {
        if self.process.isRunning { kill(self.process.processIdentifier, SIGKILL) }
        self.outputPipe.fileHandleForReading.readabilityHandler = nil
    }

    package var pid: Int32 { self.process.processIdentifier }

    /// Everything the process wrote to stdout and stderr so far.
    package var log: String { self.output.text }

    package func signal(_ signal: Int32) { kill(self.process.processIdentifier, signal) }

    /// Waits for the process to exit; its status, or nil on timeout.
    package func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while self.process.isRunning {
            if ContinuousClock.now > deadline { return nil }
            try? await Task.sleep(for: .milliseconds(20))
        }
        try? await Task.sleep(for: .milliseconds(50))  // let the last output arrive
        return self.process.terminationStatus
    }

    /// Waits until `condition` holds, polling every 50 ms; false on timeout.
    package static func eventually(timeout: Duration = .seconds(30), _ condition: () async throws -> Bool)
        async rethrows -> Bool
    {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if try await condition() { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return try await condition()
    }

    /// Waits until `GET /readyz` answers 200.
    package func waitUntilReady(timeout: Duration = .seconds(60)) async throws {
        let ready = await Self.eventually(timeout: timeout) {
            guard self.process.isRunning else { return false }
            return (try? await self.request("/readyz").status.code) == 200
        }
        try #require(ready, "metricsd did not become ready; its output:\n\(self.log.suffix(3000))")
    }

    /// One real HTTP request to the daemon.
    package func request(
        _ path: String, method: HTTPRequest.Method = .get, headers: HTTPFields = [:], body: String? = nil
    ) async throws -> TestClient.Response {
        try await HTTP.request(port: self.port, path, method: method, headers: headers, body: body)
    }
}

/// Real HTTP requests over TCP (Hummingbird's test client).
package enum HTTP {
    package static func request(
        port: Int, _ path: String, method: HTTPRequest.Method = .get, headers: HTTPFields = [:], body: String? = nil
    ) async throws -> TestClient.Response {
        try await TestClient.withClient(host: "127.0.0.1", port: port, configuration: .init(timeout: .seconds(20))) {
            client in
            try await client.execute(
                .init(path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) }))
        }
    }
}

extension TestClient.Response {
    package var text: String { self.body.map { String(buffer: $0) } ?? "" }

    /// The body as a JSON object.
    package func json() throws -> [String: Any] {
        let object = try JSONSerialization.jsonObject(with: Data(self.text.utf8))
        return try #require(object as? [String: Any], "not a JSON object: \(self.text)")
    }
}

/// Test JWTs, minted like the GTSD API does (HS256, `sub` as a string).
package enum TestTokens {
    package static func user(
        _ id: Int64, secret: String = DaemonProcess.secrets.jwtSecret, expiresIn: Int = 3600,
        extra: [String: Any] = [:], header: [String: Any] = ["alg": "HS256", "typ": "JWT"]
    ) -> String {
        var claims: [String: Any] = ["sub": String(id), "exp": Int(Date().timeIntervalSince1970) + expiresIn]
        claims.merge(extra) { $1 }
        return self.sign(header: header, claims: claims, secret: secret)
    }

    package static func sign(header: [String: Any], claims: [String: Any], secret: String) -> String {
        let headerPart = Self.base64URL(try! JSONSerialization.data(withJSONObject: header, options: [.sortedKeys]))
        let claimsPart = Self.base64URL(try! JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys]))
        let input = headerPart + "." + claimsPart
        guard (header["alg"] as? String) == "HS256" else { return input + "." }
        return input + "."
            + Self.base64URL(
                Data(
                    HMAC<SHA256>.authenticationCode(
                        for: Array(input.utf8), using: SymmetricKey(data: Array(secret.utf8)))))
    }

    package static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    package static func bearer(_ token: String) -> HTTPFields {
        [.authorization: "Bearer \(token)"]
    }
}

/// Text collected from a child's output.
package final class OutputBuffer: Sendable {
    private let storage = Mutex("")
    package func append(_ text: String) { self.storage.withLock { $0 += text } }
    package var text: String { self.storage.withLock { $0 } }
}
