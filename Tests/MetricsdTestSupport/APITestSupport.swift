import Crypto
import Foundation
import HTTPTypes
import HealthMetrics
import Hummingbird
import HummingbirdTesting
import JWTKit
import Logging
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdWork
import NIOCore
import Synchronization
import Testing

// Support for the HTTP API suites (LatestMetricsHTTPTests, AcknowledgementTests, TokenTests, HostileInputTests):
// the API served in-process over a real socket, strict JSON, error-body checks, JWT signing for every accepted
// algorithm, and a raw TCP connection for slow-client tests.

// MARK: Serving the API in-process

/// The daemon's own HTTP server (`buildHTTPServer`: the one request path of every endpoint) on a real TCP port.
package enum APIServer {
    package static var jwtSecret: String { DaemonProcess.secrets.jwtSecret }
    package static var adminToken: String { DaemonProcess.secrets.adminToken }

    /// Logs nothing (tests that look at logs pass a `CapturingLogHandler`).
    package static var quietLogger: Logger { Logger(label: "api-test") { _ in SwiftLogNoOpLogHandler() } }

    /// Serves the API with `store` until `body` returns; `body` gets the port.
    /// - Parameter requestLog: which requests the request log writes to `logger` (default: none).
    package static func run<T: Sendable>(
        store: any MetricsStore, jobs: RecomputeJobs? = nil, formula: MetricsFormula = .current,
        tokens: TokenConfiguration = TokenConfiguration(hmacSecret: APIServer.jwtSecret),
        adminToken: String? = APIServer.adminToken, logger: Logger = APIServer.quietLogger,
        requestLog: RequestLogMode = .off, _ body: @escaping @Sendable (Int) async throws -> T
    ) async throws -> T {
        let verifier = try TokenVerifier(tokens)
        let credentials = CredentialBox(.init(tokens: verifier, admin: adminToken.map { AdminTokenCheck(token: $0) }))
        let dependencies = HTTPDependencies(
            store: store, jobs: jobs, credentials: credentials, formula: formula, prometheus: nil,
            maxInFlight: SettingsCatalog.integerDefault("METRICSD_MAX_IN_FLIGHT"),
            requestLog: RequestLog(mode: requestLog, logger: logger))
        let bound = AsyncStream<Int>.makeStream()
        let server = buildAPIServer(
            dependencies, sockets: [.bind(ListenAddress(host: "127.0.0.1", port: 0))], requestTimeout: .seconds(10),
            idleTimeout: .seconds(60),
            onServerRunning: { channels in
                bound.continuation.yield(channels.first?.localAddress?.port ?? 0)
                bound.continuation.finish()
            },
            logger: logger)
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                try await server.run()
                return nil
            }
            if let store = store as? PostgresStore {  // its batched reads are a service, as in the daemon
                group.addTask {
                    await store.readBatches.run()
                    return nil
                }
            }
            var ports = bound.stream.makeAsyncIterator()
            let port = try #require(await ports.next(), "the test server did not start")
            let result: Result<T, any Error>
            do {
                result = .success(try await body(port))
            } catch {
                result = .failure(error)
            }
            try await server.shutdownGracefully()
            group.cancelAll()
            for try await _ in group {}
            return try result.get()
        }
    }

    /// Serves the API over `database` (a `PostgresStore` and, when `admin`, recompute jobs).
    package static func run<T: Sendable>(
        database: TestDatabase, formula: MetricsFormula = .current,
        tokens: TokenConfiguration = TokenConfiguration(hmacSecret: APIServer.jwtSecret), admin: Bool = true,
        logger: Logger = APIServer.quietLogger, _ body: @escaping @Sendable (Int) async throws -> T
    ) async throws -> T {
        let store = PostgresStore(pool: database.pool, formula: formula, logger: database.logger)
        return try await Self.run(
            store: store, jobs: admin ? RecomputeJobs(pool: database.pool) : nil, formula: formula, tokens: tokens,
            adminToken: admin ? Self.adminToken : nil, logger: logger, body)
    }
}

// MARK: Requests and replies

/// One HTTP response, read whole.
package struct APIReply: Sendable, CustomStringConvertible {
    package let status: Int
    package let headers: HTTPFields
    package let text: String

    /// The body parsed strictly; nil when it is not JSON.
    package var json: JSONValue? { try? JSONDecoder().decode(JSONValue.self, from: Data(self.text.utf8)) }

    package var requestID: String? { self.headers[HTTPField.Name("X-Request-Id")!] }

    package var description: String { "\(self.status) \(self.text.prefix(500))" }
}

package enum API {
    /// One request on a new connection to `127.0.0.1:port` (Hummingbird's test client: real HTTP/1.1 over TCP).
    package static func send(
        port: Int, _ path: String, method: HTTPRequest.Method = .get, headers: HTTPFields = [:], body: ByteBuffer? = nil
    ) async throws -> APIReply {
        let response = try await TestClient.withClient(
            host: "127.0.0.1", port: port, configuration: .init(timeout: .seconds(20))
        ) { client in
            try await client.execute(.init(path, method: method, headers: headers, body: body))
        }
        return APIReply(
            status: Int(response.status.code), headers: response.headers,
            text: response.body.map { String(decoding: $0.readableBytesView, as: UTF8.self) } ?? "")
    }

    package static func send(
        port: Int, _ path: String, method: HTTPRequest.Method = .get, headers: HTTPFields = [:], text: String
    ) async throws -> APIReply {
        try await self.send(port: port, path, method: method, headers: headers, body: ByteBuffer(string: text))
    }

    /// `GET /v1/profile/metrics/today` as user `userID` (a valid HS256 token).
    package static func today(port: Int, user userID: Int64) async throws -> APIReply {
        try await self.send(
            port: port, "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(userID)))
    }

    /// `POST /v1/profile/metrics/acknowledge` as user `userID` with a raw body.
    package static func acknowledge(port: Int, user userID: Int64, body: String) async throws -> APIReply {
        try await self.send(
            port: port, "/v1/profile/metrics/acknowledge", method: .post,
            headers: TestTokens.bearer(TestTokens.user(userID)).merging([.contentType: "application/json"]), text: body)
    }

    /// Acknowledges `version` / `computedAt`.
    package static func acknowledge(port: Int, user userID: Int64, version: Int, computedAt: String) async throws
        -> APIReply
    {
        try await self.acknowledge(
            port: port, user: userID, body: #"{"version":\#(version),"metricsComputedAt":"\#(computedAt)"}"#)
    }
}

extension HTTPFields {
    package func merging(_ other: HTTPFields) -> HTTPFields {
        var fields = self
        for field in other { fields[field.name] = field.value }
        return fields
    }
}

// MARK: Strict JSON

/// A JSON value told apart strictly: a boolean is never a number, an integer is a number with no fraction.
package enum JSONValue: Decodable, Equatable, Sendable, CustomStringConvertible {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    package subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    package var keys: Set<String>? {
        if case .object(let object) = self { return Set(object.keys) }
        return nil
    }

    package var string: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    package var number: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    /// An integer-valued number.
    package var int: Int64? {
        guard case .number(let value) = self, value == value.rounded(), abs(value) < 9e15 else { return nil }
        return Int64(value)
    }

    package var bool: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    package var isNull: Bool { self == .null }

    package var description: String {
        switch self {
        case .null: "null"
        case .bool(let value): "\(value)"
        case .number(let value): "\(value)"
        case .string(let value): "\"\(value)\""
        case .array(let values): "[" + values.map(\.description).joined(separator: ",") + "]"
        case .object(let object):
            "{" + object.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ",") + "}"
        }
    }
}

/// `2025-10-29T14:30:45.123Z`: ISO 8601 UTC with exactly three fractional digits
/// (`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`).
package func isISOMilliseconds(_ text: String?) -> Bool {
    guard let text else { return false }
    return text.wholeMatch(of: #/\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z/#) != nil
}

// MARK: Error bodies

/// Checks the API's error body (`{"error": "message", "statusCode": N, "code": "…"}`, exactly those keys), its
/// code (`code`, or one of `codes`; with neither, any code the API has), the JSON content type, an `X-Request-Id`,
/// and that nothing leaks (SQL, stack, file path, secret). Returns the message.
@discardableResult
package func expectErrorBody(
    _ reply: APIReply, status: Int, code: AppError.Code? = nil, codes: [AppError.Code] = [],
    contains fragments: [String] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) -> String {
    #expect(reply.status == status, "expected \(status), got \(reply)", sourceLocation: sourceLocation)
    #expect(
        reply.headers[.contentType]?.hasPrefix("application/json") == true, "content type of \(reply)",
        sourceLocation: sourceLocation)
    #expect(reply.requestID?.isEmpty == false, "no X-Request-Id on \(reply)", sourceLocation: sourceLocation)
    let json = reply.json
    #expect(
        json?.keys == ["error", "statusCode", "code"], "not an error body: \(reply)", sourceLocation: sourceLocation)
    #expect(json?["statusCode"]?.int == Int64(status), "statusCode of \(reply)", sourceLocation: sourceLocation)
    let found = AppError.Code(rawValue: json?["code"]?.string ?? "")
    let expected = code.map { [$0] } ?? (codes.isEmpty ? APIErrorCodes.all : codes)
    #expect(
        expected.contains(found), "code \(found) of \(reply), expected one of \(expected)",
        sourceLocation: sourceLocation)
    let message = json?["error"]?.string ?? ""
    #expect(!message.isEmpty, "empty error message: \(reply)", sourceLocation: sourceLocation)
    for fragment in fragments {
        #expect(message.contains(fragment), "\(reply) does not say \"\(fragment)\"", sourceLocation: sourceLocation)
    }
    expectNoLeak(reply, sourceLocation: sourceLocation)
    return message
}

/// Every code the API's error bodies carry.
package enum APIErrorCodes {
    package static let all = AppError.Code.httpCodes + AppError.Code.endpointCodes
}

/// Nothing in a response body that a client must never see: SQL, a stack trace, a source or file path, a secret.
package func expectNoLeak(_ reply: APIReply, secrets: [String] = [], sourceLocation: SourceLocation = #_sourceLocation)
{
    let forbidden =
        [
            "SELECT ", "INSERT INTO", "UPDATE profile", "UPDATE user", "DELETE FROM", " WHERE ", "SQLSTATE",
            "syntax error", "profile_metrics", "user_settings",
            "metrics_acknowledgements", "postgres", "libpq", ".swift", "/work/", "/usr/", "/tmp/", "/home/",
            "Fatal error",
            "Stack", "backtrace", "0x0000", "PostgresError", "DecodingError", "Swift.", "HTTPError",
            APIServer.jwtSecret, APIServer.adminToken,
        ] + secrets
    for word in forbidden where reply.text.localizedCaseInsensitiveContains(word) {
        Issue.record("response body leaks \"\(word)\": \(reply)", sourceLocation: sourceLocation)
    }
}

// MARK: Tokens for every accepted algorithm

/// JWTs signed by any jwt-kit algorithm, with arbitrary header and claims.
package enum SignedTokens {
    package static func sign(header: [String: Any], claims: [String: Any], with algorithm: any JWTAlgorithm) throws
        -> String
    {
        let input = Self.signingInput(header: header, claims: claims)
        return input + "." + TestTokens.base64URL(Data(try algorithm.sign(Array(input.utf8))))
    }

    package static func signingInput(header: [String: Any], claims: [String: Any]) -> String {
        let headerPart = TestTokens.base64URL(
            try! JSONSerialization.data(withJSONObject: header, options: [.sortedKeys]))
        let claimsPart = TestTokens.base64URL(
            try! JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys]))
        return headerPart + "." + claimsPart
    }

    /// HS256 with an arbitrary key (bytes), e.g. a public key's PEM (the HS/RS confusion attack).
    package static func hs256(
        claims: [String: Any], key: [UInt8], header: [String: Any] = ["alg": "HS256", "typ": "JWT"]
    )
        -> String
    {
        let input = Self.signingInput(header: header, claims: claims)
        let mac = HMAC<SHA256>.authenticationCode(for: Array(input.utf8), using: SymmetricKey(data: key))
        return input + "." + TestTokens.base64URL(Data(mac))
    }

    /// Claims of a valid user token for `sub`, expiring in an hour.
    package static func claims(sub: Any?, extra: [String: Any] = [:]) -> [String: Any] {
        var claims: [String: Any] = ["exp": Int(Date().timeIntervalSince1970) + 3600]
        if let sub { claims["sub"] = sub }
        claims.merge(extra) { $1 }
        return claims
    }

    package static var now: Int { Int(Date().timeIntervalSince1970) }
}

/// A fixed 2048-bit RSA key pair for RS256 tests (generated once with `openssl genpkey -algorithm RSA`; test use
/// only, never a real credential). swift-crypto has no portable RSA key generation, so the key is committed here.
package enum RSATestKey {
    package static let privatePEM = """
        -----BEGIN PRIVATE KEY-----
        MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQDXLnMhSkPLoo6x
        v1hICsFWkMAjqJfzpeElT/RnbJBurfco5kY2Etyq9Kwmfx7ye4kH3TP8xgcWUer5
        eIydXfbIkCLFPZXn1o7hFcs6hdnjhYJGwxXX3Ip0h0nUxsykE8xhjrppNNOFUrDL
        LLdUimMkaNDaJgETZknKs/EpspoPIb1t45xSMdFNOc6NNo3ZMViXUPo7zUn+M6tO
        c8WyT3ZNxgwxZpIeRpHo6/LK5gp/1ao35MwGLTK9ZSXx6qM2z1ySfB794oYub71H
        K6Ll/lt2eKntYoFICWKbiBovhs7f+TLHLqxmxsjiUG3/A21yFnBSMYxUKHXcX9cg
        7490IvjTAgMBAAECggEAU6N84aAtqN23DDTdOidgDec2n8WcxnogALJKw9aJb1PU
        QYP8H3GGbzaqIU6A92x4D2P2HJbWU2Ek7bHjKhnHXh7UPQlalqIpqCih9U3oqsyO
        njWe7GgPMwsQ8hERoucFJphlMZZ0bxp8mIR5f/VIYvMQ1vI1sdYs8Yquvu/qfN2A
        biqYjBS1bg78XZcR95zPOkID/l7RrmUAL8Tg9hyXajisStJwC5Dtxy/mvqTik3Wh
        pdmYgIaAuMQyYZD3U/EZFKOVDPRkAtKxXFoZcm+3IWUERh4IiOW5fBAi+A015Lyy
        2fw3h7uLgLJ16wqLY6nqORocKqnX6IlAtV7tjywufQKBgQDxVLY2NTSKOVCiqtL7
        /SjevHUMcJrvuOm8rGaLM/NEoZyoy5zHCF3TMYTt5JmWSNz1viIuiKbk9xGvEufp
        cZ6GRVVVaK6Q1st9tmTyF6FnHe38UvCkECXGccYewxsoj2oy3pTi0CdSlulu4ho0
        c0J1qrsGdREv0vXpm7CZ7jrn/wKBgQDkQtU53iqXaX1TAw0NOi+CrtBjrCABpo7A
        XJZ4J0Okd3SR07v3X9hClPSVmBnXd3uzgtPcpW0/XaZME7j/Vb7t1IyHPVgq6jlQ
        JFnLaD3qWbIpW8Wi9g0Z6V+V6PbRYg3bCNgpFz4iQHf6s3xGZQFBBESrPQUbrHPr
        dDxKpc/PLQKBgQC2qOuRdAvkYyVJOgqfeCorDHF7jO94anlfuQ2UZynF1J0ClbqA
        WzDI3T5D4TburQ+xYMv2dK/9tZPI84JdCwZ1kpzYHHekYS98Y0Vch84+gkTTKuPB
        CgfNf+f4+Kvhs0sqXZZLZkmdFWRx7OjwshyneyY76PetPvuqaZDtsYcceQKBgCnJ
        ynuDnsyFdXojDtqjElucYW497sYelffFe46XsZyEegTQfJL3KwJVfsl8RQ7bQvxE
        MUEtz+hP3sgCvFWSfxfPV8LSijehFckEPqQse1lR/nnv4SjKXu+ld+hb9AO1LdAx
        uFEdfjSLFOwCu/evOiGLBH9M9ohwc/BhIUCRRpApAoGBAOK0vSzvCScD4KVq3heR
        30fx3xIvD2UupNmOc7B9SoCg7vaSEq7dN232IznNyopaxMmAaOO2AZPKYiEwKVA+
        0t1U+uYx0xFAcgUbYSx3s1n3TQG0QkNKDPSE0QEVDwKYyNGa+rDrPl/1pnHPaxps
        jdwlq+j+Ho9G0slKtwBsVzN0
        -----END PRIVATE KEY-----
        """

    package static let publicPEM = """
        -----BEGIN PUBLIC KEY-----
        MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA1y5zIUpDy6KOsb9YSArB
        VpDAI6iX86XhJU/0Z2yQbq33KOZGNhLcqvSsJn8e8nuJB90z/MYHFlHq+XiMnV32
        yJAixT2V59aO4RXLOoXZ44WCRsMV19yKdIdJ1MbMpBPMYY66aTTThVKwyyy3VIpj
        JGjQ2iYBE2ZJyrPxKbKaDyG9beOcUjHRTTnOjTaN2TFYl1D6O81J/jOrTnPFsk92
        TcYMMWaSHkaR6OvyyuYKf9WqN+TMBi0yvWUl8eqjNs9cknwe/eKGLm+9Ryui5f5b
        dnip7WKBSAlim4gaL4bO3/kyxy6sZsbI4lBt/wNtchZwUjGMVCh13F/XIO+PdCL4
        0wIDAQAB
        -----END PUBLIC KEY-----
        """

    /// A 1024-bit RSA public key: too small for RS256 (metricsd refuses under 2048 bits).
    package static let smallPublicPEM = """
        -----BEGIN PUBLIC KEY-----
        MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQC+MImLy418aOLTWVRvT+UKuW3m
        CadKphKVOxjKm7TUq9EPJgPS0ZpSOLxhdewg/TrXDQ8C5AzvKaYjL8bPygiV/cQZ
        fOYuuAd0T9bKPyU3qMvvXu4HplN4TtJnkZYUrzVq98hEXcMHQRTM6WeYfnvO0I76
        cclmBgQ1+4mZsW3vJwIDAQAB
        -----END PUBLIC KEY-----
        """
}

/// An asymmetric signing key made in the test, with its public key in PEM form and the jwt-kit signer.
package struct AsymmetricKey: Sendable {
    package let name: String
    package let publicPEM: String
    package let signer: any JWTAlgorithm

    package static func ed25519() async throws -> AsymmetricKey {
        let key = Curve25519.Signing.PrivateKey()
        let signer = try await JWTKeyCollection().add(eddsa: EdDSA.PrivateKey(backing: key)).getKey()
        // SubjectPublicKeyInfo of an Ed25519 key (RFC 8410): a fixed 12-byte DER prefix, then the 32-byte key.
        let der =
            Data([0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00])
            + key.publicKey.rawRepresentation
        let pem = "-----BEGIN PUBLIC KEY-----\n" + der.base64EncodedString() + "\n-----END PUBLIC KEY-----\n"
        return AsymmetricKey(name: "EdDSA", publicPEM: pem, signer: signer)
    }

    package static func p256() async throws -> AsymmetricKey {
        let key = P256.Signing.PrivateKey()
        let signer = try await JWTKeyCollection().add(ecdsa: try ES256PrivateKey(backing: key)).getKey()
        return AsymmetricKey(name: "ES256", publicPEM: key.publicKey.pemRepresentation, signer: signer)
    }

    package static func rsa() async throws -> AsymmetricKey {
        let key = try Insecure.RSA.PrivateKey(pem: RSATestKey.privatePEM)
        let signer = try await JWTKeyCollection().add(rsa: key, digestAlgorithm: .sha256).getKey()
        return AsymmetricKey(name: "RS256", publicPEM: RSATestKey.publicPEM, signer: signer)
    }

    /// A token for `claims` with this key's algorithm.
    package func token(_ claims: [String: Any], header: [String: Any]? = nil) throws -> String {
        try SignedTokens.sign(header: header ?? ["alg": self.name, "typ": "JWT"], claims: claims, with: self.signer)
    }
}

// MARK: Logs

/// A log handler that keeps every record, for tests that check what a request logged.
package struct CapturingLogHandler: LogHandler {
    package struct Record: Sendable {
        package let level: Logger.Level
        package let message: String
        package let metadata: [String: String]
    }

    package final class Store: Sendable {
        private let records = Mutex<[Record]>([])
        package func append(_ record: Record) { self.records.withLock { $0.append(record) } }
        package var all: [Record] { self.records.withLock { $0 } }
    }

    package let store: Store
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level = .trace

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    package func log(event: LogEvent) {
        var merged = self.metadata
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        self.store.append(
            Record(level: event.level, message: "\(event.message)", metadata: merged.mapValues { "\($0)" }))
    }

    package static func logger() -> (Logger, Store) {
        let store = Store()
        return (Logger(label: "api-test") { _ in CapturingLogHandler(store: store) }, store)
    }
}

// MARK: Raw TCP

/// A raw, non-blocking TCP connection, for clients that misbehave on purpose (slow heads, idle sockets).
/// Waiting never blocks a thread: it polls with `Task.sleep`.
package final class RawConnection: @unchecked Sendable {  // used by one task at a time
    package let descriptor: Int32

    package init(port: Int) throws {
        let descriptor = try #require(RawHTTP.connect(port: port), "cannot connect to 127.0.0.1:\(port)")
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        self.descriptor = descriptor
    }

    deinit { close(self.descriptor) }

    /// Sends bytes; false when the peer has closed the connection.
    @discardableResult
    package func send(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                Glibc.send(self.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if sent < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK {
                    usleep(1000)
                    continue
                }
                return false
            }
            offset += sent
        }
        return true
    }

    package enum ReadResult: Equatable {
        case data([UInt8])
        case nothing
        case closed
    }

    /// What is readable now, without waiting.
    package func readNow() -> ReadResult {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let count = buffer.withUnsafeMutableBytes { recv(self.descriptor, $0.baseAddress, $0.count, 0) }
        if count > 0 { return .data(Array(buffer[0..<count])) }
        if count == 0 { return .closed }
        if errno == EAGAIN || errno == EWOULDBLOCK { return .nothing }
        return .closed  // reset
    }

    /// Waits until the peer closes the connection (reading and keeping whatever arrives); the time it took, or
    /// nil if it is still open after `timeout`.
    package func waitForClose(timeout: Duration, received: inout [UInt8]) async -> Duration? {
        let started = ContinuousClock.now
        while ContinuousClock.now - started < timeout {
            switch self.readNow() {
            case .closed: return ContinuousClock.now - started
            case .data(let bytes): received += bytes
            case .nothing: try? await Task.sleep(for: .milliseconds(10))
            }
        }
        return nil
    }

    /// Reads until `received` holds a whole HTTP response with a `Content-Length` body; nil on close or timeout.
    package func readResponse(timeout: Duration = .seconds(10)) async -> String? {
        var received: [UInt8] = []
        let started = ContinuousClock.now
        while ContinuousClock.now - started < timeout {
            switch self.readNow() {
            case .closed: return nil
            case .data(let bytes):
                received += bytes
                let text = String(decoding: received, as: UTF8.self)
                if let headEnd = text.range(of: "\r\n\r\n") {
                    let head = text[..<headEnd.lowerBound].lowercased()
                    let length =
                        head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                        .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) }
                        ?? 0
                    if text[headEnd.upperBound...].utf8.count >= length { return text }
                }
            case .nothing: try? await Task.sleep(for: .milliseconds(10))
            }
        }
        return nil
    }
}

// MARK: Daemon helpers

extension DaemonProcess {
    /// Starts the real binary on a free port against `database` and waits until it is ready.
    package static func start(database: TestDatabase, extra: [String: String] = [:]) async throws -> DaemonProcess {
        let port = Self.freePort()
        let daemon = try DaemonProcess(
            environment: Self.environment(databaseURL: database.url, port: port, extra: extra), port: port)
        try await daemon.waitUntilReady()
        return daemon
    }

    /// Stops the daemon (SIGTERM) and expects a clean exit.
    package func stop(sourceLocation: SourceLocation = #_sourceLocation) async {
        self.signal(SIGTERM)
        let status = await self.waitForExit(timeout: .seconds(20))
        #expect(
            status == 0, "metricsd exit status \(String(describing: status)); output:\n\(self.log.suffix(2000))",
            sourceLocation: sourceLocation)
    }

    /// A request to the daemon, as a `APIReply`.
    package func send(_ path: String, method: HTTPRequest.Method = .get, headers: HTTPFields = [:], body: String? = nil)
        async throws -> APIReply
    {
        try await API.send(
            port: self.port, path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) })
    }
}

/// Writes `contents` to a new file under the test scratch directory and returns its path.
package func scratchFile(_ name: String, _ contents: String) throws -> String {
    let base =
        ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
        ?? NSTemporaryDirectory()
    let directory = base + "/api-tests-\(getpid())-\(UUID().uuidString.prefix(8))"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let path = directory + "/" + name
    try Data(contents.utf8).write(to: URL(fileURLWithPath: path))
    return path
}

extension TestDatabase {
    /// Inserts a metrics row with an explicit `computed_at`.
    package func insertMetrics(
        user: Int64, bmi: String = "24.5", bmr: Int = 1650, tdee: Int = 2475, version: Int = 1, date: String,
        computedAt: String
    ) async throws {
        _ = try await self.pool.withConnection { connection in
            try connection.query(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                VALUES ($1, $2::numeric, $3, $4, $5, $6::date, $7::timestamptz)
                """, [String(user), bmi, String(bmr), String(tdee), String(version), date, computedAt])
        }
    }
}
