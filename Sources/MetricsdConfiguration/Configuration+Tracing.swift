import MetricsdTracing

extension Configuration {
    /// The default OTLP/HTTP receiver (a collector on this host), as OpenTelemetry's SDKs have it.
    static let defaultTraceEndpoint = "http://localhost:4318"

    /// Tracing from the standard `OTEL_*` variables: nil unless `OTEL_TRACES_EXPORTER=otlp`. The others are
    /// checked whether or not tracing is on, so that a mistake shows before it is turned on.
    static func tracingSettings(_ reader: EnvironmentReader) throws(ConfigurationError) -> TracingSettings? {
        let exporter = try reader.parse("OTEL_TRACES_EXPORTER", expected: "otlp or none") {
            ["otlp": true, "none": false][$0.lowercased()]
        }
        for name in ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] {
            if let value = reader[name], value.lowercased() != "http/json" {
                throw ConfigurationError(
                    .invalidValue,
                    "\(name)=\(EnvironmentReader.shown(value)) is not supported: metricsd sends traces as OTLP over HTTP with JSON only; set http/json (a collector's OTLP/HTTP receiver, port 4318, takes it)"
                )
            }
        }
        let endpoint = try self.traceEndpoint(reader)
        let samplerName = try reader.parse(
            "OTEL_TRACES_SAMPLER", expected: "one of \(Sampler.names.joined(separator: ", "))"
        ) { Sampler.names.contains($0.lowercased()) ? $0.lowercased() : nil }
        let argument = try reader.parseOptional(
            "OTEL_TRACES_SAMPLER_ARG", expected: "a sampling ratio from 0 to 1, e.g. 0.01"
        ) {
            Double($0).flatMap { $0.isFinite && (0...1).contains($0) ? $0 : nil }
        }
        guard let sampler = Sampler.named(samplerName, argument: argument.map { String($0) }) else {
            preconditionFailure("a sampler name from Sampler.names with a ratio from 0 to 1 makes a sampler")
        }
        let serviceName = reader["OTEL_SERVICE_NAME"] ?? "metricsd"
        guard exporter else { return nil }
        return TracingSettings(endpoint: endpoint, sampler: sampler, serviceName: serviceName)
    }

    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is (`/` when it has no path), else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces` after its path, else `http://localhost:4318/v1/traces`.
    private static func traceEndpoint(_ reader: EnvironmentReader) throws(ConfigurationError)
        -> TracingSettings.Endpoint
    {
        let expected =
            "an http:// URL, e.g. http://127.0.0.1:4318 (https is not supported: send to a collector on this host or network)"
        if let text = reader["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] {
            guard let url = TracingSettings.Endpoint.parse(text) else {
                throw ConfigurationError(
                    .invalidValue,
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=\(EnvironmentReader.shown(text)) is not valid: expected \(expected)"
                )
            }
            return TracingSettings.Endpoint(host: url.host, port: url.port, path: url.path ?? "/")
        }
        let text = reader["OTEL_EXPORTER_OTLP_ENDPOINT"] ?? Self.defaultTraceEndpoint
        guard let url = TracingSettings.Endpoint.parse(text) else {
            throw ConfigurationError(
                .invalidValue,
                "OTEL_EXPORTER_OTLP_ENDPOINT=\(EnvironmentReader.shown(text)) is not valid: expected \(expected)")
        }
        var base = url.path ?? ""
        while base.hasSuffix("/") { base.removeLast() }
        return TracingSettings.Endpoint(host: url.host, port: url.port, path: base + "/v1/traces")
    }
}
