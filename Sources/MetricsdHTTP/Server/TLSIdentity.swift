import HealthMetrics
import NIOCore
import NIOSSL
import Synchronization

/// A listener's TLS certificate and key, as swift-nio-ssl serves them, replaceable while the server runs
/// (`systemctl reload` after a renewal): a connection keeps the context it started with, new ones get the new one,
/// and nothing is dropped.
///
/// TLS 1.2 and 1.3 only (1.3 preferred: BoringSSL negotiates the highest both sides have), and for TLS 1.2 only
/// forward-secret AEAD suites (ECDHE with AES-GCM or ChaCha20-Poly1305): an outside scanner finds no weak protocol
/// or cipher. TLS 1.3's suites are all of that kind already.
package final class TLSIdentity: Sendable {
    private let context: Mutex<NIOSSLContext>
    private let expiry: Mutex<Int>

    /// The cipher suites offered under TLS 1.2.
    static let tls12Ciphers = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

    /// - Parameters:
    ///   - certificate: PEM, the server's certificate first, then its intermediates (certbot's `fullchain.pem`).
    ///   - key: PEM, the matching private key.
    /// - Throws: a ``TLSIdentityError`` saying what is wrong, in one line.
    package init(certificate: String, key: String) throws(TLSIdentityError) {
        let (context, expiry) = try Self.make(certificate: certificate, key: key)
        self.context = Mutex(context)
        self.expiry = Mutex(expiry)
    }

    /// The context new connections get.
    var current: NIOSSLContext { self.context.withLock { $0 } }

    /// When the certificate in use expires (seconds since 1970).
    package var notValidAfter: Int { self.expiry.withLock { $0 } }

    /// Replaces the certificate and key for new connections; on error the old ones stay.
    package func replace(certificate: String, key: String) throws(TLSIdentityError) {
        let (context, expiry) = try Self.make(certificate: certificate, key: key)
        self.context.withLock { $0 = context }
        self.expiry.withLock { $0 = expiry }
    }

    /// Checks a certificate and key without serving them: the chain parses, the key parses and matches.
    /// - Returns: when the certificate expires (seconds since 1970).
    @discardableResult
    package static func validate(certificate: String, key: String) throws(TLSIdentityError) -> Int {
        try Self.make(certificate: certificate, key: key).1
    }

    private static func make(certificate: String, key: String) throws(TLSIdentityError) -> (NIOSSLContext, Int) {
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMBytes(Array(certificate.utf8))
        } catch {
            throw TLSIdentityError("the TLS certificate is not a PEM certificate (\(error))")
        }
        guard let leaf = chain.first else { throw TLSIdentityError("the TLS certificate file holds no PEM certificate") }
        let privateKey: NIOSSLPrivateKey
        do {
            privateKey = try NIOSSLPrivateKey(bytes: Array(key.utf8), format: .pem)
        } catch {
            throw TLSIdentityError("the TLS key is not a PEM private key (\(error))")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(privateKey))
        configuration.minimumTLSVersion = .tlsv12
        configuration.cipherSuites = Self.tls12Ciphers
        configuration.applicationProtocols = ["http/1.1"]
        do {
            return (try NIOSSLContext(configuration: configuration), Int(leaf.notValidAfter))
        } catch {
            throw TLSIdentityError("the TLS key does not match the certificate, or neither can be used (\(error))")
        }
    }
}

/// A certificate or key that cannot be served; the message says why, in one line.
package struct TLSIdentityError: CodedError, Sendable {
    package let message: String
    init(_ message: String) { self.message = message }
    package var description: String { self.message }
    /// The same code as the configuration's: the certificate or key from the settings cannot be used.
    package var errorCode: String { "config.tls_certificate_invalid" }
}
