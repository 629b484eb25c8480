import Crypto
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import JWTKit

/// A PEM public key metricsd can verify tokens with; parsing it is synchronous, so configuration checks it early.
enum PublicKeyPEM {
    case eddsa(EdDSA.PublicKey)
    case es256(ES256PublicKey)
    case rs256(JWTKit.Insecure.RSA.PublicKey)

    init(_ pem: String) throws(TokenKeyError) {
        if pem.contains("PRIVATE KEY") {
            throw TokenKeyError.unusablePublicKey("the JWT public key file holds a private key: give metricsd only the public key")
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
                    throw TokenKeyError.unusablePublicKey(
                        "the JWT public key is an RSA key metricsd cannot use: RS256 needs an RSA public key of at least 2048 bits (PEM, BEGIN PUBLIC KEY)"
                    )
                }
                throw TokenKeyError.unusablePublicKey("the JWT public key is not an Ed25519, P-256 or RSA public key in PEM form")
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
