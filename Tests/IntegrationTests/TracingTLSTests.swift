import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// Traces to an `https://` OTLP receiver (``OTLPReceiver`` serving a throwaway certificate for 127.0.0.1, made with
/// openssl): trusted through `OTEL_EXPORTER_OTLP_CERTIFICATE`, the spans arrive; not trusted, none does, the
/// export's failure is logged and its spans counted as dropped, and the daemon serves on. A CA file that is not
/// one is refused by `check-config`.
@Suite struct TracingTLSTests {
    /// A receiver on HTTPS and a daemon tracing every request to it, with `certificate` as its CA file when given.
    static func start(
        _ database: TestDatabase, receiverCertificate: TestCertificate, caFile: String?
    ) async throws -> (receiver: OTLPReceiver, daemon: DaemonProcess) {
        let receiver = try OTLPReceiver(certificate: receiverCertificate)
        try await receiver.waitUntilReady()
        var extra = [
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_SAMPLER": "always_on",
            "METRICSD_DAILY_AT": "00:00", "METRICSD_WORKERS": "1",
        ]
        if let caFile { extra["OTEL_EXPORTER_OTLP_CERTIFICATE"] = caFile }
        let port = DaemonProcess.freePort()
        let daemon = try DaemonProcess(
            environment: DaemonProcess.environment(databaseURL: database.url, port: port, extra: extra), port: port)
        try await daemon.waitUntilReady()
        return (receiver, daemon)
    }

    /// The read's trace id, from the `traceparent` it answered with.
    static func tracedRead(_ daemon: DaemonProcess) async throws -> String {
        let response = try await daemon.request(
            TracingTests.latestPath, headers: TestTokens.bearer(TestTokens.user(TracingTests.userID)))
        #expect(response.status == .ok, "\(response.text)")
        let answered = try #require(response.headers[HTTPField.Name("traceparent")!])
        return String(answered.split(separator: "-")[1])
    }

    @Test func spansArriveOverTLSWithTheCAFile() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(TracingTests.userID)])
            let certificate = try await TestCertificate.make("otlp-receiver")
            let (receiver, daemon) = try await Self.start(
                database, receiverCertificate: certificate, caFile: certificate.certificate)
            #expect(receiver.endpoint.hasPrefix("https://"))
            let traceID = try await Self.tracedRead(daemon)
            let spans = await receiver.spans { spans in spans.contains { $0.traceID == traceID && $0.kind == 2 } }
            #expect(
                spans.contains { $0.traceID == traceID && $0.kind == 2 },
                "received: \(spans.map(\.name)); handshakes: \(receiver.failedHandshakes)\n\(daemon.log.suffix(2000))")
            #expect(receiver.failedHandshakes.isEmpty, "\(receiver.failedHandshakes)")
            #expect(receiver.rejected.isEmpty, "\(receiver.rejected)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// A receiver the daemon must not trust: its certificate unknown to the system's roots (no CA file), or
    /// trusted but for another name than the endpoint's host.
    enum Untrusted: String, CaseIterable, Sendable {
        case unknownIssuer
        case otherName
    }

    /// The handshake fails, nothing arrives, the failure is logged with its reason and the spans counted as
    /// dropped; reads go on.
    @Test(arguments: Untrusted.allCases)
    func untrustedReceiverGetsNothingAndTheDropsAreCounted(_ untrusted: Untrusted) async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(TracingTests.userID)])
            let certificate = try await TestCertificate.make(
                "otlp-untrusted",
                names: untrusted == .otherName ? "DNS:collector.example" : "DNS:localhost,IP:127.0.0.1")
            let (receiver, daemon) = try await Self.start(
                database, receiverCertificate: certificate,
                caFile: untrusted == .otherName ? certificate.certificate : nil)
            _ = try await Self.tracedRead(daemon)
            var dropped = 0.0
            let counted = try await DaemonProcess.eventually(timeout: .seconds(15)) {
                dropped =
                    PrometheusScrape.value(
                        try await PrometheusScrape.scrape(daemon), "metricsd_trace_spans_dropped_total") ?? 0
                return dropped > 0 && daemon.log.contains("Trace export failed; spans dropped")
            }
            #expect(counted, "dropped \(dropped)\n\(daemon.log.suffix(2000))")
            let line = daemon.log.split(separator: "\n").first { $0.contains("Trace export failed") } ?? ""
            #expect(
                line.contains(untrusted == .otherName ? "Hostname" : "CERTIFICATE_VERIFY_FAILED"),
                "the failure does not say why: \(line)")
            #expect(!receiver.failedHandshakes.isEmpty, "the daemon never tried the receiver")
            #expect(
                receiver.requests == 0 && receiver.spans.isEmpty,
                "exported to an untrusted receiver: \(receiver.spans.map(\.name))")
            let again = try await daemon.request(
                TracingTests.latestPath, headers: TestTokens.bearer(TestTokens.user(TracingTests.userID)))
            #expect(again.status == .ok)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// `check-config` refuses a CA file that holds no certificate, one that cannot be read, and one given for an
    /// `http://` endpoint, naming the variable.
    @Test(arguments: [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "https://127.0.0.1:4318", "not a certificate\n", "PEM"),
        ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "https://127.0.0.1:4318", nil, "cannot read"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "http://127.0.0.1:4318", "unused\n", "which is not https"),
    ])
    func checkConfigRefusesABadCAFile(variable: String, endpoint: String, content: String?, expected: String)
        async throws
    {
        let directory = try ScratchFiles.directory("otlp-ca")
        let path = directory + "/ca.pem"
        if let content { try ScratchFiles.write(content, to: path) }
        let files = try CommandLineTests.HostFiles(
            settings: "OTEL_TRACES_EXPORTER=otlp\nOTEL_EXPORTER_OTLP_ENDPOINT=\(endpoint)\n\(variable)=\(path)\n")
        let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
        #expect(check.status == 78, "\(check)")
        #expect(check.stderr.contains(variable) && check.stderr.contains(expected), "\(check.stderr)")
    }
}
