import MetricsdPostgres

/// The database connections as the settings give them — the primary, its password, the read servers, the LISTEN
/// session, the statements' deadline and form — read once, for `serve` (``Configuration/database``) and for
/// `check-config`, which probes the database even when another part of the configuration is wrong.
public struct DatabaseSettings: Sendable {
    /// `DATABASE_URL`: a libpq connection string or URI; empty means libpq's defaults and `PG*` variables.
    public var url: String
    /// `$CREDENTIALS_DIRECTORY/db-password`, else the file named by `METRICSD_DB_PASSWORD_FILE`, if any.
    public var password: String?
    /// `METRICSD_READ_DATABASE_URL`: streaming standbys for the latest read (one or several hosts); nil reads on
    /// `DATABASE_URL`.
    public var readURL: String?
    /// `METRICSD_READ_MAX_LAG_SECONDS`, default 5: a read server further behind the primary is not read from.
    public var readMaxLag: Duration
    /// `METRICSD_DB_STATEMENT_DEADLINE_SECONDS`: how long one database statement may go without an answer before
    /// it is cancelled and its connection dropped (default 30; migrations have no limit).
    public var statementDeadline: Duration
    /// `METRICSD_DB_PREPARED_STATEMENTS`: named or unnamed prepared statements, or `auto` (the default: unnamed
    /// when a pooler answers).
    public var statementMode: ConnectionSettings.StatementMode
    /// `METRICSD_NOTIFY_DATABASE_URL`: where to LISTEN when `DATABASE_URL` goes through a pooler (nil: unset).
    public var notifyURL: String?

    public init(environment: [String: String]) throws(ConfigurationError) {
        try self.init(EnvironmentReader(environment), environment: environment)
    }

    init(_ reader: EnvironmentReader, environment: [String: String]) throws(ConfigurationError) {
        self.url = reader["DATABASE_URL"] ?? ""
        self.readURL = reader["METRICSD_READ_DATABASE_URL"]
        self.readMaxLag = try reader.duration("METRICSD_READ_MAX_LAG_SECONDS")
        self.password = try Secrets.read(
            credential: "db-password", file: "METRICSD_DB_PASSWORD_FILE", variable: nil, environment: environment)
        self.statementDeadline = try reader.duration("METRICSD_DB_STATEMENT_DEADLINE_SECONDS")
        self.statementMode = try reader.parse(
            "METRICSD_DB_PREPARED_STATEMENTS", default: .auto, expected: "auto, named or unnamed"
        ) {
            ConnectionSettings.StatementMode(rawValue: $0.lowercased())
        }
        self.notifyURL = reader["METRICSD_NOTIFY_DATABASE_URL"]
    }

    /// The primary's libpq connection settings (`DATABASE_URL`, validated by libpq's own parser); `environment`
    /// gives libpq its `PG*` variables.
    public func primary(environment: [String: String]) throws(ConfigurationError) -> ConnectionSettings {
        var settings = try self.settings(
            self.url, setting: "DATABASE_URL", environment: environment, invalid: .databaseURLInvalid)
        settings.statementMode = self.statementMode
        return settings
    }

    /// The session for LISTEN (`METRICSD_NOTIFY_DATABASE_URL`), nil when unset; errors name that setting.
    public func notify(environment: [String: String]) throws(ConfigurationError) -> ConnectionSettings? {
        guard let url = self.notifyURL else { return nil }
        var settings = try self.settings(
            url, setting: "METRICSD_NOTIFY_DATABASE_URL", environment: environment, invalid: .databaseURLInvalid)
        settings.statementMode = self.statementMode
        return settings
    }

    /// The read servers of `METRICSD_READ_DATABASE_URL`, one per host (none when unset); errors name that setting.
    public func readServers(environment: [String: String]) throws(ConfigurationError) -> [ConnectionSettings.ReadServer]
    {
        guard let url = self.readURL else { return [] }
        let settings = try self.settings(
            url, setting: "METRICSD_READ_DATABASE_URL", environment: environment, invalid: .readDatabaseURLInvalid)
        do {
            return try settings.readServers()
        } catch {
            throw ConfigurationError(.readDatabaseURLInvalid, error.message)
        }
    }

    /// One connection string's settings with the password and the statement deadline; `setting` names it in
    /// errors. The statement form is set by the callers that use it (the read servers keep the default).
    private func settings(
        _ conninfo: String, setting: String, environment: [String: String], invalid: ConfigurationError.Kind
    ) throws(ConfigurationError) -> ConnectionSettings {
        do {
            var settings = try ConnectionSettings(
                conninfo: conninfo, password: self.password, environment: environment, setting: setting)
            settings.statementDeadlineSeconds = self.statementDeadline.seconds
            return settings
        } catch {
            throw ConfigurationError(invalid, error.message)
        }
    }
}
