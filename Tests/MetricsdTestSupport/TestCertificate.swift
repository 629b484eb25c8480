import Foundation
import Glibc
import Testing

/// A self-signed certificate for localhost and 127.0.0.1 made by the openssl command, with the key and the dates a
/// test asks for: `openssl ca -selfsign` takes any start and end date (an expired certificate, one not valid yet),
/// which `openssl req -x509 -days` cannot. Each has a random serial, so a test tells which one a server serves.
package struct TestCertificate: Sendable {
    package static let openssl = "/usr/bin/openssl"

    package enum Key: Sendable {
        /// An EC key on a named curve (P-256, P-224, …).
        case ec(String)
        case rsa(bits: Int)
    }

    /// PEM files.
    package let certificate: String
    package let key: String
    /// Upper-case hexadecimal, as `openssl x509 -serial` prints it.
    package let serial: String
    /// Seconds since 1970.
    package let notBefore: Int
    package let notAfter: Int

    /// Now, in seconds since 1970.
    package static var now: Int { Int(Date().timeIntervalSince1970) }

    /// Makes one in a new scratch directory.
    /// - Parameters:
    ///   - validFrom: its notBefore; an hour ago by default.
    ///   - until: its notAfter; 60 days from now by default.
    ///   - names: its subjectAltName; localhost and 127.0.0.1 by default.
    package static func make(
        _ name: String, key: Key = .ec("P-256"), validFrom: Int? = nil, until: Int? = nil,
        names: String = "DNS:localhost,IP:127.0.0.1"
    ) async throws -> TestCertificate {
        try #require(
            FileManager.default.isExecutableFile(atPath: Self.openssl), "\(Self.openssl) is missing: install openssl")
        let directory = URL(fileURLWithPath: try scratchFile("index.txt", "")).deletingLastPathComponent().path
        try Data(Self.caConfiguration(directory).utf8).write(to: URL(fileURLWithPath: directory + "/\(name).cnf"))
        let (notBefore, notAfter) = (validFrom ?? Self.now - 3600, until ?? Self.now + 60 * 86_400)
        let serial = String(format: "%016llX", UInt64.random(in: 1 << 60..<1 << 63))
        try Data((serial + "\n").utf8).write(to: URL(fileURLWithPath: directory + "/serial"))
        let keyOption: [String]
        switch key {
        case .ec(let curve): keyOption = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:\(curve)"]
        case .rsa(let bits): keyOption = ["-newkey", "rsa:\(bits)"]
        }
        let paths = (
            key: directory + "/\(name).key", request: directory + "/\(name).csr",
            certificate: directory + "/\(name).crt"
        )
        let request = try await Subprocess.capture(
            Self.openssl,
            ["req", "-new", "-nodes"] + keyOption + [
                "-subj", "/CN=\(name)", "-addext", "subjectAltName=\(names)", "-keyout", paths.key,
                "-out", paths.request,
            ])
        try #require(request.status == 0, "openssl req: \(request.stderr)")
        chmod(paths.key, 0o600)
        let signed = try await Subprocess.capture(
            Self.openssl,
            [
                "ca", "-batch", "-notext", "-config", directory + "/\(name).cnf", "-selfsign", "-keyfile", paths.key,
                "-in",
                paths.request, "-startdate", Self.generalizedTime(notBefore), "-enddate",
                Self.generalizedTime(notAfter),
                "-out", paths.certificate,
            ])
        try #require(signed.status == 0, "openssl ca: \(signed.stderr)")
        return TestCertificate(
            certificate: paths.certificate, key: paths.key, serial: serial, notBefore: notBefore, notAfter: notAfter)
    }

    /// A throwaway CA's configuration: its database and serial next to it, any subject, the request's
    /// subjectAltName copied.
    static func caConfiguration(_ directory: String) -> String {
        """
        [ca]
        default_ca = throwaway
        [throwaway]
        database = \(directory)/index.txt
        new_certs_dir = \(directory)
        serial = \(directory)/serial
        default_md = sha256
        policy = anything
        copy_extensions = copy
        unique_subject = no
        [anything]
        commonName = supplied

        """
    }

    /// `YYYYMMDDHHMMSSZ`, the date form `openssl ca -startdate/-enddate` takes.
    static func generalizedTime(_ seconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        return String(
            format: "%04d%02d%02d%02d%02d%02dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
            Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
    }

    /// The serial and notAfter (as `openssl x509 -enddate` prints it) of the certificate a new TLS connection to
    /// 127.0.0.1:`port` gets; nil when no handshake.
    package static func served(port: Int) async throws -> (serial: String, notAfter: String)? {
        let result = try await Subprocess.capture(
            "/bin/bash",
            [
                "-c",
                "\(Self.openssl) s_client -connect 127.0.0.1:\(port) -servername localhost </dev/null 2>/dev/null | \(Self.openssl) x509 -noout -serial -enddate",
            ])
        let fields = Dictionary(
            result.stdout.split(separator: "\n").compactMap { line -> (String, String)? in
                guard let equals = line.firstIndex(of: "=") else { return nil }
                return (String(line[..<equals]), String(line[line.index(after: equals)...]))
            }, uniquingKeysWith: { $1 })
        guard let serial = fields["serial"], let notAfter = fields["notAfter"] else { return nil }
        return (serial, notAfter)
    }

    /// This certificate's notAfter as `openssl x509 -enddate` prints it (`Jan  1 00:00:00 2020 GMT`).
    package func printedNotAfter() async throws -> String {
        let result = try await Subprocess.capture(
            Self.openssl, ["x509", "-in", self.certificate, "-noout", "-enddate"])
        return String(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines).dropFirst("notAfter=".count))
    }
}
