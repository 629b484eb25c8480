import Foundation
import Glibc
import MetricsdTestSupport
import Testing

/// The real daemon with certificates it must refuse (expired, an RSA key of 1024 bits) or warn about (expiring
/// within 14 days, not valid yet): at start it exits with one line naming the certificate and what to change; on reload it keeps
/// serving the certificate it had (the serial a TLS client gets says which) and logs the reason at error level;
/// `metricsd_tls_certificate_expiry_timestamp_seconds` on /metrics follows the certificate served.
@Suite struct TLSCertificateTests {
    static let code = "config.tls_certificate_invalid"

    /// The files the daemon serves from, the public listener speaking TLS, the internal one plain (readiness and
    /// /metrics are asked there).
    struct Served {
        let certificate: String
        let key: String
        let publicPort = DaemonProcess.freePort()
        let internalPort = DaemonProcess.freePort()

        init() throws {
            self.certificate = try scratchFile("served.crt", "")
            self.key = self.certificate.replacingOccurrences(of: ".crt", with: ".key")
        }

        /// Puts `made` where the daemon reads its certificate and key.
        func install(_ made: TestCertificate) throws {
            for (from, to) in [(made.certificate, self.certificate), (made.key, self.key)] {
                try? FileManager.default.removeItem(atPath: to)
                try FileManager.default.copyItem(atPath: from, toPath: to)
            }
        }

        func environment(_ database: TestDatabase) -> [String: String] {
            DaemonProcess.environment(
                databaseURL: database.url, port: self.publicPort,
                extra: [
                    "METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(self.internalPort)", "METRICSD_TLS": "public",
                    "METRICSD_TLS_CERTIFICATE_FILE": self.certificate, "METRICSD_TLS_KEY_FILE": self.key,
                ])
        }

        var source: String { "METRICSD_TLS_CERTIFICATE_FILE (\(self.certificate))" }

        /// The expiry gauge of the public listener, from /metrics on the internal listener.
        func expiryGauge() async throws -> Int? {
            let metrics = try await API.send(port: self.internalPort, "/metrics")
            let prefix = "metricsd_tls_certificate_expiry_timestamp_seconds{listener=\"public\"} "
            return metrics.text.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap {
                Double($0.dropFirst(prefix.count))
            }.map { Int($0) }
        }
    }

    @Test func startRefusesAnExpiredCertificateAndAWeakKey() async throws {
        let now = TestCertificate.now
        let expired = try await TestCertificate.make("expired", validFrom: now - 90 * 86_400, until: now - 3600)
        let weak = try await TestCertificate.make("weak", key: .rsa(bits: 1024))
        try await withTestDatabase { database in
            let served = try Served()
            for (made, problem) in [
                (expired, "the TLS certificate (serial \(expired.serial)) expired on "),
                (
                    weak,
                    "the TLS certificate's key is RSA of 1024 bits, under the 2048 needed: issue a certificate for an EC P-256 key"
                ),
            ] {
                try served.install(made)
                let daemon = try DaemonProcess(environment: served.environment(database), port: served.internalPort)
                #expect(await daemon.waitForExit(timeout: .seconds(20)) == 1, "\(daemon.log.suffix(2000))")
                let lines = daemon.log.split(separator: "\n")
                #expect(lines.count == 1, "\(daemon.log)")
                #expect(
                    lines.first?.hasPrefix("Error: configuration error: METRICSD_TLS: \(served.source): \(problem)")
                        == true, "\(daemon.log)")
                #expect(lines.first?.hasSuffix(" [\(Self.code)]") == true, "\(daemon.log)")
                #expect(!RawHTTP.canConnect(port: served.publicPort), "a listener was opened")
            }
        }
    }

    @Test func aReloadKeepsServingTheCertificateItHadWhenTheNewOneIsRefused() async throws {
        let now = TestCertificate.now
        let soon = try await TestCertificate.make("soon", validFrom: now - 80 * 86_400, until: now + 5 * 86_400 + 3600)
        let expired = try await TestCertificate.make("expired", validFrom: now - 90 * 86_400, until: now - 3600)
        let weak = try await TestCertificate.make("weak", key: .rsa(bits: 1024))
        let renewed = try await TestCertificate.make("renewed", until: now + 90 * 86_400)
        let early = try await TestCertificate.make("early", validFrom: now + 86_400, until: now + 91 * 86_400)
        try await withTestDatabase { database in
            let served = try Served()
            try served.install(soon)
            let daemon = try DaemonProcess(environment: served.environment(database), port: served.internalPort)
            try await daemon.waitUntilReady()
            // Served, with a warning at start and its expiry on /metrics.
            #expect(try await TestCertificate.served(port: served.publicPort)?.serial == soon.serial)
            let warned =
                daemon.log.split(separator: "\n").first { $0.contains("TLS certificate needs attention") } ?? ""
            #expect(
                warned.contains("expires on") && warned.contains("in 5 days: renew it and reload"),
                "\(daemon.log.suffix(3000))")
            #expect(try await served.expiryGauge() == soon.notAfter)
            let servedNotAfter = try await soon.printedNotAfter()

            for (made, problem) in [(expired, "expired on"), (weak, "RSA of 1024 bits")] {
                try served.install(made)
                let failures = daemon.log.components(separatedBy: "Reload failed").count
                daemon.signal(SIGHUP)
                let failed = await DaemonProcess.eventually(timeout: .seconds(10)) {
                    daemon.log.components(separatedBy: "Reload failed").count > failures
                }
                let line = daemon.log.split(separator: "\n").last { $0.contains("Reload failed") } ?? ""
                #expect(failed && line.contains(problem) && line.contains(served.source), "\(daemon.log.suffix(3000))")
                #expect(line.contains("error") && line.contains(Self.code), "\(line)")
                let after = try await TestCertificate.served(port: served.publicPort)
                #expect(
                    after?.serial == soon.serial && after?.notAfter == servedNotAfter, "\(String(describing: after))")
                #expect(try await served.expiryGauge() == soon.notAfter)
            }

            // One not valid yet is taken, with a warning on reload.
            try served.install(early)
            daemon.signal(SIGHUP)
            let taken = try await DaemonProcess.eventually(timeout: .seconds(10)) {
                try await TestCertificate.served(port: served.publicPort)?.serial == early.serial
            }
            let notYet = daemon.log.split(separator: "\n").last { $0.contains("TLS certificate needs attention") } ?? ""
            #expect(
                taken && notYet.contains("(serial \(early.serial)) is not valid before"), "\(daemon.log.suffix(3000))")
            #expect(try await served.expiryGauge() == early.notAfter)

            // A good one is taken, and the gauge follows.
            try served.install(renewed)
            daemon.signal(SIGHUP)
            let switched = try await DaemonProcess.eventually(timeout: .seconds(10)) {
                try await TestCertificate.served(port: served.publicPort)?.serial == renewed.serial
            }
            #expect(switched, "\(daemon.log.suffix(3000))")
            #expect(try await served.expiryGauge() == renewed.notAfter)
            await daemon.stop()
        }
    }
}
