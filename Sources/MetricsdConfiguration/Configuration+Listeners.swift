import MetricsdHTTP

/// The listeners as the settings give them (the sockets systemd passes, where it passes them, take the listen
/// settings' place): read once, for `serve` (``Configuration``) and for `check-config`, which probes them even
/// when another part of the configuration is wrong.
public struct ListenerSettings: Sendable {
    /// `METRICSD_LISTEN`, default `127.0.0.1:8080`: `host:port` (clients, the health check and `check-config`
    /// reach it over TCP).
    public var listen: ListenAddress
    /// `METRICSD_INTERNAL_LISTEN` (former name `METRICSD_METRICS_LISTEN`): the internal listener, for `/metrics`,
    /// the admin API and the health checks; nil serves everything on the public listener.
    public var internalListen: ListenAddress?
    /// The setting that named the internal listener: its name, or its former name (warned about).
    public var internalSetting: String
    /// `METRICSD_TLS`: which listeners speak TLS (the certificate and key are ``TLSSettings``).
    public var tlsOnPublic: Bool
    public var tlsOnInternal: Bool
    /// `METRICSD_TRUSTED_PROXIES` with `METRICSD_FORWARDED_HEADER` (default `x-forwarded-for`).
    public var trustedProxies: TrustedProxies

    public static let internalName = "METRICSD_INTERNAL_LISTEN"
    public static let formerInternalName = "METRICSD_METRICS_LISTEN"

    public init(environment: [String: String]) throws(ConfigurationError) {
        try self.init(EnvironmentReader(environment))
    }

    init(_ reader: EnvironmentReader) throws(ConfigurationError) {
        self.listen = try Self.publicListener(reader)
        (self.internalListen, self.internalSetting) = try Self.internalListener(reader)
        let mode = try reader.parse("METRICSD_TLS", default: "off", expected: "off, public, internal or both") { text in
            ["off", "public", "internal", "both"].contains(text.lowercased()) ? text.lowercased() : nil
        }
        (self.tlsOnPublic, self.tlsOnInternal) = (
            mode == "public" || mode == "both", mode == "internal" || mode == "both"
        )
        self.trustedProxies = try reader.parse(
            "METRICSD_TRUSTED_PROXIES", default: TrustedProxies(),
            expected: "addresses or networks, e.g. 127.0.0.1,10.0.0.0/8"
        ) { TrustedProxies(parsing: $0) }
        self.trustedProxies.header = try reader.parse(
            "METRICSD_FORWARDED_HEADER", expected: "x-forwarded-for or forwarded"
        ) {
            ForwardedHeader(rawValue: $0.lowercased())
        }
    }

    /// `METRICSD_LISTEN` must be `host:port`.
    static func publicListener(_ reader: EnvironmentReader) throws(ConfigurationError) -> ListenAddress {
        let expected = "host:port, e.g. \(SettingsCatalog.defaultListen)"
        let address = try reader.parse("METRICSD_LISTEN", expected: expected) { ListenAddress(parsing: $0) }
        guard let path = address.unixPath else { return address }
        throw ConfigurationError(.invalidValue, "METRICSD_LISTEN='unix:\(path)' is not valid: expected \(expected)")
    }

    /// `METRICSD_INTERNAL_LISTEN`, or its former name `METRICSD_METRICS_LISTEN` (not both), and which one.
    static func internalListener(_ reader: EnvironmentReader) throws(ConfigurationError) -> (ListenAddress?, String) {
        let expected = "host:port or unix:/absolute/path, e.g. 127.0.0.1:9464 or unix:/run/metricsd/internal.sock"
        let current = try reader.parseOptional(Self.internalName, expected: expected) { ListenAddress(parsing: $0) }
        let former = try reader.parseOptional(Self.formerInternalName, expected: expected) {
            ListenAddress(parsing: $0)
        }
        if current != nil && former != nil {
            throw ConfigurationError(
                .invalidValue,
                "METRICSD_METRICS_LISTEN is the former name of METRICSD_INTERNAL_LISTEN: set only METRICSD_INTERNAL_LISTEN"
            )
        }
        return former != nil ? (former, Self.formerInternalName) : (current, Self.internalName)
    }
}

/// `METRICSD_TLS`: which listeners speak TLS, with which certificate and key.
public struct TLSSettings: Sendable {
    public var onPublic: Bool
    public var onInternal: Bool
    /// PEM: the certificate, then its intermediates.
    public var certificate: String
    /// PEM: the private key.
    public var key: String
    /// Where the certificate was read from, as messages name it (``Secrets/source(credential:file:environment:)``).
    public var source: String

    /// Where the certificate is read from (``read(environment:)``), for messages about it.
    package static func source(environment: [String: String]) -> String {
        Secrets.source(credential: "tls-certificate", file: "METRICSD_TLS_CERTIFICATE_FILE", environment: environment)
            ?? "the TLS certificate"
    }

    /// The certificate and key as the service reads them (a refreshed copy first, then its credentials, else
    /// `METRICSD_TLS_CERTIFICATE_FILE`/`METRICSD_TLS_KEY_FILE`), both required.
    package static func read(environment: [String: String]) throws(ConfigurationError) -> (
        certificate: String, key: String
    ) {
        let certificate = try Secrets.read(
            credential: "tls-certificate", file: "METRICSD_TLS_CERTIFICATE_FILE", variable: nil,
            environment: environment)
        let key = try Secrets.read(
            credential: "tls-key", file: "METRICSD_TLS_KEY_FILE", variable: nil, environment: environment)
        guard let certificate, let key else {
            throw ConfigurationError(
                .tlsIncomplete,
                "METRICSD_TLS needs a certificate and its key: the credentials tls-certificate and tls-key (/etc/credstore/metricsd-tls-certificate, /etc/credstore/metricsd-tls-key; LoadCredential= in the unit), or METRICSD_TLS_CERTIFICATE_FILE and METRICSD_TLS_KEY_FILE"
            )
        }
        return (certificate, key)
    }
}

extension Configuration {
    /// The certificate and key, when `METRICSD_TLS` (``ListenerSettings``) names a listener; nil: plain HTTP.
    static func tlsSettings(
        _ listeners: ListenerSettings, environment: [String: String]
    ) throws(ConfigurationError) -> TLSSettings? {
        guard listeners.tlsOnPublic || listeners.tlsOnInternal else { return nil }
        let (certificate, key) = try TLSSettings.read(environment: environment)
        return TLSSettings(
            onPublic: listeners.tlsOnPublic, onInternal: listeners.tlsOnInternal, certificate: certificate, key: key,
            source: TLSSettings.source(environment: environment))
    }
}

extension Configuration {
    /// The refusal of a `METRICSD_TLS` that names the internal listener when there is none.
    public static func tlsWithoutInternalListener(onPublic: Bool) -> ConfigurationError {
        ConfigurationError(
            .invalidValue,
            "METRICSD_TLS=\(onPublic ? "both" : "internal") needs the internal listener, and there is none: set METRICSD_INTERNAL_LISTEN (e.g. 127.0.0.1:8090) or enable metricsd-internal.socket, or set METRICSD_TLS=\(onPublic ? "public" : "public or off")"
        )
    }

    /// `METRICSD_TLS` names the internal listener, and there is none: no `METRICSD_INTERNAL_LISTEN`, and no socket
    /// named internal from systemd (`internalFromSystemd`). Nil when the listeners it names exist.
    public func tlsListenerProblem(internalFromSystemd: Bool) -> ConfigurationError? {
        guard let tls = self.tls, tls.onInternal, self.internalListen == nil, !internalFromSystemd else { return nil }
        return Self.tlsWithoutInternalListener(onPublic: tls.onPublic)
    }

    /// The warning for trusted proxies that include much of the internet (``TrustedProxies/tooBroad``), or nil.
    public static func trustedProxiesWarning(_ proxies: TrustedProxies) -> String? {
        let broad = proxies.tooBroad
        guard !broad.isEmpty else { return nil }
        return
            "\(broad.joined(separator: ", ")) \(broad.count == 1 ? "holds" : "hold") much of the internet (wider than /8 for IPv4 or /16 for IPv6): any client there can choose the address the request log shows; list only your proxies' addresses (e.g. 127.0.0.1,::1 for a proxy on this host)"
    }
}
