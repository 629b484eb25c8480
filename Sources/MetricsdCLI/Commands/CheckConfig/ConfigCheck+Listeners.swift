import MetricsdConfiguration
import MetricsdHTTP
import NIOCore

/// The listeners as `serve` would have them: the sockets systemd passes (``SystemdSockets``) where it passes
/// them, else the settings; each probed, and a port already taken recognised as metricsd's by its `/healthz`
/// answer — over TLS on a listener `METRICSD_TLS` names.
extension ConfigCheck {
    mutating func checkListeners(_ environment: [String: String], systemd: SystemdSockets?) async {
        // The listener settings as `serve` reads them; one that is wrong was reported with the other settings.
        guard let listeners = try? ListenerSettings(environment: environment) else { return }
        let (publicTLS, internalTLS) = (listeners.tlsOnPublic, listeners.tlsOnInternal)
        if let unit = systemd?.publicSocket, unit.isUsed, !unit.listen.isEmpty, let systemd {
            for (text, address) in unit.addresses {
                await self.checkSocket(
                    "listen", unit: unit, text: text, address: address, tls: publicTLS,
                    serviceActive: systemd.serviceActive)
            }
        } else {
            await self.checkListener("METRICSD_LISTEN", listeners.listen, tls: publicTLS)
        }
        if listeners.internalListen != nil && listeners.internalSetting == ListenerSettings.formerInternalName {
            self.warn(
                ListenerSettings.formerInternalName,
                "the former name of METRICSD_INTERNAL_LISTEN, which also serves the admin API: rename it")
        }
        var hasInternal = false
        if let unit = systemd?.internalSocket, unit.isUsed, !unit.listen.isEmpty, let systemd {
            hasInternal = true
            for (text, address) in unit.addresses {
                await self.checkSocket(
                    "internal", unit: unit, text: text, address: address, tls: internalTLS,
                    serviceActive: systemd.serviceActive)
            }
        } else if let address = listeners.internalListen {
            hasInternal = true
            await self.checkListener(listeners.internalSetting, address, tls: internalTLS)
        }
        if !hasInternal {
            self.note(
                "internal",
                "none: /metrics and the admin API on the public listener (METRICSD_INTERNAL_LISTEN or metricsd-internal.socket separates them)"
            )
            if internalTLS {
                self.problem("METRICSD_TLS", Configuration.tlsWithoutInternalListener(onPublic: publicTLS))
            }
        }
        self.checkProxies(listeners.trustedProxies)
    }

    /// A listener from the settings: binds its address (then closes it); in use, fine when a metricsd answers there.
    mutating func checkListener(_ name: String, _ address: ListenAddress, tls: Bool) async {
        let label = name == "METRICSD_LISTEN" ? "listen" : "internal"
        if address.unixPath != nil {
            self.note(label, "\(address) (a Unix socket, made at start)")
            return
        }
        if label == "internal" { self.warnIfReachable(name, address) }
        switch ListenerProbe.bind(address) {
        case .free:
            self.note(label, "\(address) (free\(tls ? ", TLS" : ""))")
        case .inUse:
            if let answeredTLS = await Self.metricsdAnswers(address, tls: tls) {
                self.note(label, "\(address) (in use by a running metricsd, \(answeredTLS ? "TLS" : "plain HTTP"))")
                self.warnIfOtherProtocol(name, address, configured: tls, answered: answeredTLS)
            } else {
                self.problem(name, .listenUnavailable, "\(address) is in use by another program")
            }
        case .failed(let reason):
            self.problem(name, .listenUnavailable, "cannot listen on \(address): \(reason)")
        }
    }

    /// A socket of a socket unit. systemd holds it while the unit is active: it is then asked only when the
    /// service runs (a connection to it would start metricsd otherwise).
    mutating func checkSocket(
        _ label: String, unit: SystemdSockets.Unit, text: String, address: ListenAddress?, tls: Bool,
        serviceActive: Bool
    ) async {
        let source = unit.id
        let held = unit.activeState == "active"
        guard let address, address.unixPath == nil else {
            self.note(
                label, "\(text) (\(source)\(held ? ", held by systemd" : ", systemd opens it when the socket starts"))")
            return
        }
        if label == "internal" { self.warnIfReachable(source, address) }
        let protocolName = tls ? "TLS" : "plain HTTP"
        if held && !serviceActive {
            self.note(
                label,
                "\(address) (\(source), held by systemd; metricsd starts on the first connection, \(protocolName))")
            return
        }
        if !held, case .free = ListenerProbe.bind(address) {
            self.note(
                label, "\(address) (\(source), free; systemd listens there once the socket starts, \(protocolName))")
            return
        }
        if let answeredTLS = await Self.metricsdAnswers(address, tls: tls) {
            self.note(
                label, "\(address) (\(source), a running metricsd answers, \(answeredTLS ? "TLS" : "plain HTTP"))")
            self.warnIfOtherProtocol(source, address, configured: tls, answered: answeredTLS)
        } else if held {
            self.note(label, "\(address) (\(source), held by systemd; metricsd does not answer there yet)")
        } else {
            self.problem(
                source, .listenUnavailable, "\(address) is in use by another program: systemd cannot listen there")
        }
    }

    /// Whether a metricsd answers `GET /healthz` at `address`: in TLS first where `tls`, else in plain HTTP first,
    /// then the other way (a daemon still running with another `METRICSD_TLS`). The answer's protocol (true:
    /// TLS), or nil when nothing answers as metricsd does.
    static func metricsdAnswers(_ address: ListenAddress, tls: Bool) async -> Bool? {
        let host = address.host == "0.0.0.0" ? "127.0.0.1" : (address.host == "::" ? "::1" : address.host)
        for overTLS in [tls, !tls] {
            let response: String?
            if overTLS {
                response = await TLSProbe.get(host: host, port: address.port, path: "/healthz", timeout: .seconds(2))
            } else if case .success(let answer) = SimpleHTTP.get(
                host: host, port: address.port, path: "/healthz", timeout: 2)
            {
                response = "HTTP/1.1 \(answer.status) \r\n\r\n" + answer.body
            } else {
                response = nil
            }
            if let response, Self.isMetricsdHealth(response) { return overTLS }
        }
        return nil
    }

    /// metricsd's `/healthz`: `200` with the body `{"status":"ok"}`.
    static func isMetricsdHealth(_ response: String) -> Bool {
        guard response.hasPrefix("HTTP/1.1 200 "), let headEnd = response.firstRange(of: "\r\n\r\n") else {
            return false
        }
        return response[headEnd.upperBound...].trimmingWhitespace() == #"{"status":"ok"}"#
    }

    mutating func warnIfReachable(_ setting: String, _ address: ListenAddress) {
        guard !address.isLocal else { return }
        self.warn(
            setting,
            "\(address) is reachable from other hosts: the admin API is then protected by its token alone (use a loopback address or unix:PATH)"
        )
    }

    mutating func warnIfOtherProtocol(_ setting: String, _ address: ListenAddress, configured: Bool, answered: Bool) {
        guard configured != answered else { return }
        self.warn(
            "METRICSD_TLS",
            "the running metricsd speaks \(answered ? "TLS" : "plain HTTP") on \(address) (\(setting)), this configuration \(configured ? "TLS" : "plain HTTP"): restart metricsd to apply it"
        )
    }

    /// The forwarded-address header read behind the trusted proxies, and a warning for a range that holds much of
    /// the internet.
    mutating func checkProxies(_ proxies: TrustedProxies) {
        guard !proxies.isEmpty else { return }
        let header = proxies.header
        self.note(
            "proxies",
            "the client address in \(header.fieldName) from \(proxies) is logged (\(header.other.fieldName) is ignored)"
        )
        if let warning = Configuration.trustedProxiesWarning(proxies) {
            self.warn("METRICSD_TRUSTED_PROXIES", warning)
        }
    }
}
