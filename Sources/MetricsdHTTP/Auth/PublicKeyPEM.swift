/// A PEM public key metricsd can verify tokens with, and the one algorithm it is used for; parsing it is
/// synchronous, so configuration checks it early. libcrypto decodes the keys and checks the signatures.
enum PublicKeyPEM: Sendable {
    case eddsa(VerifyingKey)
    case es256(VerifyingKey)
    case rs256(VerifyingKey)

    /// RS256 keys below this size are refused (RFC 7518 §3.3 requires at least 2048 bits).
    static let minimumRSABits = 2048

    init(_ pem: String) throws(TokenKeyError) {
        if pem.contains("PRIVATE KEY") {
            throw TokenKeyError.unusablePublicKey(
                "the JWT public key file holds a private key: give metricsd only the public key")
        }
        let key: VerifyingKey
        do {
            key = try VerifyingKey(pem: pem)
        } catch {
            // An RSA key of any size that libcrypto reads reaches `.rsa(bits)` below; this one it could not read.
            throw TokenKeyError.unusablePublicKey(
                "the JWT public key is not an Ed25519, P-256 or RSA public key in PEM form (\(error.reason))")
        }
        switch key.kind {
        case .ed25519:
            self = .eddsa(key)
        case .p256:
            self = .es256(key)
        case .rsa(let bits) where bits >= Self.minimumRSABits:
            self = .rs256(key)
        case .rsa(let bits):
            throw TokenKeyError.unusablePublicKey(
                "the JWT public key is an RSA key metricsd cannot use: RS256 needs an RSA public key of at least 2048 bits, this one has \(bits)"
            )
        case .other:
            throw TokenKeyError.unusablePublicKey(
                "the JWT public key is not an Ed25519, P-256 or RSA public key in PEM form (another key type or curve)")
        }
    }

    /// The JOSE `alg` this key verifies.
    var algorithm: String {
        switch self {
        case .eddsa: "EdDSA"
        case .es256: "ES256"
        case .rs256: "RS256"
        }
    }

    /// Whether `signature` (the token's third part, decoded) signs `signed` (the token's first two parts).
    func isValidSignature(_ signature: [UInt8], signing signed: [UInt8]) -> Bool {
        switch self {
        case .eddsa(let key):
            return key.verifies(signature, of: signed)
        case .es256(let key):
            // JOSE's ES256 signature is r‖s, 32 bytes each (RFC 7518 §3.4), not DER: any other length is refused.
            guard let der = VerifyingKey.derECDSASignature(raw: signature) else { return false }
            return key.verifies(der, of: signed)
        case .rs256(let key):
            // RS256 is RSASSA-PKCS1-v1_5 with SHA-256 (RFC 7518 §3.3), libcrypto's default padding for an RSA key.
            return key.verifies(signature, of: signed)
        }
    }
}
