import Glibc
import HealthMetrics
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `metricsd check-config`: the whole configuration as `metricsd serve` would read it here, checked without
/// starting anything: every setting in range, the settings files' syntax, the secrets readable and strong enough,
/// both listeners usable (the sockets systemd passes, where it does), the database reachable and its schema current.
///
/// Each problem is one line, `metricsd: <SETTING>: <problem> [<code>]`, ending in the failure's stable code (the
/// one `serve` logs for the same failure, ``CodedError``); each exposed secret (``SecretExposure``) a line
/// `metricsd: warning: <SETTING>: <what and where it belongs>`, which does not fail the check; what was checked is
/// summed up after them.
public struct ConfigCheck: Sendable {
    public private(set) var problems: [(setting: String, problem: String, code: String)] = []
    /// Secrets other local users can read, and other risks (an admin API reachable from other hosts, a TLS
    /// certificate expiring within 14 days or not valid yet): reported, not failed.
    public private(set) var warnings: [SecretExposure.Warning] = []
    /// Lines of the summary ("what was checked"), printed in either case.
    public private(set) var summary: [(label: String, text: String)] = []

    public var isOK: Bool { self.problems.isEmpty }

    mutating func problem(_ setting: String, _ code: String, _ text: String) {
        self.problems.append((setting, text, code))
    }
    mutating func problem(_ setting: String, _ kind: ConfigurationError.Kind, _ text: String) {
        self.problem(setting, kind.rawValue, text)
    }
    mutating func problem(_ setting: String, _ error: any CodedError) {
        self.problem(setting, error.errorCode, error.description)
    }
    mutating func note(_ label: String, _ text: String) { self.summary.append((label, text)) }
    mutating func warn(_ setting: String, _ text: String) {
        self.warnings.append(SecretExposure.Warning(setting: setting, text: text))
    }

    /// Runs every check against `base` (the process environment).
    public static func run(environment base: [String: String]) async -> ConfigCheck {
        var check = ConfigCheck()
        // 1. Where the configuration comes from.
        let host: HostEnvironment
        do {
            host = try HostEnvironment(base)
        } catch {
            check.problem("METRICSD_ENV_FILE", error)
            return check
        }
        let environment = check.checkSources(host)
        // 2. Every setting on its own (the secrets' files below), and no unknown name in the settings file.
        check.checkSettings(environment, host: host)
        // 3. Secrets: present, readable, long enough, distinct.
        check.checkSecrets(environment)
        // The sockets systemd passes the service, where it runs: they replace the listen settings.
        let systemd = SystemdSockets.query()
        // 4. The rest of what `serve` checks (constraints between settings, the connection string, the open-file
        //    budget), only when nothing above was wrong: its first error would repeat one of them.
        if check.isOK {
            check.checkConfiguration(environment, systemd: systemd)
        }
        // 5. Listeners, as served: systemd's sockets or the settings, each probed (ConfigCheck+Listeners).
        await check.checkListeners(environment, systemd: systemd)
        // 6. The database and its schema (whatever else is wrong), then the read servers against it: the database
        //    settings as `serve` reads them.
        guard let database = check.databaseSettings(environment) else {
            check.note("database", "not checked: its settings have a problem (above)")
            return check
        }
        await check.checkDatabase(database, environment: environment)
        await check.checkPooler(database, environment: environment)
        await check.checkReadServers(database, environment: environment)
        return check
    }

    /// Where the settings and credentials come from, the credentials that cannot be read, the configuration file
    /// merged in and the secrets others can read; returns the environment `serve` would read.
    mutating func checkSources(_ host: HostEnvironment) -> [String: String] {
        if host.underSystemd {
            self.note("settings", "the environment systemd gave (EnvironmentFile=, LoadCredential=)")
        } else if let file = host.settingsFile {
            self.note("settings", "\(file) (\(host.settingsFromFile.count) settings; exported variables win)")
        } else {
            self.note("settings", "the environment only (no \(HostEnvironment.defaultEnvironmentFile))")
        }
        if !host.credentialsUsed.isEmpty {
            self.note("credentials", host.credentialsUsed.map { "\($0.id) from \($0.path)" }.joined(separator: ", "))
        }
        for unreadable in host.credentialsUnreadable {
            self.problem(
                unreadable.path, .secretUnreadable,
                "cannot read it (\(unreadable.reason)); run check-config as root to check it")
        }
        let environment: [String: String]
        do {
            environment = try ConfigFile.merge(into: host.environment)
        } catch {
            self.problem("METRICSD_CONFIG_FILE", error)
            environment = host.environment
        }
        self.warnings = SecretExposure.warnings(
            environment: environment, settingsFile: host.settingsFile, settingsFromFile: host.settingsFromFile,
            underSystemd: host.underSystemd)
        return environment
    }

    /// Every setting on its own (the secrets' files are checked apart), an unknown `METRICSD_` name in the settings
    /// file as a problem, one elsewhere as a warning.
    mutating func checkSettings(_ environment: [String: String], host: HostEnvironment) {
        if let file = host.settingsFile {
            for name in host.settingsFromFile where name.hasPrefix("METRICSD_") && SettingsCatalog.setting(name) == nil
            {
                self.problem(name, .unknownSetting, "unknown setting (in \(file)); `metricsd help` lists them all")
            }
        }
        let fromFile = host.settingsFile == nil ? [] : Set(host.settingsFromFile)
        self.warnings += UnknownSettings.names(in: environment).filter { !fromFile.contains($0) }.map(
            UnknownSettings.warning)
        let secretFiles = Set(HostEnvironment.credentials.map(\.fileVariable))
        for setting in SettingsCatalog.all where !secretFiles.contains(setting.name) {
            guard let value = environment[setting.name], !value.isEmpty else { continue }
            if let problem = setting.problem(value) { self.problem(setting.name, problem) }
        }
    }

    /// What `serve` checks beyond single settings: the constraints between them, the connection string, the TLS
    /// certificate and key, the open-file budget for the sockets `systemd` passes (or the listen settings).
    mutating func checkConfiguration(_ environment: [String: String], systemd: SystemdSockets?) {
        do {
            let configuration = try Configuration(environment: environment)
            _ = try configuration.database.primary(environment: environment)
            if let tls = configuration.tls {
                self.checkCertificate(tls)
            }
            let budget = DescriptorBudget(
                configuration: configuration,
                readServers: try configuration.database.readServers(environment: environment).count,
                sockets: systemd?.passedSockets ?? (0, 0))
            let limit = DescriptorBudget.limit().hard
            if let problem = budget.problem(limit: limit) {
                self.problem("METRICSD_MAX_CONNECTIONS", .openFiles, problem)
            } else {
                self.note("open files", budget.summary(limit: limit))
            }
        } catch {
            self.problem(Self.settingName(in: error.message) ?? "configuration", error)
        }
    }

    /// The listeners' certificate and key: usable, with its expiry noted and its warnings (expiring soon, not
    /// valid yet) reported.
    mutating func checkCertificate(_ tls: TLSSettings) {
        do {
            let certificate = try TLSIdentity.validate(certificate: tls.certificate, key: tls.key)
            let listeners = [tls.onPublic ? "public" : nil, tls.onInternal ? "internal" : nil].compactMap {
                $0
            }
            self.note(
                "tls",
                "\(listeners.joined(separator: " and ")) listener, certificate valid until \(Self.date(certificate.notValidAfter)) (\(certificate.key), serial \(certificate.serial))"
            )
            self.warnings += certificate.warnings.map {
                SecretExposure.Warning(setting: "METRICSD_TLS", text: "\(tls.source): \($0)")
            }
        } catch {
            self.problem("METRICSD_TLS", .tlsCertificateInvalid, error.from(tls.source).message)
        }
    }

    mutating func checkSecrets(_ environment: [String: String]) {
        var jwtSecret: String?
        let hs256 = (environment["METRICSD_JWT_HS256"] ?? "").lowercased() != "off"
        do {
            jwtSecret = try Secrets.read(
                credential: "jwt-secret", file: "METRICSD_JWT_SECRET_FILE", variable: "METRICSD_JWT_SECRET",
                environment: environment)
        } catch {
            if hs256 { self.problem("METRICSD_JWT_SECRET_FILE", error.kind, Self.strip(error.message)) }
        }
        let publicKey = environment["METRICSD_JWT_PUBLIC_KEY_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        if !hs256 {
            if let publicKey {
                self.note(
                    "tokens",
                    "public key \(publicKey) only (METRICSD_JWT_HS256=off\(jwtSecret == nil ? "" : "; the JWT secret is not used"))"
                )
            } else {
                self.problem(
                    "METRICSD_JWT_HS256", .noJWTKey,
                    "off, but no METRICSD_JWT_PUBLIC_KEY_FILE: no token could be verified")
            }
        } else if let secret = jwtSecret {
            if secret.utf8.count < 32 {
                self.problem(
                    "METRICSD_JWT_SECRET_FILE", .jwtSecretTooShort,
                    "the JWT secret is \(secret.utf8.count) bytes; HS256 needs at least 32 (e.g. openssl rand -base64 48)"
                )
            } else if publicKey != nil {
                self.note(
                    "tokens",
                    "HS256 secret (\(secret.utf8.count) bytes) and a public key: HS256 tokens stay accepted, so this host can mint tokens (METRICSD_JWT_HS256=off verifies with the public key only)"
                )
            } else {
                self.note("tokens", "HS256 secret (\(secret.utf8.count) bytes)")
            }
        } else if let publicKey {
            self.note("tokens", "public key \(publicKey)")
        } else if !self.problems.contains(where: { $0.setting == "METRICSD_JWT_SECRET_FILE" }) {
            self.problem(
                "METRICSD_JWT_SECRET_FILE", .noJWTKey,
                "no JWT secret or public key: put the secret in /etc/credstore/metricsd-jwt-secret (or set METRICSD_JWT_SECRET_FILE or METRICSD_JWT_PUBLIC_KEY_FILE)"
            )
        }
        do {
            if let token = try Secrets.read(
                credential: "admin-token", file: "METRICSD_ADMIN_TOKEN_FILE", variable: "METRICSD_ADMIN_TOKEN",
                environment: environment)
            {
                if token.utf8.count < 16 {
                    self.problem(
                        "METRICSD_ADMIN_TOKEN_FILE", .adminTokenTooShort,
                        "the admin token is \(token.utf8.count) characters; at least 16 are needed")
                } else if token.hasPrefix("eyJ") && token.split(separator: ".").count == 3 {
                    self.problem("METRICSD_ADMIN_TOKEN_FILE", .adminTokenIsJWT, "the admin token must not be a JWT")
                } else if token == jwtSecret {
                    self.problem(
                        "METRICSD_ADMIN_TOKEN_FILE", .adminTokenIsJWTSecret,
                        "the admin token must differ from the JWT secret")
                } else {
                    self.note("admin token", "set (\(token.utf8.count) characters)")
                }
            } else {
                self.note("admin token", "none: no admin endpoints (POST /v1/admin/recompute answers 404)")
            }
        } catch {
            self.problem("METRICSD_ADMIN_TOKEN_FILE", error.kind, Self.strip(error.message))
        }
        do {
            _ = try Secrets.read(
                credential: "db-password", file: "METRICSD_DB_PASSWORD_FILE", variable: nil, environment: environment)
        } catch {
            self.problem("METRICSD_DB_PASSWORD_FILE", error.kind, Self.strip(error.message))
        }
    }

    /// The database settings as `serve` reads them (``DatabaseSettings``), or nil with their problem reported,
    /// unless a check above reported it.
    mutating func databaseSettings(_ environment: [String: String]) -> DatabaseSettings? {
        do {
            return try DatabaseSettings(environment: environment)
        } catch {
            let setting = Self.settingName(in: error.message) ?? "DATABASE_URL"
            if !self.problems.contains(where: { $0.setting == setting }) { self.problem(setting, error) }
            return nil
        }
    }

    mutating func checkDatabase(_ database: DatabaseSettings, environment: [String: String]) async {
        let settings: ConnectionSettings
        do {
            settings = try database.primary(environment: environment)
        } catch {
            if !self.problems.contains(where: { $0.setting == "DATABASE_URL" }) {
                self.problem("DATABASE_URL", .databaseURLInvalid, error.message)
            }
            return
        }
        // libpq blocks: the connection runs in a detached task, off the cooperative pool's threads, and is awaited
        // here at once (its result is the check's), so nothing outlives this function.
        let result: Result<(String, SchemaStatus, Int), any Error> = await Task.detached {
            Result {
                let connection = try PostgresConnection(settings: settings)
                let identity = try connection.query(
                    "SELECT current_user || '@' || current_database() || ' (PostgreSQL ' || current_setting('server_version') || ')'"
                )
                let name = try identity.requiredString(0, 0)
                let migrator = Migrator()
                return (name, try migrator.status(on: connection), migrator.migrations.count)
            }
        }.value
        switch result {
        case .success(let (name, status, total)):
            if !status.changed.isEmpty {
                self.problem(
                    "DATABASE_URL", MigrationError.Kind.changed.rawValue,
                    "\(name): migrations changed after being applied: \(status.changed.joined(separator: ", "))")
            } else if !status.pending.isEmpty {
                self.problem(
                    "DATABASE_URL", StartupError.Kind.schemaBehind.rawValue,
                    "\(name): schema is behind, \(status.pending.count) of \(total) migrations pending (run: metricsd migrate)"
                )
            } else {
                self.note("database", "\(name), schema current (\(total) migrations)")
            }
        case .failure(let error as PostgresError) where error.message.contains("unsupported startup parameter"):
            self.problem(
                "DATABASE_URL", error.errorCode,
                "cannot connect to the database: \(Self.oneLine(error.message)): a connection pooler refuses startup parameters it does not track; remove options from DATABASE_URL and PGOPTIONS (metricsd sends none itself) and set what they set on the role instead (ALTER ROLE … SET …)"
            )
        case .failure(let error as PostgresError):
            self.problem(
                "DATABASE_URL", error.errorCode, "cannot connect to the database: \(Self.oneLine(error.message))")
        case .failure(let error):
            let code = (error as? any CodedError)?.errorCode ?? PostgresError.Code.queryFailed.errorCode
            self.problem("DATABASE_URL", code, "database error: \(Self.oneLine("\(error)"))")
        }
    }

    /// The text to print: problems first, then warnings, then the summary.
    public var problemLines: [String] { self.problems.map { "metricsd: \($0.setting): \($0.problem) [\($0.code)]" } }

    public var warningLines: [String] { self.warnings.map { "metricsd: warning: \($0)" } }

    public var summaryText: String {
        let width = 14
        var head =
            self.isOK
            ? "configuration OK"
            : "configuration has \(self.problems.count) problem\(self.problems.count == 1 ? "" : "s")"
        if !self.warnings.isEmpty { head += " (\(self.warnings.count) warning\(self.warnings.count == 1 ? "" : "s"))" }
        return ([head] + self.summary.map { "  " + ($0.label + ":").padded(to: width) + $0.text })
            .joined(separator: "\n")
    }

    /// `NAME=… is not valid …` → `NAME`.
    static func settingName(in message: String) -> String? {
        let name = message.prefix { $0.isUppercase || $0.isNumber || $0 == "_" }
        return name.count > 3 && SettingsCatalog.setting(String(name)) != nil ? String(name) : nil
    }

    /// `METRICSD_X_FILE: cannot read …` → `cannot read …` (the setting is already named once).
    static func strip(_ message: String) -> String {
        for prefix in ["METRICSD_JWT_SECRET_FILE: ", "METRICSD_ADMIN_TOKEN_FILE: ", "METRICSD_DB_PASSWORD_FILE: "]
        where message.hasPrefix(prefix) {
            return String(message.dropFirst(prefix.count))
        }
        return message
    }

    /// Seconds since 1970 as a UTC date and time, `2027-01-31 12:00 UTC`.
    static func date(_ seconds: Int) -> String {
        TLSCertificateCheck.date(seconds)
    }

    static func oneLine(_ text: String) -> String {
        text.split(whereSeparator: \.isNewline).map { $0.trimmingSpaces() }.joined(separator: " ")
    }
}

/// Whether a listener could be opened: binds a TCP socket to the address with `SO_REUSEADDR` (as the daemon does),
/// then closes it.
enum ListenerProbe {
    enum Outcome: Equatable {
        case free
        case inUse
        case failed(String)
    }

    static func bind(_ address: ListenAddress) -> Outcome {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(address.host, String(address.port), &hints, &list)
        guard rc == 0, let first = list else {
            return .failed("cannot resolve \(address.host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(list) }
        let descriptor = socket(first.pointee.ai_family, first.pointee.ai_socktype, first.pointee.ai_protocol)
        guard descriptor >= 0 else { return .failed(String(cString: strerror(errno)).lowercased()) }
        defer { close(descriptor) }
        var one: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if Glibc.bind(descriptor, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 && listen(descriptor, 1) == 0 {
            return .free
        }
        let error = errno
        return error == EADDRINUSE ? .inUse : .failed(String(cString: strerror(error)).lowercased())
    }
}
