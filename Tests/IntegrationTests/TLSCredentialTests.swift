import Foundation
import MetricsdTestSupport
import Testing

/// Certificates `check-config` and `refresh-credentials` refuse (expired, a weak key) or warn about (expiring
/// within 14 days, not valid yet), each in one line naming where the certificate comes from and what to do.
@Suite struct TLSCredentialTests {
    static let code = "config.tls_certificate_invalid"

    /// The settings of a configuration that is otherwise fine, serving `made` on the public listener.
    static func settings(_ database: TestDatabase, _ made: TestCertificate) -> String {
        """
        DATABASE_URL=\(database.url)
        METRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())
        METRICSD_TLS=public
        METRICSD_TLS_CERTIFICATE_FILE=\(made.certificate)
        METRICSD_TLS_KEY_FILE=\(made.key)

        """
    }

    @Test func checkConfigRefusesAnExpiredCertificateAndAWeakKey() async throws {
        let now = TestCertificate.now
        let expired = try await TestCertificate.make("expired", validFrom: now - 90 * 86_400, until: now - 3600)
        let weak = try await TestCertificate.make("weak", key: .rsa(bits: 1024))
        let source = { (made: TestCertificate) in "METRICSD_TLS_CERTIFICATE_FILE (\(made.certificate))" }
        let cases = [
            (
                expired,
                "the TLS certificate (serial \(expired.serial)) expired on \(TLSDates.utc(expired.notAfter)): install a renewed certificate"
            ),
            (
                weak,
                "the TLS certificate's key is RSA of 1024 bits, under the 2048 needed: issue a certificate for an EC P-256 key (certbot --key-type ecdsa) or an RSA key of at least 2048 bits"
            ),
        ]
        try await withTestDatabase { database in
            for (made, problem) in cases {
                let files = try CommandLineTests.HostFiles(settings: Self.settings(database, made))
                let result = try await CommandLineTests.metricsd(["check-config"], files.environment)
                #expect(result.status == 78, "\(result)")
                #expect(
                    result.stderr.split(separator: "\n").map(String.init) == [
                        "metricsd: METRICSD_TLS: \(source(made)): \(problem) [\(Self.code)]"
                    ],
                    "\(result.stderr)")
                #expect(result.stdout.hasPrefix("configuration has 1 problem\n"), "\(result.stdout)")
            }
        }
    }

    @Test func checkConfigWarnsOfACertificateExpiringSoonOrNotValidYet() async throws {
        let now = TestCertificate.now
        let soon = try await TestCertificate.make("soon", validFrom: now - 80 * 86_400, until: now + 4 * 86_400 + 3600)
        let later = try await TestCertificate.make("later", validFrom: now + 2 * 86_400, until: now + 92 * 86_400)
        let cases = [
            (
                soon,
                "the TLS certificate (serial \(soon.serial)) expires on \(TLSDates.utc(soon.notAfter)), in 4 days: renew it and reload"
            ),
            (
                later,
                "the TLS certificate (serial \(later.serial)) is not valid before \(TLSDates.utc(later.notBefore)): clients refuse it until then (check the host's clock, or keep the previous certificate until that time)"
            ),
        ]
        try await withTestDatabase { database in
            for (made, warning) in cases {
                let files = try CommandLineTests.HostFiles(settings: Self.settings(database, made))
                let result = try await CommandLineTests.metricsd(["check-config"], files.environment)
                #expect(result.status == 0, "\(result)")
                #expect(
                    result.stderr
                        == "metricsd: warning: METRICSD_TLS: METRICSD_TLS_CERTIFICATE_FILE (\(made.certificate)): \(warning)\n",
                    "\(result.stderr)")
                #expect(result.stdout.hasPrefix("configuration OK (1 warning)\n"), "\(result.stdout)")
                #expect(
                    result.stdout.contains(
                        "  tls:          public listener, certificate valid until \(TLSDates.utc(made.notAfter)) (EC P-256, serial \(made.serial))"
                    ),
                    "\(result.stdout)")
            }
        }
    }

    /// refresh-credentials refuses what the service would refuse (exit 78, the copy in place stays) and passes the
    /// warnings on.
    @Test func refreshCredentialsInstallsNothingTheServiceWouldRefuse() async throws {
        let now = TestCertificate.now
        let good = try await TestCertificate.make("good")
        let expired = try await TestCertificate.make("expired", validFrom: now - 90 * 86_400, until: now - 60)
        let weak = try await TestCertificate.make("weak", key: .rsa(bits: 1024))
        let soon = try await TestCertificate.make("soon", validFrom: now - 80 * 86_400, until: now + 2 * 86_400 + 3600)
        let base = try ScratchFiles.directory("refresh-dates")
        let (store, runtime) = (base + "/credstore", base + "/run")
        for directory in [store, runtime] {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
        let refresh = { (made: TestCertificate) async throws -> (status: Int32, stdout: String, stderr: String) in
            for (from, to) in [(made.certificate, "metricsd-tls-certificate"), (made.key, "metricsd-tls-key")] {
                try? FileManager.default.removeItem(atPath: store + "/" + to)
                try FileManager.default.copyItem(atPath: from, toPath: store + "/" + to)
            }
            return try await CommandLineTests.metricsd(
                ["refresh-credentials"], ["METRICSD_CREDSTORE": store, "RUNTIME_DIRECTORY": runtime])
        }
        let installed = { try String(contentsOfFile: runtime + "/credentials/tls-certificate", encoding: .utf8) }
        #expect(try await refresh(good).status == 0)
        let goodText = try installed()
        let sources = "\(store)/metricsd-tls-certificate, \(store)/metricsd-tls-key"
        for (made, problem) in [
            (expired, "expired on \(TLSDates.utc(expired.notAfter))"),
            (weak, "RSA of 1024 bits, under the 2048 needed"),
        ] {
            let result = try await refresh(made)
            #expect(result.status == 78, "\(result)")
            #expect(
                result.stderr.hasPrefix("metricsd: refresh-credentials: \(sources): the TLS certificate"),
                "\(result.stderr)")
            #expect(
                result.stderr.contains(problem) && result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
            #expect(try installed() == goodText, "the refused certificate was installed")
        }
        let warned = try await refresh(soon)
        #expect(warned.status == 0, "\(warned)")
        #expect(
            warned.stderr
                == "metricsd: refresh-credentials: warning: \(store)/metricsd-tls-certificate: the TLS certificate (serial \(soon.serial)) expires on \(TLSDates.utc(soon.notAfter)), in 2 days: renew it and reload\n",
            "\(warned.stderr)")
        #expect(try installed() != goodText)
    }
}

/// Dates as metricsd prints them: `2027-01-31 12:00 UTC`.
enum TLSDates {
    static func utc(_ seconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        return String(
            format: "%04d-%02d-%02d %02d:%02d UTC", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday),
            Int(parts.tm_hour), Int(parts.tm_min))
    }
}
