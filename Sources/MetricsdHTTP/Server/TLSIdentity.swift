import CoreMetrics
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
    /// The context new connections get, and what its certificate was found to be.
    private let loaded: Mutex<(context: NIOSSLContext, check: TLSCertificateCheck)>
    /// `metricsd_tls_certificate_expiry_timestamp_seconds` of each listener that serves this certificate.
    private let expiryGauges = Mutex<[Gauge]>([])

    /// The cipher suites offered under TLS 1.2.
    static let tls12Ciphers =
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

    /// - Parameters:
    ///   - certificate: PEM, the server's certificate first, then its intermediates (certbot's `fullchain.pem`).
    ///   - key: PEM, the matching private key.
    ///   - now: the time to check the certificate's dates at (seconds since 1970).
    /// - Throws: a ``TLSIdentityError`` saying what is wrong, in one line: also an expired certificate or a weak
    ///   key (``TLSCertificateCheck``).
    package init(certificate: String, key: String, now: Int = TLSCertificateCheck.now()) throws(TLSIdentityError) {
        self.loaded = Mutex(try Self.make(certificate: certificate, key: key, now: now))
    }

    /// The context new connections get.
    var current: NIOSSLContext { self.loaded.withLock { $0.context } }

    /// The certificate in use: its dates, key and the warnings it had when loaded.
    package var certificate: TLSCertificateCheck { self.loaded.withLock { $0.check } }

    /// When the certificate in use expires (seconds since 1970).
    package var notValidAfter: Int { self.certificate.notValidAfter }

    /// Exports the certificate's expiry as `metricsd_tls_certificate_expiry_timestamp_seconds{listener}`, kept
    /// current through ``replace(certificate:key:now:)``.
    package func exportExpiry(listener: String) {
        let gauge = Gauge(
            label: "metricsd_tls_certificate_expiry_timestamp_seconds", dimensions: [("listener", listener)])
        gauge.record(self.notValidAfter)
        self.expiryGauges.withLock { $0.append(gauge) }
    }

    /// Replaces the certificate and key for new connections; on error the old ones stay.
    /// - Returns: the new certificate's check, with its warnings.
    @discardableResult
    package func replace(certificate: String, key: String, now: Int = TLSCertificateCheck.now())
        throws(TLSIdentityError)
        -> TLSCertificateCheck
    {
        let (context, check) = try Self.make(certificate: certificate, key: key, now: now)
        self.loaded.withLock { $0 = (context, check) }
        for gauge in self.expiryGauges.withLock({ $0 }) { gauge.record(check.notValidAfter) }
        return check
    }

    /// Checks a certificate and key without serving them: the chain parses, the key parses and matches, the
    /// certificate has not expired and its key is strong enough.
    /// - Returns: the certificate's dates, key and warnings.
    @discardableResult
    package static func validate(
        certificate: String, key: String, now: Int = TLSCertificateCheck.now()
    ) throws(TLSIdentityError) -> TLSCertificateCheck {
        try Self.make(certificate: certificate, key: key, now: now).check
    }

    private static func make(
        certificate: String, key: String, now: Int
    ) throws(TLSIdentityError) -> (context: NIOSSLContext, check: TLSCertificateCheck) {
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMBytes(Array(certificate.utf8))
        } catch {
            throw TLSIdentityError("the TLS certificate is not a PEM certificate (\(error))")
        }
        guard let leaf = chain.first else {
            throw TLSIdentityError("the TLS certificate file holds no PEM certificate")
        }
        let check = try TLSCertificateCheck(leaf: leaf, now: now)
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
            return (try NIOSSLContext(configuration: configuration), check)
        } catch {
            throw TLSIdentityError("the TLS key does not match the certificate, or neither can be used (\(error))")
        }
    }
}

/// A certificate or key that cannot be served; the message says why, in one line.
package struct TLSIdentityError: CodedError, Sendable {
    package let message: String
    init(_ message: String) { self.message = message }

    /// The same error with where the certificate came from in front: `credential tls-certificate: …`.
    package func from(_ source: String) -> TLSIdentityError { TLSIdentityError("\(source): \(self.message)") }
    package var description: String { self.message }
    /// The same code as the configuration's: the certificate or key from the settings cannot be used.
    package var errorCode: String { "config.tls_certificate_invalid" }
}
