import CLibCrypto
import Glibc
import NIOSSL

/// What metricsd holds a certificate to before serving it, beyond parsing and matching its key: its dates and the
/// strength of its key. The same rules at start, on reload, in `check-config` and in `refresh-credentials`.
///
/// Refused: a certificate past its `notAfter` (every client rejects it, so serving it only turns a renewal that
/// went wrong into an outage later than it needs to be noticed), an RSA key under 2048 bits (the floor the token
/// keys are held to, and CA/Browser Forum's since 2014), an EC key on a curve other than P-256, P-384 or P-521
/// (P-224 and smaller are weak; other curves are ones TLS clients do not accept), and any other kind of key but
/// Ed25519 and Ed448. Warned about: a certificate not valid yet (clients refuse it until then: a clock or a
/// renewal issued for later) and one that expires within ``expiryWarningSeconds``.
package struct TLSCertificateCheck: Sendable {
    /// RSA keys under this many bits are refused.
    package static let minimumRSABits = 2048
    /// Expiry within this many seconds is warned about (certbot renews 30 days ahead, so two weeks left means its
    /// renewals have been failing for two weeks).
    package static let expiryWarningSeconds = 14 * 86_400

    /// Seconds since 1970.
    package let notValidBefore: Int
    package let notValidAfter: Int
    /// The serial number in hexadecimal, as `openssl x509 -serial` prints it.
    package let serial: String
    /// The key's kind and size, e.g. `RSA 2048 bits`, `EC P-256`.
    package let key: String
    /// What needs attention but does not stop the certificate from being served, one line each.
    package let warnings: [String]

    /// Checks the certificate (the first of the chain) at `now` (seconds since 1970).
    /// - Throws: a ``TLSIdentityError`` saying what is wrong and what to change, in one line.
    package init(leaf: NIOSSLCertificate, now: Int) throws(TLSIdentityError) {
        self.notValidBefore = Int(leaf.notValidBefore)
        self.notValidAfter = Int(leaf.notValidAfter)
        self.serial = leaf.serialNumber.map { ($0 < 16 ? "0" : "") + String($0, radix: 16, uppercase: true) }.joined()
        let der: [UInt8]
        do {
            der = try leaf.toDERBytes()
        } catch {
            throw TLSIdentityError("the TLS certificate cannot be read back as DER (\(error))")
        }
        self.key = try Self.checkKey(Self.publicKey(der: der))
        if now >= self.notValidAfter {
            throw TLSIdentityError(
                "the TLS certificate (serial \(self.serial)) expired on \(Self.date(self.notValidAfter)): install a renewed certificate"
            )
        }
        var warnings: [String] = []
        if now < self.notValidBefore {
            warnings.append(
                "the TLS certificate (serial \(self.serial)) is not valid before \(Self.date(self.notValidBefore)): clients refuse it until then (check the host's clock, or keep the previous certificate until that time)"
            )
        }
        if self.notValidAfter - now < Self.expiryWarningSeconds {
            let days = (self.notValidAfter - now) / 86_400
            warnings.append(
                "the TLS certificate (serial \(self.serial)) expires on \(Self.date(self.notValidAfter)), in \(days == 0 ? "less than a day" : days == 1 ? "1 day" : "\(days) days"): renew it and reload"
            )
        }
        self.warnings = warnings
    }

    /// The current time, seconds since 1970.
    package static func now() -> Int {
        Int(time(nil))
    }

    /// What the key is, or why it is refused.
    private static func checkKey(_ key: PublicKeyKind) throws(TLSIdentityError) -> String {
        let advice =
            "issue a certificate for an EC P-256 key (certbot --key-type ecdsa) or an RSA key of at least \(Self.minimumRSABits) bits"
        switch key {
        case .rsa(let bits) where bits >= Self.minimumRSABits:
            return "RSA \(bits) bits"
        case .rsa(let bits):
            throw TLSIdentityError(
                "the TLS certificate's key is RSA of \(bits) bits, under the \(Self.minimumRSABits) needed: \(advice)")
        case .ec(let curve, _) where ["P-256", "P-384", "P-521"].contains(curve):
            return "EC \(curve)"
        case .ec(let curve, let bits):
            throw TLSIdentityError(
                "the TLS certificate's key is EC on \(curve) (\(bits) bits), not P-256, P-384 or P-521: \(advice)")
        case .edwards(let name):
            return name
        case .other(let name):
            throw TLSIdentityError("the TLS certificate's key is \(name), which metricsd does not serve: \(advice)")
        case .unreadable(let reason):
            throw TLSIdentityError("the TLS certificate's public key cannot be read (\(reason)): \(advice)")
        }
    }

    enum PublicKeyKind: Equatable {
        case rsa(bits: Int)
        /// The curve by its NIST name where it has one (P-256), else by OpenSSL's (secp256k1).
        case ec(curve: String, bits: Int)
        case edwards(String)
        case other(String)
        case unreadable(String)
    }

    /// The certificate's public key as the system's libcrypto reads it (swift-nio-ssl's BoringSSL does not say a
    /// key's size).
    static func publicKey(der: [UInt8]) -> PublicKeyKind {
        defer { ERR_clear_error() }
        let certificate: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            return d2i_X509(nil, &cursor, buffer.count)
        }
        guard let certificate else { return .unreadable("libcrypto cannot decode the certificate") }
        defer { X509_free(certificate) }
        // Owned by the certificate.
        guard let key = X509_get0_pubkey(certificate) else { return .unreadable("libcrypto finds no public key in it") }
        let bits = Int(EVP_PKEY_get_bits(key))
        switch EVP_PKEY_get_base_id(key) {
        case EVP_PKEY_RSA, EVP_PKEY_RSA_PSS:
            return .rsa(bits: bits)
        case EVP_PKEY_EC:
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_group_name(key, &name, name.count, &length) == 1 else {
                return .ec(curve: "an unnamed curve", bits: bits)
            }
            let group = String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let nist = [
                "prime256v1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521", "secp224r1": "P-224",
                "prime192v1": "P-192",
            ]
            return .ec(curve: nist[group] ?? group, bits: bits)
        case EVP_PKEY_ED25519:
            return .edwards("Ed25519")
        case EVP_PKEY_ED448:
            return .edwards("Ed448")
        case EVP_PKEY_DSA:
            return .other("DSA of \(bits) bits")
        case let id:
            let name = OBJ_nid2sn(id).map { String(cString: $0) } ?? "type \(id)"
            return .other("\(name) of \(bits) bits")
        }
    }

    /// Seconds since 1970 as a UTC date and time, `2027-01-31 12:00 UTC`.
    package static func date(_ seconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%d %H:%M UTC", &parts)
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
