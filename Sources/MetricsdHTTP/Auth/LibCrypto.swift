import CLibCrypto

// The signature maths of token checks: SHA-256, HMAC-SHA-256, and Ed25519, P-256 ECDSA and RSA PKCS#1 v1.5
// verification, from the system's OpenSSL 3 libcrypto. metricsd loads that library anyway (libpq links it for its
// TLS connections), and Debian keeps it patched. swift-crypto would bring a second, statically linked copy of
// BoringSSL (the first is swift-nio-ssl's, for TLS) plus its Swift layers: 2.9 MB of a 25.7 MB binary, measured
// with scripts/binary-size. Only the calls are written here; every primitive is libcrypto's.

/// HMAC-SHA-256 with its key set once: each check duplicates the keyed context instead of keying a new one.
final class KeyedHMACSHA256: @unchecked Sendable {
    /// Only ever read after `init` (duplicated per check), which OpenSSL allows from any number of threads.
    private let keyed: OpaquePointer

    init?(key: [UInt8]) {
        guard let mac = EVP_MAC_fetch(nil, "HMAC", nil) else { ERR_clear_error(); return nil }
        defer { EVP_MAC_free(mac) }
        guard let context = EVP_MAC_CTX_new(mac) else { ERR_clear_error(); return nil }
        var digest = Array("SHA256".utf8CString)
        let initialised = digest.withUnsafeMutableBufferPointer { name in
            var parameters = [
                OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, name.baseAddress, 0), OSSL_PARAM_construct_end(),
            ]
            return key.withUnsafeBufferPointer { EVP_MAC_init(context, $0.baseAddress, $0.count, &parameters) }
        }
        guard initialised == 1 else { EVP_MAC_CTX_free(context); ERR_clear_error(); return nil }
        self.keyed = context
    }

    deinit { EVP_MAC_CTX_free(self.keyed) }

    /// Whether `signature` is the MAC of `message`, compared in time that depends only on the lengths.
    func authenticates(_ message: UnsafeRawBufferPointer, signature: [UInt8]) -> Bool {
        guard let context = EVP_MAC_CTX_dup(self.keyed) else { ERR_clear_error(); return false }
        defer { EVP_MAC_CTX_free(context) }
        var mac = [UInt8](repeating: 0, count: 32)
        var length = 0
        guard EVP_MAC_update(context, message.baseAddress?.assumingMemoryBound(to: UInt8.self), message.count) == 1,
            EVP_MAC_final(context, &mac, &length, mac.count) == 1, length == mac.count
        else { ERR_clear_error(); return false }
        return signature.count == mac.count && CRYPTO_memcmp(mac, signature, mac.count) == 0
    }
}

enum LibCrypto {
    /// SHA-256 of `bytes`.
    static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let done = bytes.withUnsafeBufferPointer { EVP_Digest($0.baseAddress, $0.count, &digest, &length, EVP_sha256(), nil) }
        // Hashing memory cannot fail short of an allocation failure; a zero digest then matches nothing real.
        if done != 1 { ERR_clear_error() }
        return digest
    }
}

/// A public key libcrypto decoded from PEM (SubjectPublicKeyInfo, or PKCS#1 for RSA), and what kind it is.
final class VerifyingKey: @unchecked Sendable {
    enum Kind: Equatable {
        case ed25519
        case p256
        case rsa(bits: Int)
        /// Another key type or curve (Ed448, P-384, secp256k1, DSA, …): not usable for a JOSE algorithm here.
        case other
    }

    /// Never changed after `init`: OpenSSL lets threads verify with one key at the same time.
    private let key: OpaquePointer
    let kind: Kind

    /// Decodes the first public key in `pem`; nil when there is none. A decode that fails is tried twice more: one
    /// daemon start in a test run refused a valid Ed25519 key that every other run accepted, and the cause is not
    /// known (OpenSSL 3.0's decoder set-up racing with another thread's use of libcrypto is the suspect). A key
    /// that is really unusable fails all three times.
    static func decode(pem: String) -> VerifyingKey? {
        for _ in 0..<3 {
            if let key = VerifyingKey(decoding: pem) { return key }
        }
        return nil
    }

    private init?(decoding pem: String) {
        var decoded: OpaquePointer?
        guard let decoder = OSSL_DECODER_CTX_new_for_pkey(&decoded, "PEM", nil, nil, metricsd_select_public_key, nil, nil)
        else { ERR_clear_error(); return nil }
        defer { OSSL_DECODER_CTX_free(decoder) }
        let bytes = Array(pem.utf8)
        let ok = bytes.withUnsafeBufferPointer { buffer -> Bool in
            var data = buffer.baseAddress
            var length = buffer.count
            return OSSL_DECODER_from_data(decoder, &data, &length) == 1
        }
        guard ok, let decoded else {
            if let decoded { EVP_PKEY_free(decoded) }
            ERR_clear_error()
            return nil
        }
        self.key = decoded
        switch EVP_PKEY_get_base_id(decoded) {
        case EVP_PKEY_ED25519:
            self.kind = .ed25519
        case EVP_PKEY_RSA:
            self.kind = .rsa(bits: Int(EVP_PKEY_get_bits(decoded)))
        case EVP_PKEY_EC:
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            let named = EVP_PKEY_get_group_name(decoded, &name, name.count, &length) == 1
            let group = named ? String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
            self.kind = group == "prime256v1" || group == "P-256" ? .p256 : .other
        default:
            self.kind = .other
        }
        ERR_clear_error()
    }

    deinit { EVP_PKEY_free(self.key) }

    /// Whether `signature` signs `message` with this key: Ed25519 over the message itself (RFC 8032), ECDSA and
    /// RSASSA-PKCS1-v1_5 over its SHA-256. `signature` is what libcrypto takes: for ECDSA the DER form (see
    /// ``derECDSASignature(raw:)``).
    func verifies(_ signature: [UInt8], of message: [UInt8]) -> Bool {
        guard let context = EVP_MD_CTX_new() else { ERR_clear_error(); return false }
        defer {
            EVP_MD_CTX_free(context)
            ERR_clear_error()
        }
        let digest = self.kind == .ed25519 ? nil : EVP_sha256()
        guard EVP_DigestVerifyInit(context, nil, digest, nil, self.key) == 1 else { return false }
        return EVP_DigestVerify(context, signature, signature.count, message, message.count) == 1
    }

    /// JOSE's ES256 signature, r‖s of 32 bytes each (RFC 7518 §3.4), as the DER `ECDSA-Sig-Value` libcrypto
    /// verifies; nil for any other length.
    static func derECDSASignature(raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 64, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard let r, let s else {
            BN_free(r)
            BN_free(s)
            ERR_clear_error()
            return nil
        }
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {  // the signature owns r and s from here
            BN_free(r)
            BN_free(s)
            ERR_clear_error()
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { ERR_clear_error(); return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        guard written == length else { ERR_clear_error(); return nil }
        return der
    }
}
