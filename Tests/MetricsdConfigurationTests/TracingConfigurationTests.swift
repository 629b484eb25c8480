import MetricsdConfiguration
import MetricsdTestSupport
import MetricsdTracing
import Testing

/// The `OTEL_*` variables: tracing off unless asked for, the standard defaults, and a clear error for what is not
/// supported or not valid.
@Suite struct TracingConfigurationTests {
    static let base = ["METRICSD_JWT_SECRET": String(repeating: "j", count: 48)]

    static func configuration(_ variables: [String: String]) throws -> Configuration {
        try Configuration(environment: Self.base.merging(variables) { $1 })
    }

    static func message(_ variables: [String: String]) -> String? {
        do {
            _ = try Configuration(environment: Self.base.merging(variables) { $1 })
            return nil
        } catch {
            return error.message
        }
    }

    @Test func offByDefaultAndWithNone() throws {
        #expect(try Self.configuration([:]).tracing == nil)
        #expect(
            try Self.configuration(["OTEL_TRACES_EXPORTER": "none", "OTEL_TRACES_SAMPLER": "always_on"]).tracing == nil)
    }

    @Test func otlpWithTheStandardDefaults() throws {
        let tracing = try #require(try Self.configuration(["OTEL_TRACES_EXPORTER": "otlp"]).tracing)
        #expect(tracing.endpoint == TracingSettings.Endpoint(host: "localhost", port: 4318, path: "/v1/traces"))
        #expect(tracing.sampler == Sampler(root: .alwaysOn, followsParent: true))
        #expect(tracing.serviceName == "metricsd")
    }

    @Test func endpointsSamplerAndName() throws {
        let tracing = try #require(
            try Self.configuration([
                "OTEL_TRACES_EXPORTER": "OTLP", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:14318/collector/",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01",
                "OTEL_SERVICE_NAME": "metricsd-eu1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
            ]).tracing)
        #expect(tracing.endpoint == TracingSettings.Endpoint(host: "::1", port: 14318, path: "/collector/v1/traces"))
        #expect(tracing.sampler == Sampler(root: .ratio(0.01), followsParent: true))
        #expect(tracing.serviceName == "metricsd-eu1")
        // The traces endpoint is used as it is, and wins.
        let exact = try #require(
            try Self.configuration([
                "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9999/traces",
                "OTEL_TRACES_SAMPLER": "traceidratio",
            ]).tracing)
        #expect(exact.endpoint == TracingSettings.Endpoint(host: "127.0.0.1", port: 9999, path: "/traces"))
        #expect(exact.sampler == Sampler(root: .ratio(1), followsParent: false))
    }

    /// An https endpoint (default port 443), verified against the system's roots unless a CA file is given; the
    /// traces' own CA file wins over the general one.
    @Test func httpsEndpointAndItsCAFile() async throws {
        let https = ["OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example"]
        let system = try #require(try Self.configuration(https).tracing)
        #expect(
            system.endpoint
                == TracingSettings.Endpoint(host: "collector.example", port: 443, path: "/v1/traces", usesTLS: true))
        #expect(system.endpoint.description == "https://collector.example:443/v1/traces")
        #expect(system.trustRoots == nil)

        let ca = try await TestCertificate.make("otlp-ca")
        let own = try #require(
            try Self.configuration(https.merging(["OTEL_EXPORTER_OTLP_CERTIFICATE": ca.certificate]) { $1 }).tracing)
        #expect(own.trustRoots?.path == ca.certificate && own.trustRoots?.count == 1)
        let traces = try #require(
            try Self.configuration(
                https.merging([
                    "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem",
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca.certificate,
                ]) { $1 }
            ).tracing)
        #expect(traces.trustRoots?.path == ca.certificate)
        let missing = try #require(
            Self.message(https.merging(["OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"]) { $1 }))
        #expect(missing.hasPrefix("OTEL_EXPORTER_OTLP_CERTIFICATE: cannot read /nonexistent/ca.pem"), "\(missing)")
        let key = try #require(Self.message(https.merging(["OTEL_EXPORTER_OTLP_CERTIFICATE": ca.key]) { $1 }))
        #expect(key.hasPrefix("OTEL_EXPORTER_OTLP_CERTIFICATE: \(ca.key)") && key.contains("PEM"), "\(key)")
        let plain = try #require(
            Self.message(["OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_CERTIFICATE": ca.certificate]))
        #expect(
            plain.contains(
                "OTEL_EXPORTER_OTLP_CERTIFICATE is set but traces go to http://localhost:4318/v1/traces, which is not https"
            ), "\(plain)")
    }

    @Test(arguments: [
        (["OTEL_TRACES_EXPORTER": "jaeger"], "OTEL_TRACES_EXPORTER='jaeger' is not valid: expected otlp or none"),
        (
            ["OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"],
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported: metricsd sends traces as OTLP over HTTP with JSON only; set http/json"
        ),
        (
            ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"],
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/protobuf' is not supported"
        ),
        (
            ["OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://collector:4317"],
            "OTEL_EXPORTER_OTLP_ENDPOINT='grpc://collector:4317' is not valid: expected an http:// or https:// URL"
        ),
        (
            ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:99999/v1/traces"],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='http://collector:99999/v1/traces' is not valid"
        ),
        (
            ["OTEL_TRACES_SAMPLER": "probabilistic"],
            "OTEL_TRACES_SAMPLER='probabilistic' is not valid: expected one of parentbased_traceidratio, traceidratio, always_on"
        ),
        (
            ["OTEL_TRACES_SAMPLER_ARG": "1.5"],
            "OTEL_TRACES_SAMPLER_ARG='1.5' is not valid: expected a sampling ratio from 0 to 1"
        ),
        (["OTEL_TRACES_SAMPLER_ARG": "ten"], "OTEL_TRACES_SAMPLER_ARG='ten' is not valid"),
    ])
    func badValuesAreNamed(variables: [String: String], expected: String) throws {
        // Refused whether tracing is on or not: the mistake shows before it is turned on.
        for exporter in ["none", "otlp"] where variables["OTEL_TRACES_EXPORTER"] == nil {
            let message = try #require(Self.message(variables.merging(["OTEL_TRACES_EXPORTER": exporter]) { $1 }))
            #expect(message.contains(expected), "\(message)")
        }
        if variables["OTEL_TRACES_EXPORTER"] != nil {
            let message = try #require(Self.message(variables))
            #expect(message.contains(expected), "\(message)")
        }
    }

    /// The ratio sampler decides by the trace id: the same id, the same answer; about the ratio of random ids.
    @Test func ratioSamplerFollowsTheTraceID() throws {
        let sampler = try #require(Sampler.named("traceidratio", argument: "0.25"))
        let low = Sampler.named("traceidratio", argument: "0")!
        var sampled = 0
        for _ in 0..<4000 {
            let id = (0..<16).map { _ in UInt8.random(in: 0...255) }
            let first = sampler.samples(traceID: id, parentSampled: nil)
            #expect(
                first == sampler.samples(traceID: id, parentSampled: true), "not parent-based: the parent is ignored")
            if first { sampled += 1 }
            #expect(!low.samples(traceID: id, parentSampled: nil))
        }
        #expect((800...1200).contains(sampled), "\(sampled) of 4000 sampled at 0.25")
        let parentBased = try #require(Sampler.named("parentbased_traceidratio", argument: "0"))
        #expect(parentBased.samples(traceID: Array(repeating: 0, count: 16), parentSampled: true))
        #expect(!parentBased.samples(traceID: Array(repeating: 0, count: 16), parentSampled: nil))
    }
}
