import Glibc

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Verifies user JWTs with pinned algorithms: HS256 against the shared secret, the public key's own algorithm
/// against the public key, and nothing else (`none`, or HS256 signed with the public key, are refused before any
/// signature check).
///
/// Parsing and claim checks are done here, on plain values; libcrypto provides the keys and signature maths
/// (`LibCrypto.swift` says why not swift-crypto). jwt-kit, which the tests use to mint tokens, is not linked into
/// metricsd: it would bring swift-certificates' X.509 code for nothing, 2 MB of the binary.
public struct TokenVerifier: Sendable {
    /// HS256's HMAC, already keyed.
    private let keyedHMAC: KeyedHMACSHA256?
    /// The public key, verifying its own algorithm only.
    private let publicKey: PublicKeyPEM?
    private let issuer: String?
    private let audience: String?
    private let leeway: Int64

    /// Checks that `pem` is a public key this verifier accepts (start-up and reload fail with one clear line).
    public static func checkPublicKey(_ pem: String) throws(TokenKeyError) {
        _ = try PublicKeyPEM(pem)
    }

    /// The algorithms accepted, e.g. `["EdDSA", "HS256"]`.
    public var acceptedAlgorithms: [String] {
        ((self.keyedHMAC == nil ? [] : ["HS256"]) + [self.publicKey?.algorithm].compactMap { $0 }).sorted()
    }

    public init(_ configuration: TokenConfiguration) throws(TokenKeyError) {
        if let secret = configuration.hmacSecret {
            guard let keyed = KeyedHMACSHA256(key: Array(secret.utf8)) else {
                throw TokenKeyError.unusableSecret(
                    "the JWT secret could not be used as an HMAC-SHA-256 key (libcrypto refused it)")
            }
            self.keyedHMAC = keyed
        } else {
            self.keyedHMAC = nil
        }
        self.publicKey = try configuration.publicKeyPEM.map { pem throws(TokenKeyError) in try PublicKeyPEM(pem) }
        guard self.keyedHMAC != nil || self.publicKey != nil else {
            throw TokenKeyError.noKey(
                "no JWT verification key: set $CREDENTIALS_DIRECTORY/jwt-secret, METRICSD_JWT_SECRET_FILE, METRICSD_JWT_SECRET or METRICSD_JWT_PUBLIC_KEY_FILE"
            )
        }
        self.issuer = configuration.issuer
        self.audience = configuration.audience
        self.leeway = Int64(configuration.leewaySeconds)
    }

    /// Whether ``verify(_:now:)`` answers `token` within a few microseconds, so that it may run on an event loop:
    /// the usual header of an HS256 token (one MAC), or of an algorithm not accepted, and anything that is not
    /// three parts (refused at once). An accepted asymmetric algorithm's signature (tens to hundreds of
    /// microseconds) and an unusual header (decoded as JSON) are not.
    public func checksQuickly(_ token: Substring) -> Bool {
        guard let parts = Self.threeParts(token), token.utf8.count <= 8192 else { return true }
        guard let alg = Self.commonHeader(parts.header) else { return false }
        return alg == "HS256" || self.publicKey?.algorithm != alg
    }

    /// Verifies a compact JWS and returns its user id (`sub`).
    /// - Parameter now: seconds since 1970 (tests pass their own).
    public func verify(_ token: Substring, now: Int64 = Int64(Date().timeIntervalSince1970)) throws(TokenError) -> Int64
    {
        let parts = Self.threeParts(token)
        guard let parts, token.utf8.count <= 8192 else { throw TokenError(.malformed, "malformed token") }
        let alg = try Self.algorithm(parts.header)
        // The algorithm is pinned to the key: HS256 to the secret, the public key's to the public key.
        let hmac = alg == "HS256" ? self.keyedHMAC : nil
        let publicKey = self.publicKey.flatMap { $0.algorithm == alg ? $0 : nil }
        guard hmac != nil || publicKey != nil else {
            throw TokenError(.algorithmNotAccepted, "token algorithm \(Self.shown(alg)) is not accepted")
        }
        guard let payloadData = Base64URL.decode(parts.payload), let signature = Base64URL.decode(parts.signature)
        else { throw TokenError(.malformed, "malformed token") }
        let signed = parts.header.utf8.count + 1 + parts.payload.utf8.count
        let valid: Bool
        if let hmac {
            valid =
                token.utf8.withContiguousStorageIfAvailable {
                    hmac.authenticates(
                        UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: $0[0..<signed])), signature: signature)
                }
                ?? Array(token.utf8.prefix(signed)).withUnsafeBytes { hmac.authenticates($0, signature: signature) }
        } else if let publicKey {
            valid = publicKey.isValidSignature(signature, signing: Array(token.utf8.prefix(signed)))
        } else {
            valid = false
        }
        guard valid else { throw TokenError(.badSignature, "invalid token signature") }
        return try self.userID(Self.claims(payloadData), now: now)
    }

    /// The header's `alg`: the usual header compared as text, any other decoded (a name given twice or a `crit`
    /// refuses the token).
    private static func algorithm(_ header: Substring) throws(TokenError) -> String {
        if let known = Self.commonHeader(header) {
            return known  // the usual header, character for character: nothing to decode
        }
        guard let headerData = Base64URL.decode(header) else {
            throw TokenError(.malformed, "malformed token")
        }
        // RFC 7515 §4: a header that names a parameter twice is refused (a decoder would keep one of them).
        guard JSONObjectNames.hasDuplicates(headerData) == false,
            let fields = try? Self.decoder.decode(JWTHeaderFields.self, from: Data(headerData))
        else {
            throw TokenError(.malformedHeader, "malformed token header")
        }
        guard fields.crit == nil else { throw TokenError(.criticalHeader, "unsupported critical header") }
        return fields.alg
    }

    /// The claims set of a payload whose signature holds: read plainly when it is a plain one, else decoded.
    ///
    /// RFC 7519 §4: claim names must be unique; a claims set that repeats one (`{"sub":"5","sub":"6"}`) is
    /// refused, whichever reader would have read it.
    private static func claims(_ payloadData: [UInt8]) throws(TokenError) -> JWTClaims {
        switch JWTClaims.read(payloadData) {
        case .claims(let plain): return plain
        case .duplicateName: throw TokenError(.repeatedClaim, "token repeats a claim name")
        case .notPlain:
            guard let names = JSONObjectNames.hasDuplicates(payloadData) else {
                throw TokenError(.malformedPayload, "malformed token payload")
            }
            guard !names else { throw TokenError(.repeatedClaim, "token repeats a claim name") }
            guard var decoded = try? Self.decoder.decode(JWTClaims.self, from: Data(payloadData)) else {
                throw TokenError(.malformedPayload, "malformed token payload")
            }
            // The decoder reads every number as a Double (`1.0000000000000001` would be user 1, `1e3` user 1000): a
            // numeric subject counts only when written as an integer literal, digits without fraction or exponent.
            if let literal = JSONObjectNames.literal(of: "sub", in: payloadData), !Self.isIntegerLiteral(literal) {
                decoded.sub = .other
            }
            return decoded
        }
    }

    /// The user id (`sub`) of claims that hold at `now`: an expiry, not before, the issuer and audience
    /// configured.
    private func userID(_ claims: JWTClaims, now: Int64) throws(TokenError) -> Int64 {
        guard let exp = claims.exp?.seconds else { throw TokenError(.noExpiry, "token has no valid exp claim") }
        guard now <= exp + self.leeway else { throw TokenError(.expired, "token expired") }
        if let nbfValue = claims.nbf {
            guard let nbf = nbfValue.seconds else { throw TokenError(.badNotBefore, "token nbf claim is not a time") }
            guard now + self.leeway >= nbf else { throw TokenError(.notYetValid, "token is not valid yet") }
        }
        if let issuer = self.issuer {
            guard claims.iss?.string == issuer else {
                throw TokenError(.issuerNotAccepted, "token issuer is not accepted")
            }
        }
        if let audience = self.audience {
            guard claims.aud?.values.contains(audience) == true else {
                throw TokenError(.audienceNotAccepted, "token audience is not accepted")
            }
        }
        guard let userID = claims.sub?.userID else {
            throw TokenError(.subjectNotUserID, "token subject is not a user id")
        }
        return userID
    }

    /// Digits only, no leading zero (a JSON integer without sign, fraction or exponent).
    static func isIntegerLiteral(_ text: ArraySlice<UInt8>) -> Bool {
        guard let first = text.first, first != 0x30 || text.count == 1 else { return false }
        return text.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
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
                let base64URL = base64.replacing("+", with: "-").replacing("/", with: "_")
                    .replacing("=", with: "")
                headers.append((Array(base64URL.utf8), alg))
            }
        }
        return headers
    }()

    /// The algorithm of one of the common headers, compared as encoded text (no decoding, no allocation).
    static func commonHeader(_ encoded: Substring) -> String? {
        let found = encoded.utf8.withContiguousStorageIfAvailable { bytes -> String? in
            for header in Self.commonHeaders where header.bytes.count == bytes.count {
                if header.bytes.withUnsafeBufferPointer({
                    memcmp($0.baseAddress!, bytes.baseAddress!, bytes.count) == 0
                }) {
                    return header.alg
                }
            }
            return nil
        }
        if let found { return found }
        return Self.commonHeaders.first { $0.bytes.elementsEqual(encoded.utf8) }?.alg
    }

    private static func shown(_ text: String) -> String {
        "'" + String(text.prefix(20).unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7f }.map(Character.init))
            + "'"
    }
}
