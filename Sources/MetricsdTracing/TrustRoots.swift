import NIOSSL

/// The certificate authorities an `https://` OTLP endpoint is verified against instead of the system's: the
/// certificates of one PEM file (`OTEL_EXPORTER_OTLP_CERTIFICATE`), parsed when the configuration is read, so that
/// a file that holds none is refused at start and by `check-config`, not found out at the first export.
public struct TrustRoots: Sendable, Equatable {
    /// Where they were read from (for messages).
    public let path: String
    let certificates: [NIOSSLCertificate]

    /// Parses `pem`, the text of the file at `path`.
    /// - Throws: a ``TrustRootsError`` naming the file and what is wrong with it.
    public init(path: String, pem: String) throws(TrustRootsError) {
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))
        } catch {
            throw TrustRootsError(message: "\(path) is not a PEM certificate file (\(error))")
        }
        guard !certificates.isEmpty else {
            throw TrustRootsError(message: "\(path) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        self.path = path
        self.certificates = certificates
    }

    /// How many certificates the file holds.
    public var count: Int { self.certificates.count }
}

public struct TrustRootsError: Error, Sendable {
    public let message: String
}

extension TracingSettings {
    /// The exporter's TLS client context for an `https://` endpoint: TLS 1.2 or later; the receiver's certificate
    /// verified, its chain against ``trustRoots`` (else the system's trust roots) and its name against the
    /// endpoint's host (an IP address against the certificate's IP addresses).
    func makeTLSContext() throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.certificateVerification = .fullVerification
        if let trustRoots = self.trustRoots {
            configuration.trustRoots = .certificates(trustRoots.certificates)
        }
        return try NIOSSLContext(configuration: configuration)
    }
}
