#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

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
            throw TokenKeyError.unusablePublicKey("the JWT public key file holds a private key: give metricsd only the public key")
        }
        let key: VerifyingKey
        do {
            key = try VerifyingKey(pem: pem)
        } catch {
            if Self.looksLikeRSA(pem) {
                throw TokenKeyError.unusablePublicKey(
                    "the JWT public key is an RSA key metricsd cannot use: RS256 needs an RSA public key of at least 2048 bits (PEM, BEGIN PUBLIC KEY)"
                )
            }
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
