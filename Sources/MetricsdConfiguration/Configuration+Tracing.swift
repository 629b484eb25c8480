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
        let trustRoots = try self.traceTrustRoots(reader, endpoint: endpoint)
        guard exporter else { return nil }
        return TracingSettings(endpoint: endpoint, sampler: sampler, serviceName: serviceName, trustRoots: trustRoots)
    }

    /// The CA file of an `https://` endpoint: `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`, else
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`; nil (the system's trust roots) when neither is set. A file that cannot be
    /// read or holds no certificate is refused, and so is one given for an `http://` endpoint (it would not be used:
    /// the spans would go out in the clear while the setting says otherwise).
    private static func traceTrustRoots(
        _ reader: EnvironmentReader, endpoint: TracingSettings.Endpoint
    ) throws(ConfigurationError) -> TrustRoots? {
        let names = ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"]
        guard let name = names.first(where: { reader[$0] != nil }), let path = reader[name] else { return nil }
        guard endpoint.usesTLS else {
            throw ConfigurationError(
                .invalidValue,
                "\(name) is set but traces go to \(endpoint), which is not https: use an https:// endpoint, or unset \(name)"
            )
        }
        let pem: String
        do {
            pem = try Secrets.readText(path)
        } catch {
            throw ConfigurationError(error.kind, "\(name): \(error.message)")
        }
        do {
            return try TrustRoots(path: path, pem: pem)
        } catch {
            throw ConfigurationError(
                .invalidValue,
                "\(name): \(error.message); give the PEM file of the CA that signed the collector's certificate")
        }
    }

    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is (`/` when it has no path), else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces` after its path, else `http://localhost:4318/v1/traces`.
    private static func traceEndpoint(_ reader: EnvironmentReader) throws(ConfigurationError)
        -> TracingSettings.Endpoint
    {
        let expected = "an http:// or https:// URL, e.g. http://127.0.0.1:4318"
        if let text = reader["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] {
            guard let url = TracingSettings.Endpoint.parse(text) else {
                throw ConfigurationError(
                    .invalidValue,
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=\(EnvironmentReader.shown(text)) is not valid: expected \(expected)"
                )
            }
            return TracingSettings.Endpoint(host: url.host, port: url.port, path: url.path ?? "/", usesTLS: url.usesTLS)
        }
        let text = reader["OTEL_EXPORTER_OTLP_ENDPOINT"] ?? Self.defaultTraceEndpoint
        guard let url = TracingSettings.Endpoint.parse(text) else {
            throw ConfigurationError(
                .invalidValue,
                "OTEL_EXPORTER_OTLP_ENDPOINT=\(EnvironmentReader.shown(text)) is not valid: expected \(expected)")
        }
        var base = url.path ?? ""
        while base.hasSuffix("/") { base.removeLast() }
        return TracingSettings.Endpoint(host: url.host, port: url.port, path: base + "/v1/traces", usesTLS: url.usesTLS)
    }
}
