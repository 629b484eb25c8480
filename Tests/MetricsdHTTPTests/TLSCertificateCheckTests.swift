import Foundation
import MetricsdTestSupport
import Testing

@testable import MetricsdHTTP

/// What a certificate is held to before it is served (``TLSCertificateCheck``), with certificates the openssl
/// command makes and the clock given to the check: an expired certificate and a weak key are refused, a
/// certificate not valid yet or expiring within 14 days is served with a warning.
@Suite struct TLSCertificateCheckTests {
    static func texts(_ made: TestCertificate) throws -> (certificate: String, key: String) {
        (
            try String(contentsOfFile: made.certificate, encoding: .utf8),
            try String(contentsOfFile: made.key, encoding: .utf8)
        )
    }

    /// The refusal's message, or nil when the pair is accepted at `now`.
    static func refusal(_ made: TestCertificate, now: Int) throws -> String? {
        let (certificate, key) = try Self.texts(made)
        do {
            try TLSIdentity.validate(certificate: certificate, key: key, now: now)
            return nil
        } catch {
            return error.message
        }
    }

    @Test func theDatesDecideBetweenRefusalWarningAndNothing() async throws {
        let made = try await TestCertificate.make(
            "dates", validFrom: TestCertificate.now - 86_400, until: TestCertificate.now + 40 * 86_400)
        let (certificate, key) = try Self.texts(made)
        let check = try TLSIdentity.validate(certificate: certificate, key: key, now: made.notBefore + 60)
        #expect(check.notValidBefore == made.notBefore && check.notValidAfter == made.notAfter)
        #expect(check.serial == made.serial && check.key == "EC P-256")
        #expect(check.warnings == [], "\(check.warnings)")

        // The last second of its validity: served, with the warning that it expires.
        let lastSecond = try TLSIdentity.validate(certificate: certificate, key: key, now: made.notAfter - 1)
        #expect(
            lastSecond.warnings.count == 1 && lastSecond.warnings[0].contains("expires on"), "\(lastSecond.warnings)")
        #expect(lastSecond.warnings[0].contains("in less than a day: renew it and reload"), "\(lastSecond.warnings)")
        // 14 days ahead is the edge of the warning.
        let edge = made.notAfter - TLSCertificateCheck.expiryWarningSeconds
        #expect(try TLSIdentity.validate(certificate: certificate, key: key, now: edge).warnings == [])
        let inside = try TLSIdentity.validate(certificate: certificate, key: key, now: edge + 1)
        #expect(
            inside.warnings.count == 1 && inside.warnings[0].contains(", in 13 days: renew it"), "\(inside.warnings)")

        let expired = try Self.refusal(made, now: made.notAfter)
        let date = TLSCertificateCheck.date(made.notAfter)
        #expect(
            expired == "the TLS certificate (serial \(made.serial)) expired on \(date): install a renewed certificate",
            "\(expired ?? "accepted")")

        // Before its notBefore: served (a clock a little behind), with the warning saying when it starts.
        let early = try TLSIdentity.validate(certificate: certificate, key: key, now: made.notBefore - 60)
        #expect(early.warnings.count == 1, "\(early.warnings)")
        #expect(
            early.warnings.first?.contains(
                "is not valid before \(TLSCertificateCheck.date(made.notBefore)): clients refuse it") == true)
    }

    @Test func weakKeysAreRefusedWithWhatToUseInstead() async throws {
        let now = TestCertificate.now
        let rsa1024 = try await TestCertificate.make("rsa1024", key: .rsa(bits: 1024))
        let refusal = try Self.refusal(rsa1024, now: now)
        #expect(
            refusal
                == "the TLS certificate's key is RSA of 1024 bits, under the 2048 needed: issue a certificate for an EC P-256 key (certbot --key-type ecdsa) or an RSA key of at least 2048 bits",
            "\(refusal ?? "accepted")")
        let p224 = try await TestCertificate.make("p224", key: .ec("P-224"))
        let curve = try Self.refusal(p224, now: now)
        #expect(
            curve?.hasPrefix(
                "the TLS certificate's key is EC on P-224 (224 bits), not P-256, P-384 or P-521: issue a certificate")
                == true, "\(curve ?? "accepted")")
        let secp256k1 = try await TestCertificate.make("k1", key: .ec("secp256k1"))
        #expect(try Self.refusal(secp256k1, now: now)?.contains("EC on secp256k1 (256 bits), not P-256") == true)

        // An expired certificate with a weak key: the key is named (renewing it as it is would not help).
        let both = try await TestCertificate.make(
            "both", key: .rsa(bits: 1024), validFrom: now - 90 * 86_400, until: now - 86_400)
        #expect(try Self.refusal(both, now: now)?.contains("RSA of 1024 bits") == true)

        for (key, name) in [(TestCertificate.Key.rsa(bits: 2048), "RSA 2048 bits"), (.ec("P-384"), "EC P-384")] {
            let made = try await TestCertificate.make("strong", key: key)
            let (certificate, text) = try Self.texts(made)
            #expect(try TLSIdentity.validate(certificate: certificate, key: text, now: now).key == name)
        }
    }

    /// A replaced certificate is checked the same way; a refused one leaves the one in use.
    @Test func aRefusedReplacementKeepsTheCertificateInUse() async throws {
        let first = try await TestCertificate.make("first")
        let expired = try await TestCertificate.make(
            "expired", validFrom: TestCertificate.now - 10 * 86_400, until: TestCertificate.now - 60)
        let (certificate, key) = try Self.texts(first)
        let identity = try TLSIdentity(certificate: certificate, key: key)
        let (old, oldKey) = try Self.texts(expired)
        #expect(throws: TLSIdentityError.self) { try identity.replace(certificate: old, key: oldKey) }
        #expect(identity.certificate.serial == first.serial && identity.notValidAfter == first.notAfter)
        #expect(throws: TLSIdentityError.self) { try TLSIdentity(certificate: old, key: oldKey) }
    }
}
