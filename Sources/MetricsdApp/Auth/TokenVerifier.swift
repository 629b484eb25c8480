import Crypto
import Foundation
import JWTKit

/// How user tokens are verified (README, "Tokens").
///
/// - HS256 with a shared secret: `$CREDENTIALS_DIRECTORY/jwt-secret`, else `METRICSD_JWT_SECRET_FILE`, else
///   `METRICSD_JWT_SECRET`.
/// - and/or an asymmetric public key (EdDSA, ES256 or RS256), so metricsd can verify tokens without being able to
///   mint them: `$CREDENTIALS_DIRECTORY/jwt-public-key`, else `METRICSD_JWT_PUBLIC_KEY_FILE` (PEM).
/// - `METRICSD_JWT_ISSUER` / `METRICSD_JWT_AUDIENCE`: when set, `iss` must equal it / `aud` must contain it.
/// - `METRICSD_JWT_LEEWAY_SECONDS`: clock leeway for `exp` and `nbf`, default 30.
public struct TokenConfiguration: Sendable {
    public var hmacSecret: String?
    public var publicKeyPEM: String?
    public var issuer: String?
    public var audience: String?
    public var leewaySeconds: Int

    public init(environment: [String: String]) throws(ConfigurationError) {
        self.hmacSecret = try Secrets.read(
            credential: "jwt-secret", file: "METRICSD_JWT_SECRET_FILE", variable: "METRICSD_JWT_SECRET",
            environment: environment)
        self.publicKeyPEM = try Secrets.read(
            credential: "jwt-public-key", file: "METRICSD_JWT_PUBLIC_KEY_FILE", variable: nil, environment: environment)
        let reader = EnvironmentReader(environment)
        self.issuer = reader["METRICSD_JWT_ISSUER"]
        self.audience = reader["METRICSD_JWT_AUDIENCE"]
        self.leewaySeconds = try reader.integer("METRICSD_JWT_LEEWAY_SECONDS")
        if let secret = self.hmacSecret, secret.utf8.count < 32 {
            throw ConfigurationError("the JWT secret must be at least 32 bytes (HS256 needs a 256-bit key)")
        }
        // Checked here, with the rest of the configuration and before logging starts, so that a wrong key file
        // fails start-up (and SIGHUP reloads) with one clear line.
        if let pem = self.publicKeyPEM { _ = try PublicKeyPEM(pem) }
    }

    public init(hmacSecret: String?, publicKeyPEM: String? = nil, issuer: String? = nil, audience: String? = nil, leewaySeconds: Int = 30) {
        self.hmacSecret = hmacSecret
        self.publicKeyPEM = publicKeyPEM
        self.issuer = issuer
        self.audience = audience
        self.leewaySeconds = leewaySeconds
    }
}

/// Why a bearer token was refused. Every case is a 401; the message is safe to return (it never echoes the token).
public struct TokenError: Error, Equatable, Sendable, CustomStringConvertible {
    public let message: String
    init(_ message: String) { self.message = message }
    public var description: String { self.message }
}

/// Verifies user JWTs with pinned algorithms: HS256 against the shared secret, the public key's own algorithm
/// against the public key, and nothing else (`none`, or HS256 signed with the public key, are refused before any
/// signature check).
///
/// Parsing and claim checks are done here, on plain values; jwt-kit provides the keys and signature maths.
public struct TokenVerifier: Sendable {
    private let algorithms: [String: any JWTAlgorithm]
    /// HS256's HMAC, already keyed: each check copies it (copy-on-write state) instead of keying a new one.
    /// Through jwt-kit's generic signer an HS256 check cost about as much as the rest of the request's token
    /// handling together (a new HMAC keyed per token, conversions to and from `Data`); swift-crypto's HMAC is
    /// used directly instead.
    private let keyedHMAC: HMAC<SHA256>?
    private let issuer: String?
    private let audience: String?
    private let leeway: Int64

    /// The algorithms accepted, e.g. `["HS256", "EdDSA"]`.
    public var acceptedAlgorithms: [String] { self.algorithms.keys.sorted() }

    public init(_ configuration: TokenConfiguration) async throws(ConfigurationError) {
        var algorithms: [String: any JWTAlgorithm] = [:]
        if let secret = configuration.hmacSecret {
            let keys = await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
            algorithms["HS256"] = try await Self.key(keys)
        }
        if let pem = configuration.publicKeyPEM {
            let algorithm = try await Self.publicKeyAlgorithm(pem)
            algorithms[algorithm.name] = algorithm
        }
        guard !algorithms.isEmpty else {
            throw ConfigurationError(
                "no JWT verification key: set $CREDENTIALS_DIRECTORY/jwt-secret, METRICSD_JWT_SECRET_FILE, METRICSD_JWT_SECRET or METRICSD_JWT_PUBLIC_KEY_FILE"
            )
        }
        self.algorithms = algorithms
        self.keyedHMAC = configuration.hmacSecret.map { HMAC<SHA256>(key: SymmetricKey(data: Array($0.utf8))) }
        self.issuer = configuration.issuer
        self.audience = configuration.audience
        self.leeway = Int64(configuration.leewaySeconds)
    }

    private static func key(_ keys: JWTKeyCollection) async throws(ConfigurationError) -> any JWTAlgorithm {
        do {
            return try await keys.getKey()
        } catch {
            throw ConfigurationError("JWT key could not be loaded")
        }
    }

    /// The verifier of a PEM public key: Ed25519 (EdDSA), P-256 (ES256) or RSA (RS256, at least 2048 bits).
    private static func publicKeyAlgorithm(_ pem: String) async throws(ConfigurationError) -> any JWTAlgorithm {
        switch try PublicKeyPEM(pem) {
        case .eddsa(let key): return try await Self.key(await JWTKeyCollection().add(eddsa: key))
        case .es256(let key): return try await Self.key(await JWTKeyCollection().add(ecdsa: key))
        case .rs256(let key): return try await Self.key(await JWTKeyCollection().add(rsa: key, digestAlgorithm: .sha256))
        }
    }

    /// Verifies a compact JWS and returns its user id (`sub`).
    /// - Parameter now: seconds since 1970 (tests pass their own).
    public func verify(_ token: Substring, now: Int64 = Int64(Date().timeIntervalSince1970)) throws(TokenError) -> Int64 {
        let parts = Self.threeParts(token)
        guard let parts, token.utf8.count <= 8192 else { throw TokenError("malformed token") }
        let alg: String
        if let known = Self.commonHeader(parts.header) {
            alg = known  // the usual header, character for character: nothing to decode
        } else {
            guard let headerData = Base64URL.decode(parts.header) else { throw TokenError("malformed token") }
            // RFC 7515 §4: a header that names a parameter twice is refused (a decoder would keep one of them).
            guard JSONObjectNames.hasDuplicates(headerData) == false,
                let header = try? Self.decoder.decode(JWTHeaderFields.self, from: Data(headerData))
            else {
                throw TokenError("malformed token header")
            }
            guard header.crit == nil else { throw TokenError("unsupported critical header") }
            alg = header.alg
        }
        guard let algorithm = self.algorithms[alg] else {
            throw TokenError("token algorithm \(Self.shown(alg)) is not accepted")
        }
        guard let payloadData = Base64URL.decode(parts.payload), let signature = Base64URL.decode(parts.signature)
        else { throw TokenError("malformed token") }
        let signed = parts.header.utf8.count + 1 + parts.payload.utf8.count
        let valid: Bool
        if alg == "HS256", var mac = self.keyedHMAC {
            if token.utf8.withContiguousStorageIfAvailable({ mac.update(data: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: $0[0..<signed]))) }) == nil {
                mac.update(data: Array(token.utf8.prefix(signed)))
            }
            valid = Self.constantTimeEqual(mac.finalize(), signature)
        } else {
            valid = (try? algorithm.verify(signature, signs: Array(token.utf8.prefix(signed)))) ?? false
        }
        guard valid else { throw TokenError("invalid token signature") }
        // RFC 7519 §4: claim names must be unique; a claims set that repeats one (`{"sub":"5","sub":"6"}`) is
        // refused, whichever reader would have read it.
        let claims: JWTClaims
        switch JWTClaims.read(payloadData) {
        case .claims(let plain): claims = plain
        case .duplicateName: throw TokenError("token repeats a claim name")
        case .notPlain:
            guard let names = JSONObjectNames.hasDuplicates(payloadData) else { throw TokenError("malformed token payload") }
            guard !names else { throw TokenError("token repeats a claim name") }
            guard let decoded = try? Self.decoder.decode(JWTClaims.self, from: Data(payloadData)) else {
                throw TokenError("malformed token payload")
            }
            claims = decoded
        }
        guard let exp = claims.exp?.seconds else { throw TokenError("token has no valid exp claim") }
        guard now <= exp + self.leeway else { throw TokenError("token expired") }
        if let nbfValue = claims.nbf {
            guard let nbf = nbfValue.seconds else { throw TokenError("token nbf claim is not a time") }
            guard now + self.leeway >= nbf else { throw TokenError("token is not valid yet") }
        }
        if let issuer = self.issuer {
            guard claims.iss?.string == issuer else { throw TokenError("token issuer is not accepted") }
        }
        if let audience = self.audience {
            guard claims.aud?.values.contains(audience) == true else { throw TokenError("token audience is not accepted") }
        }
        guard let userID = claims.sub?.userID else { throw TokenError("token subject is not a user id") }
        return userID
    }

    /// The three dot-separated parts of a compact JWS, or nil when there are not exactly three.
    static func threeParts(_ token: Substring) -> (header: Substring, payload: Substring, signature: Substring)? {
        let utf8 = token.utf8
        guard let first = utf8.firstIndex(of: UInt8(ascii: ".")) else { return nil }
        let afterFirst = utf8.index(after: first)
        guard let second = utf8[afterFirst...].firstIndex(of: UInt8(ascii: ".")) else { return nil }
        let afterSecond = utf8.index(after: second)
        guard !utf8[afterSecond...].contains(UInt8(ascii: ".")) else { return nil }
        return (token[..<first], token[afterFirst..<second], token[afterSecond...])
    }

    /// One decoder for every token (decoding does not change it; `JSONDecoder` is safe to share).
    private static let decoder = JSONDecoder()

    /// The headers token libraries write (compact JSON, `alg` and `typ` in either order, or `alg` alone), base64url
    /// encoded as they appear in tokens, and their algorithm. Any other header is decoded and goes through the
    /// duplicate and `crit` checks.
    private static let commonHeaders: [(bytes: [UInt8], alg: String)] = {
        var headers: [([UInt8], String)] = []
        for alg in ["HS256", "EdDSA", "ES256", "RS256"] {
            for json in [
                #"{"alg":"\#(alg)","typ":"JWT"}"#, #"{"typ":"JWT","alg":"\#(alg)"}"#, #"{"alg":"\#(alg)"}"#,
            ] {
                let base64 = Data(json.utf8).base64EncodedString()
                let base64URL = base64.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                    .replacingOccurrences(of: "=", with: "")
                headers.append((Array(base64URL.utf8), alg))
            }
        }
        return headers
    }()

    /// The algorithm of one of the common headers, compared as encoded text (no decoding, no allocation).
    static func commonHeader(_ encoded: Substring) -> String? {
        let found = encoded.utf8.withContiguousStorageIfAvailable { bytes -> String? in
            for header in Self.commonHeaders where header.bytes.count == bytes.count {
                if header.bytes.withUnsafeBufferPointer({ memcmp($0.baseAddress!, bytes.baseAddress!, bytes.count) == 0 }) {
                    return header.alg
                }
            }
            return nil
        }
        if let found { return found }
        return Self.commonHeaders.first { $0.bytes.elementsEqual(encoded.utf8) }?.alg
    }

    /// Whether a MAC equals the presented signature, in time that depends only on their lengths.
    static func constantTimeEqual(_ mac: HashedAuthenticationCode<SHA256>, _ signature: [UInt8]) -> Bool {
        mac.withUnsafeBytes { computed in
            guard computed.count == signature.count else { return false }
            var difference: UInt8 = 0
            for index in 0..<computed.count { difference |= computed[index] ^ signature[index] }
            return difference == 0
        }
    }

    private static func shown(_ text: String) -> String {
        "'" + String(text.prefix(20).unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7f }.map(Character.init)) + "'"
    }
}

/// A PEM public key metricsd can verify tokens with; parsing it is synchronous, so configuration checks it early.
enum PublicKeyPEM {
    case eddsa(EdDSA.PublicKey)
    case es256(ES256PublicKey)
    case rs256(JWTKit.Insecure.RSA.PublicKey)

    init(_ pem: String) throws(ConfigurationError) {
        if pem.contains("PRIVATE KEY") {
            throw ConfigurationError("the JWT public key file holds a private key: give metricsd only the public key")
        }
        if let key = try? EdDSA.PublicKey(pem: pem) {
            self = .eddsa(key)
        } else if let key = try? ES256PublicKey(pem: pem) {
            self = .es256(key)
        } else {
            do {
                self = .rs256(try Insecure.RSA.PublicKey(pem: pem))
            } catch {
                if Self.looksLikeRSA(pem) {
                    throw ConfigurationError(
                        "the JWT public key is an RSA key metricsd cannot use: RS256 needs an RSA public key of at least 2048 bits (PEM, BEGIN PUBLIC KEY)"
                    )
                }
                throw ConfigurationError("the JWT public key is not an Ed25519, P-256 or RSA public key in PEM form")
            }
        }
    }

    /// Whether a PEM that did not parse is an RSA key (too small, or PKCS#1 rather than SubjectPublicKeyInfo),
    /// for a message that says so: its header says RSA, or its DER holds the rsaEncryption OID 1.2.840.113549.1.1.1.
    private static func looksLikeRSA(_ pem: String) -> Bool {
        if pem.contains("BEGIN RSA PUBLIC KEY") { return true }
        let base64 = pem.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("-----") }.joined()
        guard let der = Data(base64Encoded: base64) else { return false }
        let oid: [UInt8] = [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01]
        let bytes = Array(der)
        guard bytes.count >= oid.count else { return false }
        return (0...(bytes.count - oid.count)).contains { Array(bytes[$0..<($0 + oid.count)]) == oid }
    }
}

/// The JOSE header fields metricsd looks at.
struct JWTHeaderFields: Decodable {
    let alg: String
    let crit: AnyJSON?
}

/// The registered claims metricsd checks; anything else in the payload is ignored.
struct JWTClaims: Decodable, Equatable {
    var sub: JSONScalar?
    var exp: JSONScalar?
    var nbf: JSONScalar?
    var iss: JSONScalar?
    var aud: Audience?

    /// What ``read(_:)`` found.
    enum Reading {
        case claims(JWTClaims)
        /// A member name appears twice: the token is refused.
        case duplicateName
        /// Not a plain claims set: `JSONDecoder` decides (after the duplicate check).
        case notPlain
    }

    /// The claims of the payloads token libraries write, read without `JSONDecoder` (the busiest request): one
    /// flat object whose values are plain strings (no escapes, ASCII) or integers.
    static func read(_ bytes: [UInt8]) -> Reading {
        var duplicate = false
        guard let claims = JWTClaims(compact: bytes, duplicate: &duplicate) else { return duplicate ? .duplicateName : .notPlain }
        return .claims(claims)
    }

    /// The plain claims set, or nil for anything else (arrays, nested objects, escapes, fractions, exponents,
    /// negative numbers, malformed JSON) and for a repeated name (`duplicate` is then set).
    init?(compact bytes: [UInt8]) {
        var duplicate = false
        self.init(compact: bytes, duplicate: &duplicate)
    }

    private init?(compact bytes: [UInt8], duplicate: inout Bool) {
        var index = 0
        let count = bytes.count
        func skipSpace() {
            while index < count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
                index += 1
            }
        }
        /// A plain string at `index` (which is at its opening quote), as its byte range.
        func plainString() -> Range<Int>? {
            index += 1
            let start = index
            while index < count {
                let byte = bytes[index]
                if byte == 0x22 {
                    index += 1
                    return start..<(index - 1)
                }
                guard byte >= 0x20, byte < 0x80, byte != 0x5C else { return nil }
                index += 1
            }
            return nil
        }
        skipSpace()
        guard index < count, bytes[index] == 0x7B else { return nil }
        index += 1
        skipSpace()
        // Names seen so far, as byte ranges (a claims set has a handful: compared byte by byte, no strings).
        var seen: [Range<Int>] = []
        if index < count, bytes[index] == 0x7D {
            index += 1
        } else {
            while true {
                guard index < count, bytes[index] == 0x22, let keyRange = plainString() else { return nil }
                let key = bytes[keyRange]
                guard !seen.contains(where: { bytes[$0].elementsEqual(key) }) else {
                    duplicate = true
                    return nil
                }
                seen.append(keyRange)
                skipSpace()
                guard index < count, bytes[index] == 0x3A else { return nil }
                index += 1
                skipSpace()
                guard index < count else { return nil }
                let value: JSONScalar
                if bytes[index] == 0x22 {
                    guard let range = plainString() else { return nil }
                    // Only the registered claims (three-letter names) are kept: no string for the others.
                    value = key.count == 3 ? .string(String(decoding: bytes[range], as: UTF8.self)) : .other
                } else if bytes[index] >= 0x30, bytes[index] <= 0x39 {
                    let start = index
                    var number: Int64 = 0
                    while index < count, bytes[index] >= 0x30, bytes[index] <= 0x39 {
                        number = number &* 10 &+ Int64(bytes[index] - 0x30)
                        index += 1
                    }
                    let digits = index - start
                    // No leading zeros (invalid JSON), at most 15 digits (exact as a Double), an integer.
                    guard digits <= 15, digits == 1 || bytes[start] != 0x30 else { return nil }
                    if index < count, bytes[index] == 0x2E || bytes[index] == 0x65 || bytes[index] == 0x45 { return nil }
                    value = .number(Double(number))
                } else {
                    return nil
                }
                if key.count == 3 {
                    switch (key[key.startIndex], key[key.startIndex + 1], key[key.startIndex + 2]) {
                    case (0x73, 0x75, 0x62): self.sub = value  // sub
                    case (0x65, 0x78, 0x70): self.exp = value  // exp
                    case (0x6E, 0x62, 0x66): self.nbf = value  // nbf
                    case (0x69, 0x73, 0x73): self.iss = value  // iss
                    case (0x61, 0x75, 0x64):  // aud
                        guard case .string(let audience) = value else { return nil }
                        self.aud = .values([audience])
                    default: break
                    }
                }
                skipSpace()
                guard index < count else { return nil }
                if bytes[index] == 0x2C {
                    index += 1
                    skipSpace()
                    continue
                }
                guard bytes[index] == 0x7D else { return nil }
                index += 1
                break
            }
        }
        skipSpace()
        guard index == count else { return nil }
    }

    /// `aud`: one string or an array of strings.
    enum Audience: Decodable, Equatable {
        case values([String])
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let one = try? container.decode(String.self) {
                self = .values([one])
            } else {
                self = .values((try? container.decode([JSONScalar].self))?.compactMap(\.string) ?? [])
            }
        }
        var values: [String] {
            switch self {
            case .values(let values): values
            }
        }
    }
}

/// One JSON value, told apart strictly: a boolean is never a number and a number never a string.
enum JSONScalar: Decodable, Equatable {
    case string(String)
    case number(Double)
    case bool(Bool)
    case other

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else {
            self = .other
        }
    }

    var string: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// A NumericDate in whole seconds.
    var seconds: Int64? {
        guard case .number(let value) = self, value.isFinite, abs(value) < 1e15 else { return nil }
        return Int64(value.rounded(.down))
    }

    /// A user id: a positive integer sent as a string of digits (the usual form) or as a JSON number.
    var userID: Int64? {
        switch self {
        case .string(let text):
            guard (1...19).contains(text.utf8.count), text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
                text.utf8.first != 48
            else { return nil }
            return Int64(text)
        case .number(let value):
            guard value.isFinite, value >= 1, value <= 9_007_199_254_740_991, value.rounded() == value else { return nil }
            return Int64(value)
        case .bool, .other:
            return nil
        }
    }
}

/// The member names of a JSON object, read without decoding its values: for RFC 7515/7519's rule that a
/// JOSE header or a claims set must not name a member twice (`JSONDecoder` silently keeps one of them).
enum JSONObjectNames {
    /// Whether the top-level object of `bytes` repeats a member name (names compared after unescaping, as
    /// Swift strings, as the decoder would see them). Nil when `bytes` is not one JSON object.
    static func hasDuplicates(_ bytes: [UInt8]) -> Bool? {
        var reader = Reader(bytes: bytes)
        reader.skipSpace()
        guard reader.consume(0x7B) else { return nil }
        var names = Set<String>()
        var duplicate = false
        reader.skipSpace()
        if reader.consume(0x7D) {
            reader.skipSpace()
            return reader.atEnd ? false : nil
        }
        while true {
            reader.skipSpace()
            guard let name = reader.string() else { return nil }
            if !names.insert(name).inserted { duplicate = true }
            reader.skipSpace()
            guard reader.consume(0x3A), reader.skipValue() else { return nil }
            reader.skipSpace()
            if reader.consume(0x2C) { continue }
            guard reader.consume(0x7D) else { return nil }
            break
        }
        reader.skipSpace()
        return reader.atEnd ? duplicate : nil
    }

    private struct Reader {
        let bytes: [UInt8]
        var index = 0
        /// Nesting allowed in values (deeper payloads are not tokens).
        static let maxDepth = 64

        var atEnd: Bool { self.index == self.bytes.count }

        mutating func skipSpace() {
            while self.index < self.bytes.count,
                self.bytes[self.index] == 0x20 || self.bytes[self.index] == 0x0A || self.bytes[self.index] == 0x0D
                    || self.bytes[self.index] == 0x09
            {
                self.index += 1
            }
        }

        mutating func consume(_ byte: UInt8) -> Bool {
            guard self.index < self.bytes.count, self.bytes[self.index] == byte else { return false }
            self.index += 1
            return true
        }

        /// A string at the current position, unescaped; nil when malformed.
        mutating func string() -> String? {
            guard self.consume(0x22) else { return nil }
            var scalars = String.UnicodeScalarView()
            var raw: [UInt8] = []
            func flush() -> Bool {
                guard !raw.isEmpty else { return true }
                guard let text = String(validating: raw, as: UTF8.self) else { return false }
                scalars.append(contentsOf: text.unicodeScalars)
                raw.removeAll(keepingCapacity: true)
                return true
            }
            while self.index < self.bytes.count {
                let byte = self.bytes[self.index]
                self.index += 1
                switch byte {
                case 0x22:
                    guard flush() else { return nil }
                    return String(scalars)
                case 0x5C:
                    guard flush(), self.index < self.bytes.count else { return nil }
                    let escape = self.bytes[self.index]
                    self.index += 1
                    switch escape {
                    case 0x22, 0x5C, 0x2F: scalars.append(Unicode.Scalar(escape))
                    case 0x62: scalars.append("\u{08}")
                    case 0x66: scalars.append("\u{0C}")
                    case 0x6E: scalars.append("\n")
                    case 0x72: scalars.append("\r")
                    case 0x74: scalars.append("\t")
                    case 0x75:
                        guard var unit = self.hex4() else { return nil }
                        if (0xD800..<0xDC00).contains(unit) {
                            // A high surrogate must be followed by an escaped low one.
                            guard self.consume(0x5C), self.consume(0x75), let low = self.hex4(), (0xDC00..<0xE000).contains(low)
                            else { return nil }
                            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let scalar = Unicode.Scalar(unit) else { return nil }
                        scalars.append(scalar)
                    default: return nil
                    }
                default:
                    guard byte >= 0x20 else { return nil }
                    raw.append(byte)
                }
            }
            return nil
        }

        private mutating func hex4() -> UInt32? {
            guard self.index + 4 <= self.bytes.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = self.bytes[self.index]
                self.index += 1
                let digit: UInt32
                switch byte {
                case 0x30...0x39: digit = UInt32(byte - 0x30)
                case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
                case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
                default: return nil
                }
                value = value << 4 | digit
            }
            return value
        }

        /// Skips one value (nested objects and arrays included); false when malformed.
        mutating func skipValue(depth: Int = 0) -> Bool {
            guard depth < Self.maxDepth, self.index < self.bytes.count else { return false }
            switch self.bytes[self.index] {
            case 0x22:
                return self.string() != nil
            case 0x7B, 0x5B:
                let close: UInt8 = self.bytes[self.index] == 0x7B ? 0x7D : 0x5D
                let isObject = close == 0x7D
                self.index += 1
                self.skipSpace()
                if self.consume(close) { return true }
                while true {
                    self.skipSpace()
                    if isObject {
                        guard self.string() != nil else { return false }
                        self.skipSpace()
                        guard self.consume(0x3A) else { return false }
                        self.skipSpace()
                    }
                    guard self.skipValue(depth: depth + 1) else { return false }
                    self.skipSpace()
                    if self.consume(0x2C) { continue }
                    return self.consume(close)
                }
            default:
                // A number or a literal: the decoder judges its form; here it only has to end.
                let start = self.index
                while self.index < self.bytes.count {
                    let byte = self.bytes[self.index]
                    if byte == 0x2C || byte == 0x7D || byte == 0x5D || byte == 0x20 || byte == 0x0A || byte == 0x0D
                        || byte == 0x09
                    {
                        break
                    }
                    self.index += 1
                }
                return self.index > start
            }
        }
    }
}

/// Any JSON value, not looked at (only its presence matters).
struct AnyJSON: Decodable {
    init(from decoder: any Decoder) throws {}
}

/// base64url without padding (RFC 7515), decoded by hand: no intermediate strings on the request path.
enum Base64URL {
    /// The 6-bit value of each ASCII byte of the URL-safe alphabet, 0xFF for anything else (`=` included).
    private static let table: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, byte) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8.enumerated() {
            table[Int(byte)] = UInt8(index)
        }
        return table
    }()

    static func decode(_ text: Substring) -> [UInt8]? {
        let utf8 = text.utf8
        let count = utf8.count
        guard count % 4 != 1 else { return nil }
        var output = [UInt8]()
        output.reserveCapacity(count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for byte in utf8 {
            let value = Self.table[Int(byte)]
            guard value != 0xFF else { return nil }
            accumulator = (accumulator << 6) | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        // Leftover bits must be zero (RFC 4648 §3.5: canonical encoding), as Foundation's decoder requires too.
        guard accumulator & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return output
    }
}

/// Compares a presented admin token with the configured one in constant time (SHA-256 of both, then a
/// byte-wise comparison with no early exit), so response times reveal nothing about the token.
public struct AdminTokenCheck: Sendable {
    private let expected: [UInt8]

    public init(token: String) {
        self.expected = Array(SHA256.hash(data: Array(token.utf8)))
    }

    public func matches(_ presented: Substring) -> Bool {
        let digest = Array(SHA256.hash(data: Array(presented.utf8)))
        var difference: UInt8 = 0
        for index in 0..<self.expected.count { difference |= self.expected[index] ^ digest[index] }
        return difference == 0
    }
}
