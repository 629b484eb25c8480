import Crypto
import Foundation
import HTTPTypes
import HealthMetrics
import JWTKit
import MetricsdCLI
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// Tokens: pinned algorithms (no `none`, no HS/RS confusion), HS256 and EdDSA/ES256/RS256 public keys,
/// `exp`/`nbf` with the clock leeway, `iss`/`aud` when configured, `sub` as a user id, admin and user tokens never
/// interchangeable, and key configuration errors. Over real HTTP against the real database.
@Suite struct TokenTests {
    static let today = "/v1/profile/metrics/today"
    static let user: Int64 = 42

    /// Serves the API with `tokens` over a database holding user 42 with metrics; `body` gets the port.
    static func serve(
        tokens: TokenConfiguration = TokenConfiguration(hmacSecret: APIServer.jwtSecret),
        _ body: @escaping @Sendable (Int) async throws -> Void
    ) async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(Self.user)])
            try await database.insertMetrics(
                user: Self.user, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database, tokens: tokens, body)
        }
    }

    /// The status of `GET …/today` with `token`; a 401 must carry the error body.
    static func status(
        _ port: Int, _ token: String, path: String = TokenTests.today,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Int {
        let reply = try await API.send(port: port, path, headers: TestTokens.bearer(token))
        if reply.status == 401 {
            expectErrorBody(reply, status: 401, sourceLocation: sourceLocation)
            #expect(reply.headers[.wwwAuthenticate] == "Bearer", sourceLocation: sourceLocation)
        }
        return reply.status
    }

    static func expect(
        _ port: Int, _ cases: [(String, String)], status expected: Int,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        for (name, token) in cases {
            let status = try await Self.status(port, token, sourceLocation: sourceLocation)
            #expect(status == expected, "\(name): \(status), expected \(expected)", sourceLocation: sourceLocation)
        }
    }

    static func hs256(_ claims: [String: Any], header: [String: Any] = ["alg": "HS256", "typ": "JWT"]) -> String {
        TestTokens.sign(header: header, claims: claims, secret: APIServer.jwtSecret)
    }

    static var valid: [String: Any] { SignedTokens.claims(sub: String(Self.user)) }

    // MARK: Duplicate names (RFC 7519 §4, RFC 7515 §4)

    /// HS256 over raw header and payload text (a JSON library would not write a repeated name).
    static func raw(header: String = #"{"alg":"HS256","typ":"JWT"}"#, payload: String) -> String {
        let input = TestTokens.base64URL(Data(header.utf8)) + "." + TestTokens.base64URL(Data(payload.utf8))
        let mac = HMAC<SHA256>.authenticationCode(
            for: Array(input.utf8), using: SymmetricKey(data: Array(APIServer.jwtSecret.utf8)))
        return input + "." + TestTokens.base64URL(Data(mac))
    }

    /// A claims set or header that names a member twice is refused, whichever reader would have read it: the
    /// plain reader (flat strings and integers), the decoder (escapes, nested values), the header decoder. The
    /// same token without the repetition is accepted, so the signature and claims are otherwise fine.
    @Test func repeatedClaimOrHeaderNamesAreRefused() async throws {
        let later = SignedTokens.now + 3600
        let earlier = SignedTokens.now - 3600
        let refused: [(String, String, TokenError.Reason)] = [
            ("sub twice", Self.raw(payload: #"{"sub":"42","sub":"6","exp":\#(later)}"#), .repeatedClaim),
            (
                "exp twice, past first", Self.raw(payload: #"{"exp":\#(earlier),"exp":\#(later),"sub":"42"}"#),
                .repeatedClaim
            ),
            (
                "exp twice, future first", Self.raw(payload: #"{"exp":\#(later),"exp":\#(earlier),"sub":"42"}"#),
                .repeatedClaim
            ),
            ("escaped name", Self.raw(payload: #"{"s\u0075b":"42","sub":"6","exp":\#(later)}"#), .repeatedClaim),
            (
                "with a nested claim",
                Self.raw(payload: #"{"sub":"42","ctx":{"a":[1,{"b":2}]},"exp":\#(later),"sub":"6"}"#),
                .repeatedClaim
            ),
            (
                "header alg twice",
                Self.raw(
                    header: #"{"alg":"HS256","typ":"JWT","alg":"none"}"#,
                    payload: #"{"sub":"42","exp":\#(later)}"#), .malformedHeader
            ),
        ]
        let accepted: [(String, String)] = [
            ("plain", Self.raw(payload: #"{"sub":"42","exp":\#(later)}"#)),
            ("escaped name alone", Self.raw(payload: #"{"s\u0075b":"42","exp":\#(later)}"#)),
            (
                "nested names may repeat inside other claims",
                Self.raw(payload: #"{"sub":"42","ctx":{"a":1,"b":{"a":2}},"exp":\#(later)}"#)
            ),
            (
                "uncommon header",
                Self.raw(header: #"{"typ":"JWT","kid":"k1","alg":"HS256"}"#, payload: #"{"sub":"42","exp":\#(later)}"#)
            ),
        ]
        // Directly, and over HTTP.
        let verifier = try TokenVerifier(TokenConfiguration(hmacSecret: APIServer.jwtSecret))
        for (name, token, reason) in refused {
            #expect(throws: TokenError.self, "\(name)") { try verifier.verify(Substring(token)) }
            do {
                _ = try verifier.verify(Substring(token))
            } catch {
                #expect(error.reason == reason, "\(name): \(error.reason) \(error.message)")
            }
        }
        for (name, token) in accepted {
            #expect((try? verifier.verify(Substring(token))) == Self.user, "\(name)")
        }
        try await Self.serve { port in
            try await Self.expect(port, refused.map { ($0.0, $0.1) }, status: 401)
            try await Self.expect(port, accepted, status: 200)
        }
    }

    // MARK: Algorithms

    /// Which checks are made on the event loop: an HS256 MAC and a refusal (malformed, an algorithm not accepted);
    /// an accepted asymmetric signature or a header that must be decoded is checked in the connection's task.
    /// Over HTTP both ways answer alike: 200, or 401 with the reason's code.
    @Test func onlyQuickTokenChecksAreMadeOnTheEventLoop() async throws {
        let hsOnly = try TokenVerifier(TokenConfiguration(hmacSecret: APIServer.jwtSecret))
        for key in [try await AsymmetricKey.ed25519(), try await AsymmetricKey.p256(), try await AsymmetricKey.rsa()] {
            let verifier = try TokenVerifier(
                TokenConfiguration(hmacSecret: APIServer.jwtSecret, publicKeyPEM: key.publicPEM))
            let signed = try key.token(Self.valid)
            #expect(!verifier.checksQuickly(Substring(signed)), "\(key.name)")
            #expect(try verifier.verify(Substring(signed)) == Self.user, "\(key.name)")
            #expect(hsOnly.checksQuickly(Substring(signed)), "\(key.name) not accepted: refused at once")
        }
        #expect(hsOnly.checksQuickly(Substring(Self.hs256(Self.valid))))
        #expect(hsOnly.checksQuickly("not-a-token"))
        #expect(
            !hsOnly.checksQuickly(
                Substring(Self.hs256(Self.valid, header: ["typ": "JWT", "kid": "k1", "alg": "HS256"]))))

        let key = try await AsymmetricKey.p256()
        try await Self.serve(tokens: TokenConfiguration(hmacSecret: APIServer.jwtSecret, publicKeyPEM: key.publicPEM)) {
            port in
            let ok = try await API.send(port: port, Self.today, headers: TestTokens.bearer(try key.token(Self.valid)))
            #expect(ok.status == 200, "\(ok)")
            let expired = try key.token(
                SignedTokens.claims(sub: String(Self.user), extra: ["exp": SignedTokens.now - 3600]))
            let refused = try await API.send(port: port, Self.today, headers: TestTokens.bearer(expired))
            expectErrorBody(refused, status: 401, code: .token(.expired))
            #expect(refused.headers[.wwwAuthenticate] == "Bearer", "\(refused)")
        }
    }

    @Test func algNoneAndUnpinnedAlgorithmsAreRefused() async throws {
        let ed25519 = try await AsymmetricKey.ed25519()
        let configuration = TokenConfiguration(hmacSecret: APIServer.jwtSecret, publicKeyPEM: ed25519.publicPEM)
        try await Self.serve(tokens: configuration) { port in
            let input = { (alg: String) in
                SignedTokens.signingInput(header: ["alg": alg, "typ": "JWT"], claims: Self.valid)
            }
            let validHS = Self.hs256(Self.valid)
            let hsSignature = String(validHS.split(separator: ".")[2])
            var cases: [(String, String)] = []
            for alg in ["none", "None", "NONE", "nOnE", ""] {
                cases.append(("alg \(alg), no signature", input(alg) + "."))
                cases.append(("alg \(alg), HS256 signature", input(alg) + "." + hsSignature))
            }
            let key = SymmetricKey(data: Array(APIServer.jwtSecret.utf8))
            let hs384 = input("HS384")
            let hs512 = input("HS512")
            cases += [
                (
                    "HS384 with the secret",
                    hs384 + "."
                        + TestTokens.base64URL(
                            Data(HMAC<SHA384>.authenticationCode(for: Array(hs384.utf8), using: key)))
                ),
                (
                    "HS512 with the secret",
                    hs512 + "."
                        + TestTokens.base64URL(
                            Data(HMAC<SHA512>.authenticationCode(for: Array(hs512.utf8), using: key)))
                ),
                ("hs256 lower case", Self.hs256(Self.valid, header: ["alg": "hs256", "typ": "JWT"])),
                ("RS256 header, HS256 signature", input("RS256") + "." + hsSignature),
                (
                    "ES256 header, EdDSA signature",
                    try ed25519.token(Self.valid, header: ["alg": "ES256", "typ": "JWT"])
                ),
                ("no alg", TestTokens.sign(header: ["typ": "JWT"], claims: Self.valid, secret: APIServer.jwtSecret)),
                (
                    "alg not a string",
                    SignedTokens.signingInput(header: ["alg": 256], claims: Self.valid) + "." + hsSignature
                ),
                ("crit header", Self.hs256(Self.valid, header: ["alg": "HS256", "crit": ["exp"], "exp": 1])),
            ]
            try await Self.expect(port, cases, status: 401)
            // Both configured algorithms work side by side.
            try await Self.expect(
                port, [("HS256", validHS), ("EdDSA", try ed25519.token(Self.valid))], status: 200)
        }
    }

    /// The HS/RS confusion attack: HS256 "signed" with the public key (which is public) as the HMAC secret.
    @Test(arguments: ["EdDSA", "ES256", "RS256"])
    func hs256SignedWithThePublicKeyIsRefused(algorithm: String) async throws {
        let key = try await Self.key(algorithm)
        let der = Self.der(key.publicPEM)
        let secrets: [(String, [UInt8])] = [
            ("PEM", Array(key.publicPEM.utf8)), ("PEM and newline", Array((key.publicPEM + "\n").utf8)),
            ("trimmed PEM", Array(key.publicPEM.trimmingCharacters(in: .whitespacesAndNewlines).utf8)), ("DER", der),
        ]
        let forged = secrets.map { ("HS256 with the \($0.0)", SignedTokens.hs256(claims: Self.valid, key: $0.1)) }
        // Public key only: HS256 is not accepted at all.
        try await Self.serve(tokens: TokenConfiguration(hmacSecret: nil, publicKeyPEM: key.publicPEM)) { port in
            try await Self.expect(port, forged + [("HS256 with the real secret", Self.hs256(Self.valid))], status: 401)
            try await Self.expect(port, [(algorithm, try key.token(Self.valid))], status: 200)
        }
        // Secret and public key: HS256 is checked against the secret only.
        let both = TokenConfiguration(hmacSecret: APIServer.jwtSecret, publicKeyPEM: key.publicPEM)
        try await Self.serve(tokens: both) { port in
            try await Self.expect(port, forged, status: 401)
            try await Self.expect(
                port, [("HS256", Self.hs256(Self.valid)), (algorithm, try key.token(Self.valid))], status: 200)
        }
    }

    /// EdDSA, ES256 and RS256 tokens verify against `METRICSD_JWT_PUBLIC_KEY_FILE` (read as the daemon reads it).
    @Test(arguments: ["EdDSA", "ES256", "RS256"])
    func asymmetricTokensVerifyWithThePublicKeyFile(algorithm: String) async throws {
        let key = try await Self.key(algorithm)
        let other = try await Self.key(algorithm == "RS256" ? "ES256" : algorithm)
        let path = try scratchFile("jwt-public-key.pem", key.publicPEM + "\n")
        let configuration = try TokenConfiguration(environment: ["METRICSD_JWT_PUBLIC_KEY_FILE": path])
        #expect(configuration.hmacSecret == nil)
        #expect(try TokenVerifier(configuration).acceptedAlgorithms == [algorithm])
        try await Self.serve(tokens: configuration) { port in
            let token = try key.token(Self.valid)
            let parts = token.split(separator: ".").map(String.init)
            let otherPayload = String(try key.token(SignedTokens.claims(sub: "43")).split(separator: ".")[1])
            try await Self.expect(
                port,
                [
                    ("sub as a string", token),
                    ("sub as a number", try key.token(SignedTokens.claims(sub: Self.user))),
                    (
                        "with kid and extra claims",
                        try key.token(
                            SignedTokens.claims(
                                sub: String(Self.user), extra: ["iat": SignedTokens.now, "role": "user"]),
                            header: ["alg": algorithm, "typ": "JWT", "kid": "key-1"])
                    ),
                ], status: 200)
            try await Self.expect(
                port,
                [
                    ("payload swapped", parts[0] + "." + otherPayload + "." + parts[2]),
                    (
                        "signature of another key",
                        try other.token(Self.valid, header: ["alg": algorithm, "typ": "JWT"])
                    ),
                    ("signature truncated", parts[0] + "." + parts[1] + "." + String(parts[2].dropLast(4))),
                    ("no signature", parts[0] + "." + parts[1] + "."),
                    ("HS256 with the test secret", Self.hs256(Self.valid)),
                    (
                        "expired",
                        try key.token(
                            SignedTokens.claims(sub: String(Self.user), extra: ["exp": SignedTokens.now - 3600]))
                    ),
                ], status: 401)
        }
    }

    /// A signature counts only in its algorithm's own form: ES256 is r‖s, 64 bytes (RFC 7518 §3.4), not the DER an
    /// X.509 library writes; RS256 is RSASSA-PKCS1-v1_5 with SHA-256, not PSS with the same key, nor SHA-384. The
    /// tokens are minted by jwt-kit; the same key's proper tokens are accepted.
    @Test func signaturesInAnotherFormAreRefused() async throws {
        let p256 = try await AsymmetricKey.p256()
        let esToken = try p256.token(Self.valid)
        let esParts = esToken.split(separator: ".").map(String.init)
        let raw = try #require(Self.base64URLDecoded(esParts[2]))
        #expect(raw.count == 64)
        let der = try P256.Signing.ECDSASignature(rawRepresentation: raw).derRepresentation
        let rsa = try Insecure.RSA.PrivateKey(pem: RSATestKey.privatePEM)
        let rs256Header: [String: Any] = ["alg": "RS256", "typ": "JWT"]
        let cases: [(String, String, String)] = [
            ("ES256 signature in DER", p256.publicPEM, esParts[0] + "." + esParts[1] + "." + TestTokens.base64URL(der)),
            (
                "ES256 signature with a byte more", p256.publicPEM,
                esParts[0] + "." + esParts[1] + "." + TestTokens.base64URL(Data(raw + [0]))
            ),
            (
                "PS256 signature under an RS256 header", RSATestKey.publicPEM,
                try SignedTokens.sign(
                    header: rs256Header, claims: Self.valid,
                    with: await JWTKeyCollection().add(pss: rsa, digestAlgorithm: .sha256).getKey())
            ),
            (
                "RS384 signature under an RS256 header", RSATestKey.publicPEM,
                try SignedTokens.sign(
                    header: rs256Header, claims: Self.valid,
                    with: await JWTKeyCollection().add(rsa: rsa, digestAlgorithm: .sha384).getKey())
            ),
        ]
        for (name, pem, token) in cases {
            let verifier = try TokenVerifier(TokenConfiguration(hmacSecret: nil, publicKeyPEM: pem))
            do {
                let userID = try verifier.verify(Substring(token))
                Issue.record("\(name): accepted as user \(userID)")
            } catch {
                #expect(error.reason == .badSignature, "\(name): \(error.message)")
            }
        }
        let rsaKey = try await AsymmetricKey.rsa()
        #expect(
            try TokenVerifier(TokenConfiguration(hmacSecret: nil, publicKeyPEM: p256.publicPEM)).verify(
                Substring(esToken)) == Self.user)
        #expect(
            try TokenVerifier(TokenConfiguration(hmacSecret: nil, publicKeyPEM: rsaKey.publicPEM)).verify(
                Substring(try rsaKey.token(Self.valid)))
                == Self.user)
    }

    /// Public keys in the forms a key file holds: an RSA key as PKCS#1 (`BEGIN RSA PUBLIC KEY`) verifies like the
    /// same key as SubjectPublicKeyInfo; a key on a curve other than P-256 (P-384) is refused by name.
    @Test func publicKeyFormsAndCurves() async throws {
        let spki = Self.der(RSATestKey.publicPEM)
        // SubjectPublicKeyInfo of a 2048-bit key: a 4-byte SEQUENCE header, the 15-byte rsaEncryption
        // AlgorithmIdentifier, then a BIT STRING (4-byte header, 1 unused-bits byte) holding the PKCS#1 key.
        #expect(spki.count == 294 && spki[19] == 0x03 && spki[24] == 0x30, "\(spki.prefix(30))")
        let pkcs1 = Data(spki[24...]).base64EncodedString(options: .lineLength64Characters)
        let pkcs1PEM = "-----BEGIN RSA PUBLIC KEY-----\n\(pkcs1)\n-----END RSA PUBLIC KEY-----\n"
        let rsa = try Insecure.RSA.PrivateKey(pem: RSATestKey.privatePEM)
        let token = try SignedTokens.sign(
            header: ["alg": "RS256", "typ": "JWT"], claims: Self.valid,
            with: await JWTKeyCollection().add(rsa: rsa, digestAlgorithm: .sha256).getKey())
        for pem in [RSATestKey.publicPEM, pkcs1PEM] {
            let verifier = try TokenVerifier(TokenConfiguration(hmacSecret: nil, publicKeyPEM: pem))
            #expect(verifier.acceptedAlgorithms == ["RS256"])
            #expect(try verifier.verify(Substring(token)) == Self.user, "\(pem.prefix(30))")
        }
        let p384 = P384.Signing.PrivateKey().publicKey.pemRepresentation
        let refused = #expect(throws: TokenKeyError.self) { try TokenVerifier.checkPublicKey(p384) }
        #expect(
            refused?.description.contains("not an Ed25519, P-256 or RSA public key") == true,
            "\(String(describing: refused))")
        #expect(refused?.description.contains("another key type or curve") == true, "\(String(describing: refused))")

        // Text around the block is ignored; what is wrong with a block is said in the refusal.
        let ed25519 = try await AsymmetricKey.ed25519().publicPEM
        #expect(
            try TokenVerifier(
                TokenConfiguration(hmacSecret: nil, publicKeyPEM: "issued 2026-11\n" + ed25519 + "\nend\n")
            )
            .acceptedAlgorithms == ["EdDSA"])
        let body = ed25519.split(separator: "\n")[1]
        let trailing = Data(base64Encoded: String(body))! + Data([0x05, 0x00])
        let reasons: [(String, String)] = [
            ("no key here", "no BEGIN PUBLIC KEY or BEGIN RSA PUBLIC KEY block"),
            ("-----BEGIN PUBLIC KEY-----\n\(body.dropLast())\n-----END PUBLIC KEY-----\n", "block is not base64"),
            ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "asn1 encoding routines"),
            (
                "-----BEGIN PUBLIC KEY-----\n\(trailing.base64EncodedString())\n-----END PUBLIC KEY-----\n",
                "not a key libcrypto reads"
            ),
        ]
        for (pem, reason) in reasons {
            let refusal = #expect(throws: TokenKeyError.self) { try TokenVerifier.checkPublicKey(pem) }
            #expect(refusal?.description.contains(reason) == true, "\(pem): \(String(describing: refusal))")
        }
    }

    /// The real binary, verifying with a public key file only (no secret at all).
    @Test func daemonVerifiesWithAPublicKeyFileOnly() async throws {
        let key = try await AsymmetricKey.ed25519()
        let path = try scratchFile("jwt-public-key.pem", key.publicPEM)
        try await withTestDatabase { database in
            try await database.seed([.valid(Self.user)])
            let daemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_JWT_SECRET_FILE": "", "METRICSD_JWT_PUBLIC_KEY_FILE": path])
            let ok = try await daemon.send(Self.today, headers: TestTokens.bearer(try key.token(Self.valid)))
            #expect(ok.status == 200, "\(ok)")
            let hs = try await daemon.send(Self.today, headers: TestTokens.bearer(Self.hs256(Self.valid)))
            expectErrorBody(hs, status: 401, code: .token(.algorithmNotAccepted))
            let forged = try await daemon.send(
                Self.today,
                headers: TestTokens.bearer(SignedTokens.hs256(claims: Self.valid, key: Array(key.publicPEM.utf8))))
            expectErrorBody(forged, status: 401, code: .token(.algorithmNotAccepted))
            await daemon.stop()
        }
    }

    /// A secret besides the public key keeps HS256 accepted (whoever reads the secret can mint tokens);
    /// `METRICSD_JWT_HS256=off` leaves the secret unread, so only the key's algorithm is accepted.
    @Test func hs256OffVerifiesWithThePublicKeyOnly() async throws {
        let key = try await AsymmetricKey.ed25519()
        let path = try scratchFile("jwt-public-key.pem", key.publicPEM)
        let secretFile = DaemonProcess.secrets.directory + "/jwt-secret"
        let both = try TokenConfiguration(environment: [
            "METRICSD_JWT_SECRET_FILE": secretFile, "METRICSD_JWT_PUBLIC_KEY_FILE": path,
        ])
        #expect(try TokenVerifier(both).acceptedAlgorithms == ["EdDSA", "HS256"])
        let keyOnly = try TokenConfiguration(
            environment: [
                "METRICSD_JWT_SECRET_FILE": secretFile, "METRICSD_JWT_PUBLIC_KEY_FILE": path,
                "METRICSD_JWT_HS256": "off",
            ])
        #expect(keyOnly.hmacSecret == nil)
        #expect(try TokenVerifier(keyOnly).acceptedAlgorithms == ["EdDSA"])
        let offWithoutKey = #expect(throws: ConfigurationError.self) {
            try TokenConfiguration(environment: ["METRICSD_JWT_SECRET_FILE": secretFile, "METRICSD_JWT_HS256": "off"])
        }
        #expect(offWithoutKey?.kind == .noJWTKey)
        let maybe = #expect(throws: ConfigurationError.self) {
            try TokenConfiguration(environment: ["METRICSD_JWT_SECRET_FILE": secretFile, "METRICSD_JWT_HS256": "maybe"])
        }
        #expect(maybe?.kind == .invalidValue)

        try await withTestDatabase { database in
            try await database.seed([.valid(Self.user)])
            let hsToken = Self.hs256(Self.valid)
            for (hs256, expected) in [("on", 200), ("off", 401)] {
                let daemon = try await DaemonProcess.start(
                    database: database, extra: ["METRICSD_JWT_PUBLIC_KEY_FILE": path, "METRICSD_JWT_HS256": hs256])
                let keyed = try await daemon.send(Self.today, headers: TestTokens.bearer(try key.token(Self.valid)))
                #expect(keyed.status == 200, "HS256 \(hs256): \(keyed)")
                let hs = try await daemon.send(Self.today, headers: TestTokens.bearer(hsToken))
                #expect(hs.status == expected, "HS256 \(hs256): \(hs)")
                await daemon.stop()
            }
        }
    }

    // MARK: Time

    /// Time-relative tokens are minted just before each request (`claims` gets the current time), so a slow,
    /// loaded machine cannot move a token across a boundary between minting and sending.
    static func expectTimed(
        _ port: Int, _ cases: [(String, @Sendable (Int) -> [String: Any])], status expected: Int,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        for (name, claims) in cases {
            let status = try await Self.status(
                port, Self.hs256(claims(SignedTokens.now)), sourceLocation: sourceLocation)
            #expect(status == expected, "\(name): \(status), expected \(expected)", sourceLocation: sourceLocation)
        }
    }

    @Test func expiryAndNotBeforeWithTheClockLeeway() async throws {
        try await Self.serve { port in
            let sub = String(Self.user)
            try await Self.expectTimed(
                port,
                [
                    ("expired an hour ago", { now in ["sub": sub, "exp": now - 3600] }),
                    ("expired beyond the 30 s leeway", { now in ["sub": sub, "exp": now - 45] }),
                    ("not valid for ten minutes", { now in ["sub": sub, "exp": now + 3600, "nbf": now + 600] }),
                    ("not valid beyond the 30 s leeway", { now in ["sub": sub, "exp": now + 3600, "nbf": now + 90] }),
                    ("no exp", { _ in ["sub": sub] }),
                    ("exp as a string", { now in ["sub": sub, "exp": String(now + 3600)] }),
                    ("exp as a boolean", { _ in ["sub": sub, "exp": true] }),
                    ("exp null", { _ in ["sub": sub, "exp": NSNull()] }),
                    ("exp huge", { _ in ["sub": sub, "exp": 1e300] }),
                    ("nbf as a string", { now in ["sub": sub, "exp": now + 3600, "nbf": String(now)] }),
                ], status: 401)
            try await Self.expectTimed(
                port,
                [
                    ("expired within the leeway", { now in ["sub": sub, "exp": now - 10] }),
                    ("not yet valid within the leeway", { now in ["sub": sub, "exp": now + 3600, "nbf": now + 10] }),
                    ("valid since a minute", { now in ["sub": sub, "exp": now + 3600, "nbf": now - 60] }),
                    ("fractional exp", { now in ["sub": sub, "exp": Double(now) + 3600.5] }),
                ], status: 200)
        }
    }

    @Test func leewayIsConfigurable() async throws {
        let strict = TokenConfiguration(hmacSecret: APIServer.jwtSecret, leewaySeconds: 0)
        try await Self.serve(tokens: strict) { port in
            let sub = String(Self.user)
            try await Self.expectTimed(
                port,
                [
                    ("expired 5 s ago", { now in ["sub": sub, "exp": now - 5] }),
                    ("valid in 20 s", { now in ["sub": sub, "exp": now + 3600, "nbf": now + 20] }),
                ], status: 401)
        }
        let leeway = #expect(throws: ConfigurationError.self) {
            try TokenConfiguration(environment: [
                "METRICSD_JWT_SECRET": APIServer.jwtSecret, "METRICSD_JWT_LEEWAY_SECONDS": "3600",
            ])
        }
        #expect(leeway?.kind == .invalidValue)
    }

    // MARK: Issuer and audience

    @Test func issuerAndAudienceWhenConfigured() async throws {
        let configuration = try TokenConfiguration(environment: [
            "METRICSD_JWT_SECRET": APIServer.jwtSecret, "METRICSD_JWT_ISSUER": "https://api.gtsd.example",
            "METRICSD_JWT_AUDIENCE": "metricsd",
        ])
        try await Self.serve(tokens: configuration) { port in
            let claims = { (extra: [String: Any]) in SignedTokens.claims(sub: String(Self.user), extra: extra) }
            try await Self.expect(
                port,
                [
                    ("right iss and aud", Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": "metricsd"]))),
                    (
                        "aud array containing it",
                        Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": ["mobile", "metricsd"]]))
                    ),
                ], status: 200)
            try await Self.expect(
                port,
                [
                    ("wrong iss", Self.hs256(claims(["iss": "https://evil.example", "aud": "metricsd"]))),
                    (
                        "iss with a trailing slash",
                        Self.hs256(claims(["iss": "https://api.gtsd.example/", "aud": "metricsd"]))
                    ),
                    (
                        "iss in another case",
                        Self.hs256(claims(["iss": "https://API.gtsd.example", "aud": "metricsd"]))
                    ),
                    ("missing iss", Self.hs256(claims(["aud": "metricsd"]))),
                    ("iss as an array", Self.hs256(claims(["iss": ["https://api.gtsd.example"], "aud": "metricsd"]))),
                    ("wrong aud", Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": "gtsd-admin"]))),
                    ("missing aud", Self.hs256(claims(["iss": "https://api.gtsd.example"]))),
                    (
                        "aud array without it",
                        Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": ["mobile"]]))
                    ),
                    ("aud empty array", Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": [String]()]))),
                    ("aud prefix", Self.hs256(claims(["iss": "https://api.gtsd.example", "aud": "metricsd-other"]))),
                ], status: 401)
        }
        // Not configured: iss and aud are not looked at.
        try await Self.serve { port in
            let claims = SignedTokens.claims(sub: String(Self.user), extra: ["iss": "anyone", "aud": "anything"])
            try await Self.expect(port, [("any iss and aud", Self.hs256(claims))], status: 200)
        }
    }

    // MARK: Subject

    @Test func subjectMustBeAPositiveIntegerUserID() async throws {
        try await Self.serve { port in
            let refused: [(String, Any?)] = [
                ("non-numeric", "abc"), ("zero", "0"), ("negative", "-5"), ("leading zeros", "007"), ("float", 1.5),
                ("boolean", true), ("missing", nil), ("empty", ""), ("leading space", " 42"), ("trailing space", "42 "),
                ("plus sign", "+42"), ("decimal string", "42.0"), ("exponent string", "4.2e1"), ("hex", "0x2a"),
                ("overflow", "9223372036854775808"), ("twenty digits", "99999999999999999999"), ("null", NSNull()),
                ("array", [42]), ("object", ["id": 42]), ("number zero", 0), ("negative number", -5),
                ("huge number", 1e20), ("fractional number", 42.5), ("unicode digits", "٤٢"), ("SQL", "42 OR 1=1"),
                ("NaN string", "NaN"),
            ]
            try await Self.expect(
                port, refused.map { ($0.0, Self.hs256(SignedTokens.claims(sub: $0.1))) }, status: 401)
            try await Self.expect(
                port,
                [
                    ("string", Self.hs256(SignedTokens.claims(sub: "42"))),
                    ("number", Self.hs256(SignedTokens.claims(sub: 42))),
                ], status: 200)
        }
    }

    /// A numeric subject is an integer literal: no fraction or exponent, even one that denotes an integer
    /// (`1e3`) or rounds to one as a Double (`1.0000000000000001`). The same subject written as digits is
    /// accepted on both readers (the plain one, and the decoder a string escape elsewhere sends it to).
    @Test func numericSubjectIsAnIntegerLiteralOnly() async throws {
        let later = SignedTokens.now + 3600
        let user = Self.user
        let refused = [
            ("rounds to the user", #"{"sub":\#(user).0000000000000001,"exp":\#(later)}"#),
            ("fraction zero", #"{"sub":\#(user).0,"exp":\#(later)}"#),
            ("exponent", #"{"sub":\#(user)e0,"exp":\#(later)}"#),
            ("exponent to the user", #"{"sub":\#(user * 10)E-1,"exp":\#(later)}"#),
            ("exponent with an escape elsewhere", #"{"sub":\#(user)e0,"exp":\#(later),"n":"\u0041"}"#),
            ("1e3", #"{"sub":1e3,"exp":\#(later)}"#),
            ("negative zero exponent", #"{"sub":\#(user)e-0,"exp":\#(later)}"#),
        ]
        let accepted = [
            ("digits", #"{"sub":\#(user),"exp":\#(later)}"#),
            ("digits with an escape elsewhere", #"{"sub":\#(user),"exp":\#(later),"n":"\u0041"}"#),
            ("digits, spaced", #"{ "sub" : \#(user) , "exp" : \#(later) }"#),
            ("escaped name", #"{"s\u0075b":\#(user),"exp":\#(later)}"#),
        ]
        let verifier = try TokenVerifier(TokenConfiguration(hmacSecret: APIServer.jwtSecret))
        for (name, payload) in refused {
            do {
                let userID = try verifier.verify(Substring(Self.raw(payload: payload)))
                Issue.record("\(name): accepted as user \(userID)")
            } catch {
                #expect(error.reason == .subjectNotUserID, "\(name): \(error.reason) \(error.message)")
            }
        }
        for (name, payload) in accepted {
            #expect((try? verifier.verify(Substring(Self.raw(payload: payload)))) == user, "\(name)")
        }
        try await Self.serve { port in
            try await Self.expect(port, refused.map { ($0.0, Self.raw(payload: $0.1)) }, status: 401)
            try await Self.expect(port, accepted.map { ($0.0, Self.raw(payload: $0.1)) }, status: 200)
        }
    }

    // MARK: Admin and user tokens

    @Test func adminAndUserTokensAreNeverInterchangeable() async throws {
        try await Self.serve { port in
            let userToken = Self.hs256(Self.valid)
            let admin = APIServer.adminToken
            let userRoutes: [(String, HTTPRequest.Method)] = [
                (Self.today, .get), ("/v1/profile/metrics/acknowledge", .post),
            ]
            let adminRoutes: [(String, HTTPRequest.Method)] = [
                ("/v1/admin/recompute", .get), ("/v1/admin/recompute", .post), ("/v1/admin/recompute/1", .get),
                ("/v1/admin/recompute/1/cancel", .post),
            ]
            let body = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
            for (path, method) in userRoutes {
                let forged = SignedTokens.hs256(claims: Self.valid, key: Array(admin.utf8))
                for (token, reason) in [(admin, TokenError.Reason.malformed), (forged, .badSignature)] {
                    let reply = try await API.send(
                        port: port, path, method: method, headers: TestTokens.bearer(token), text: body)
                    expectErrorBody(reply, status: 401, code: .token(reason))
                }
                let ok = try await API.send(
                    port: port, path, method: method, headers: TestTokens.bearer(userToken), text: body)
                #expect(ok.status == 200, "\(method) \(path): \(ok)")
            }
            for (path, method) in adminRoutes {
                for token in [
                    userToken,
                    Self.hs256(SignedTokens.claims(sub: String(Self.user), extra: ["role": "admin", "admin": true])),
                ] {
                    let reply = try await API.send(port: port, path, method: method, headers: TestTokens.bearer(token))
                    expectErrorBody(reply, status: 401, code: .adminTokenInvalid)
                }
                let reply = try await API.send(port: port, path, method: method, headers: TestTokens.bearer(admin))
                #expect(reply.status != 401, "\(method) \(path) refuses the admin token: \(reply)")
            }
            #expect(
                try await API.send(port: port, "/v1/admin/recompute", headers: TestTokens.bearer(admin)).status == 200)
        }
    }

    // MARK: Configuration errors

    /// Bad key configuration stops `metricsd serve` before it does anything: exit 1 and one clear line, no stack.
    @Test func keyConfigurationErrorsFailStartUpWithOneClearLine() async throws {
        let privateEd25519 = Curve25519.Signing.PrivateKey()
        let privateEdPEM = EdDSA.PrivateKey(backing: privateEd25519).pemRepresentation
        // The code says which failure; where one code covers several (an unusable public key), the words say why.
        let cases: [(String, [String: String], ConfigurationError.Kind, String?)] = [
            (
                "public key file holds a private key (Ed25519)",
                ["METRICSD_JWT_PUBLIC_KEY_FILE": try scratchFile("ed.pem", privateEdPEM)], .jwtPublicKeyInvalid,
                "holds a private key"
            ),
            (
                "public key file holds a private key (P-256)",
                [
                    "METRICSD_JWT_PUBLIC_KEY_FILE": try scratchFile(
                        "p256.pem", P256.Signing.PrivateKey().pemRepresentation)
                ],
                .jwtPublicKeyInvalid, "holds a private key"
            ),
            (
                "public key file holds a private key (RSA)",
                ["METRICSD_JWT_PUBLIC_KEY_FILE": try scratchFile("rsa.pem", RSATestKey.privatePEM)],
                .jwtPublicKeyInvalid,
                "holds a private key"
            ),
            (
                "public key file is not a key",
                [
                    "METRICSD_JWT_PUBLIC_KEY_FILE": try scratchFile(
                        "junk.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
                ],
                .jwtPublicKeyInvalid, "not an Ed25519, P-256 or RSA public key"
            ),
            (
                "RSA key of 1024 bits",
                ["METRICSD_JWT_PUBLIC_KEY_FILE": try scratchFile("rsa1024.pem", RSATestKey.smallPublicPEM)],
                .jwtPublicKeyInvalid, "2048"
            ),
            (
                "public key file missing",
                ["METRICSD_JWT_PUBLIC_KEY_FILE": "/nonexistent/metricsd/jwt.pem"], .secretUnreadable,
                "METRICSD_JWT_PUBLIC_KEY_FILE"
            ),
            (
                "secret shorter than 32 bytes",
                ["METRICSD_JWT_SECRET_FILE": try scratchFile("short", "only-31-bytes-of-secret-0123456")],
                .jwtSecretTooShort, nil
            ),
            (
                "secret variable shorter than 32 bytes",
                ["METRICSD_JWT_SECRET_FILE": "", "METRICSD_JWT_SECRET": "short"], .jwtSecretTooShort, nil
            ),
        ]
        for (name, extra, kind, phrase) in cases {
            // An unreachable database: a configuration error must be reported before any connection attempt.
            let environment = DaemonProcess.environment(
                databaseURL: "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", port: DaemonProcess.freePort(),
                extra: extra)
            let daemon = try DaemonProcess(environment: environment)
            let status = await daemon.waitForExit(timeout: .seconds(20))
            #expect(status == 1, "\(name): exit status \(String(describing: status))")
            let lines = daemon.log.split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
            #expect(lines.count == 1, "\(name): expected one line, got:\n\(daemon.log)")
            let line = String(lines.first ?? "")
            #expect(line.hasSuffix(" [\(kind.rawValue)]"), "\(name): \(line)")
            if let phrase { #expect(line.contains(phrase), "\(name): \(line)") }
            #expect(line.hasPrefix("Error: configuration error"), "\(name): \(line)")
            for word in ["Fatal error", "Stack", ".swift", "-----", String(privateEdPEM.split(separator: "\n")[1])] {
                #expect(!line.contains(word), "\(name): \(line) contains \(word)")
            }
        }
        // No key at all is found once logging has started (the daemon's fatal path also logs it): still exit 1
        // and exactly one `Error:` line, no stack.
        let environment = DaemonProcess.environment(
            databaseURL: "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", port: DaemonProcess.freePort(),
            extra: ["METRICSD_JWT_SECRET_FILE": ""])
        let daemon = try DaemonProcess(environment: environment)
        #expect(await daemon.waitForExit(timeout: .seconds(20)) == 1)
        let errors = daemon.log.split(separator: "\n").filter { $0.hasPrefix("Error: ") }
        #expect(errors.count == 1 && errors.first?.hasSuffix(" [config.no_jwt_key]") == true, "\(daemon.log)")
        #expect(!daemon.log.contains("Fatal error") && !daemon.log.contains(".swift"), "\(daemon.log)")
    }

    // MARK: Keys

    static func key(_ algorithm: String) async throws -> AsymmetricKey {
        switch algorithm {
        case "EdDSA": try await AsymmetricKey.ed25519()
        case "ES256": try await AsymmetricKey.p256()
        default: try await AsymmetricKey.rsa()
        }
    }

    /// base64url without padding, decoded.
    static func base64URLDecoded(_ text: String) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64).map(Array.init)
    }

    /// The DER bytes inside a PEM.
    static func der(_ pem: String) -> [UInt8] {
        let base64 = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        return Array(Data(base64Encoded: base64) ?? Data())
    }
}
