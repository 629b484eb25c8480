/// What tracing is configured with (the `OTEL_*` variables, read by the configuration loader).
public struct TracingSettings: Sendable, Equatable {
    /// Where finished spans go: an OTLP/HTTP receiver's traces URL (`http://host:port/v1/traces`, or `https://`).
    public struct Endpoint: Sendable, Equatable, CustomStringConvertible {
        public let host: String
        public let port: Int
        /// The request path, `/v1/traces` unless the traces endpoint names another.
        public let path: String
        /// An `https://` endpoint: each export goes over TLS, the receiver's certificate verified.
        public let usesTLS: Bool

        public init(host: String, port: Int, path: String, usesTLS: Bool = false) {
            self.host = host
            self.port = port
            self.path = path
            self.usesTLS = usesTLS
        }

        public var description: String {
            let shownHost = self.host.contains(":") ? "[\(self.host)]" : self.host
            return "\(self.usesTLS ? "https" : "http")://\(shownHost):\(self.port)\(self.path)"
        }

        /// An `http://` or `https://` URL: its host, port (default 80, or 443), path (nil: none given) and whether
        /// it is https. Nil for anything else.
        public static func parse(_ url: String) -> (host: String, port: Int, path: String?, usesTLS: Bool)? {
            let usesTLS = url.lowercased().hasPrefix("https://")
            guard usesTLS || url.lowercased().hasPrefix("http://") else { return nil }
            let rest = url.dropFirst(usesTLS ? "https://".count : "http://".count)
            let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            let path = rest.dropFirst(authority.count)
            guard !authority.isEmpty, !authority.contains("@"), !path.contains("?"), !path.contains("#") else {
                return nil
            }
            var host = Substring(authority)
            var port = usesTLS ? 443 : 80
            if authority.hasPrefix("[") {
                guard let close = authority.firstIndex(of: "]") else { return nil }
                host = authority[authority.index(after: authority.startIndex)..<close]
                let after = authority[authority.index(after: close)...]
                if !after.isEmpty {
                    guard after.hasPrefix(":"), let number = Int(after.dropFirst()) else { return nil }
                    port = number
                }
            } else if let colon = authority.lastIndex(of: ":") {
                host = authority[..<colon]
                guard let number = Int(authority[authority.index(after: colon)...]) else { return nil }
                port = number
            }
            guard !host.isEmpty, (1...65_535).contains(port) else { return nil }
            return (String(host), port, path.isEmpty ? nil : String(path), usesTLS)
        }
    }

    public let endpoint: Endpoint
    public let sampler: Sampler
    /// `service.name` of every span's resource.
    public let serviceName: String
    /// Finished spans waiting for export at most; beyond it a span is dropped (and counted), never waited for.
    public let queueCapacity: Int
    /// The certificate authorities an `https://` endpoint's certificate must chain to
    /// (`OTEL_EXPORTER_OTLP_CERTIFICATE`); nil: the system's trust roots.
    public let trustRoots: TrustRoots?

    public init(
        endpoint: Endpoint, sampler: Sampler, serviceName: String, queueCapacity: Int = 4096,
        trustRoots: TrustRoots? = nil
    ) {
        self.endpoint = endpoint
        self.sampler = sampler
        self.serviceName = serviceName
        self.queueCapacity = queueCapacity
        self.trustRoots = trustRoots
    }
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
public struct Sampler: Sendable, Equatable, CustomStringConvertible {
    /// What decides a trace that starts here (no parent).
    public enum Root: Sendable, Equatable {
        case alwaysOn
        case alwaysOff
        /// This fraction of traces, chosen by the trace id (the same id gets the same answer in every process).
        case ratio(Double)
    }

    public let root: Root
    /// Whether a span with a parent follows the parent's decision (`parentbased_*`) instead of `root`.
    public let followsParent: Bool

    public init(root: Root, followsParent: Bool) {
        self.root = root
        self.followsParent = followsParent
    }

    /// The sampler names `OTEL_TRACES_SAMPLER` takes.
    public static let names = [
        "parentbased_traceidratio", "traceidratio", "always_on", "always_off", "parentbased_always_on",
        "parentbased_always_off",
    ]

    /// The sampler named `name` with `argument` (the ratio of the `*traceidratio` samplers, default 1); nil when the
    /// name is unknown or the ratio not a number from 0 to 1.
    public static func named(_ name: String, argument: String?) -> Sampler? {
        let ratio: Double?
        if let argument {
            ratio = Double(argument).flatMap { $0.isFinite && (0...1).contains($0) ? $0 : nil }
        } else {
            ratio = 1
        }
        switch name {
        case "always_on": return Sampler(root: .alwaysOn, followsParent: false)
        case "always_off": return Sampler(root: .alwaysOff, followsParent: false)
        case "parentbased_always_on": return Sampler(root: .alwaysOn, followsParent: true)
        case "parentbased_always_off": return Sampler(root: .alwaysOff, followsParent: true)
        case "traceidratio": return ratio.map { Sampler(root: .ratio($0), followsParent: false) }
        case "parentbased_traceidratio": return ratio.map { Sampler(root: .ratio($0), followsParent: true) }
        default: return nil
        }
    }

    /// Whether a span of trace `traceID` is recorded, given its parent's sampled flag (nil: no parent).
    public func samples(traceID: [UInt8], parentSampled: Bool?) -> Bool {
        self.samples(traceIDLow: Self.low(traceID), parentSampled: parentSampled)
    }

    /// A trace id's last 8 bytes as a big-endian number: what the ratio is compared with.
    static func low<Bytes: BidirectionalCollection<UInt8>>(_ traceID: Bytes) -> UInt64 {
        var low: UInt64 = 0
        for byte in traceID.suffix(8) { low = low << 8 | UInt64(byte) }
        return low
    }

    /// The same decision from the trace id's last 8 bytes (random in W3C trace ids) as a big-endian number: what
    /// the ratio is compared with. Every request asks this while tracing is on, sampled or not: no allocation.
    public func samples(traceIDLow low: UInt64, parentSampled: Bool?) -> Bool {
        if self.followsParent, let parentSampled { return parentSampled }
        switch self.root {
        case .alwaysOn: return true
        case .alwaysOff: return false
        case .ratio(let ratio):
            if ratio >= 1 { return true }
            if ratio <= 0 { return false }
            return low < UInt64(ratio * 18_446_744_073_709_551_615.0)
        }
    }

    public var description: String {
        let base =
            switch self.root {
            case .alwaysOn: "always_on"
            case .alwaysOff: "always_off"
            case .ratio(let ratio): "traceidratio \(ratio)"
            }
        return self.followsParent ? "parentbased_\(base)" : base
    }
}
