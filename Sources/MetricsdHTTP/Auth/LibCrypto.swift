import CLibCrypto

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

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
        guard let mac = EVP_MAC_fetch(nil, "HMAC", nil) else {
            ERR_clear_error()
            return nil
        }
        defer { EVP_MAC_free(mac) }
        guard let context = EVP_MAC_CTX_new(mac) else {
            ERR_clear_error()
            return nil
        }
        var digest = Array("SHA256".utf8CString)
        let initialised = digest.withUnsafeMutableBufferPointer { name in
            var parameters = [
                OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, name.baseAddress, 0),
                OSSL_PARAM_construct_end(),
            ]
            return key.withUnsafeBufferPointer { EVP_MAC_init(context, $0.baseAddress, $0.count, &parameters) }
        }
        guard initialised == 1 else {
            EVP_MAC_CTX_free(context)
            ERR_clear_error()
            return nil
        }
        self.keyed = context
    }

    deinit { EVP_MAC_CTX_free(self.keyed) }

    /// Whether `signature` is the MAC of `message`, compared in time that depends only on the lengths.
    func authenticates(_ message: UnsafeRawBufferPointer, signature: [UInt8]) -> Bool {
        guard let context = EVP_MAC_CTX_dup(self.keyed) else {
            ERR_clear_error()
            return false
        }
        defer { EVP_MAC_CTX_free(context) }
        var mac = [UInt8](repeating: 0, count: 32)
        var length = 0
        guard EVP_MAC_update(context, message.baseAddress?.assumingMemoryBound(to: UInt8.self), message.count) == 1,
            EVP_MAC_final(context, &mac, &length, mac.count) == 1, length == mac.count
        else {
            ERR_clear_error()
            return false
        }
        return signature.count == mac.count && CRYPTO_memcmp(mac, signature, mac.count) == 0
    }
}

enum LibCrypto {
    /// SHA-256 of `bytes`.
    static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let done = bytes.withUnsafeBufferPointer {
            EVP_Digest($0.baseAddress, $0.count, &digest, &length, EVP_sha256(), nil)
        }
        // Hashing memory cannot fail short of an allocation failure; a zero digest then matches nothing real.
        if done != 1 { ERR_clear_error() }
        return digest
    }
}

/// A public key libcrypto decoded from PEM: SubjectPublicKeyInfo (`BEGIN PUBLIC KEY`), or PKCS#1 for RSA
/// (`BEGIN RSA PUBLIC KEY`), and what kind it is.
///
/// The DER is decoded with libcrypto's ASN.1 functions (`d2i_PUBKEY`, `d2i_PublicKey`), not its provider decoder
/// framework (`OSSL_DECODER`): one daemon start in a test run had that framework refuse a valid Ed25519 key that
/// every other start accepted, and the ASN.1 path needs no decoder look-up and keeps no pointer to the caller's
/// variables between calls.
final class VerifyingKey: @unchecked Sendable {
    enum Kind: Equatable {
        case ed25519
        case p256
        case rsa(bits: Int)
        /// Another key type or curve (Ed448, P-384, secp256k1, DSA, …): not usable for a JOSE algorithm here.
        case other
    }

    /// Why a PEM gave no key, in libcrypto's words where it had some.
    struct Refusal: Error, Equatable {
        let reason: String
    }

    /// Never changed after `init`: OpenSSL lets threads verify with one key at the same time.
    private let key: OpaquePointer
    let kind: Kind

    /// Decodes the first public key block in `pem`.
    init(pem: String) throws(Refusal) {
        let (label, der) = try Self.firstPublicKeyBlock(pem)
        ERR_clear_error()
        let decoded: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            let key =
                label == "PUBLIC KEY"
                ? d2i_PUBKEY(nil, &cursor, buffer.count)
                : d2i_PublicKey(EVP_PKEY_RSA, nil, &cursor, buffer.count)
            // DER after the key would be a different document: refuse it rather than ignore it.
            guard let key, cursor == buffer.baseAddress.map({ $0 + buffer.count }) else {
                if let key { EVP_PKEY_free(key) }
                return nil
            }
            return key
        }
        guard let decoded else {
            throw Refusal(reason: Self.libcryptoReason() ?? "the DER after \(label) is not a key libcrypto reads")
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
        // Set up a verification once now: libcrypto then holds the key in its provider's form for every later
        // check, and a key it cannot verify with is refused at start-up rather than on the first request.
        if self.kind != .other {
            guard let context = self.verificationContext() else {
                throw Refusal(reason: Self.libcryptoReason() ?? "libcrypto cannot verify signatures with this key")
            }
            EVP_MD_CTX_free(context)
        }
    }

    /// A digest-verify context set up for this key: Ed25519 signs the message itself, ECDSA and RSA its SHA-256.
    /// nil when libcrypto refuses (its error stays queued); the caller frees the context.
    private func verificationContext() -> OpaquePointer? {
        guard let context = EVP_MD_CTX_new() else { return nil }
        let digest = self.kind == .ed25519 ? nil : EVP_sha256()
        guard EVP_DigestVerifyInit(context, nil, digest, nil, self.key) == 1 else {
            EVP_MD_CTX_free(context)
            return nil
        }
        return context
    }

    /// The label and DER of the first `-----BEGIN PUBLIC KEY-----` block, else of the first
    /// `-----BEGIN RSA PUBLIC KEY-----` block.
    private static func firstPublicKeyBlock(_ pem: String) throws(Refusal) -> (label: String, der: [UInt8]) {
        let lines = pem.split(whereSeparator: \.isNewline).map { line in
            String(line.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed())
        }
        for label in ["PUBLIC KEY", "RSA PUBLIC KEY"] {
            guard let begin = lines.firstIndex(of: "-----BEGIN \(label)-----"),
                let end = lines[begin...].firstIndex(of: "-----END \(label)-----")
            else { continue }
            guard let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()), !der.isEmpty else {
                throw Refusal(reason: "the BEGIN \(label) block is not base64")
            }
            return (label, Array(der))
        }
        throw Refusal(reason: "no BEGIN PUBLIC KEY or BEGIN RSA PUBLIC KEY block")
    }

    /// The first error libcrypto queued (e.g. `error:0680007B:asn1 encoding routines::header too long`); the
    /// queue is emptied.
    private static func libcryptoReason() -> String? {
        let code = ERR_get_error()
        defer { ERR_clear_error() }
        guard code != 0 else { return nil }
        var text = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &text, text.count)
        return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }  // NUL-terminated by libcrypto
    }

    deinit { EVP_PKEY_free(self.key) }

    /// Whether `signature` signs `message` with this key: Ed25519 over the message itself (RFC 8032), ECDSA and
    /// RSASSA-PKCS1-v1_5 over its SHA-256. `signature` is what libcrypto takes: for ECDSA the DER form (see
    /// ``derECDSASignature(raw:)``).
    func verifies(_ signature: [UInt8], of message: [UInt8]) -> Bool {
        defer { ERR_clear_error() }
        guard let context = self.verificationContext() else { return false }
        defer { EVP_MD_CTX_free(context) }
        return EVP_DigestVerify(context, signature, signature.count, message, message.count) == 1
    }

    /// JOSE's ES256 signature, r‖s of 32 bytes each (RFC 7518 §3.4), as the DER `ECDSA-Sig-Value` libcrypto
    /// verifies; nil for any other length.
    static func derECDSASignature(raw: [UInt8]) -> [UInt8]? {
        defer { ERR_clear_error() }
        guard raw.count == 64, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        // The signature owns r and s once ECDSA_SIG_set0 takes them; until then they are freed here.
        guard let r, let s, ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == length ? der : nil
    }
}
