import MetricsdConfiguration
import Testing

/// What a reload takes: the settings the catalogue marks reloadable as they are now, every other one as the daemon
/// runs it, named when it changed.
@Suite struct ReloadedSettingsTests {
    let running = [
        "DATABASE_URL": "postgresql:///metricsd", "METRICSD_DAILY_AT": "00:05", "METRICSD_WORKERS": "2",
        "METRICSD_LOG_LEVEL": "info", "METRICSD_CONFIG_FILE": "/etc/metricsd/metricsd.conf", "PGHOST": "/run/pg",
    ]

    @Test func aReloadableChangeIsTakenAndNothingWaits() {
        var current = self.running
        current["METRICSD_DAILY_AT"] = "01:30"
        current["METRICSD_JWT_LEEWAY_SECONDS"] = "5"
        let reloaded = ReloadedSettings(current: current, running: self.running)
        #expect(reloaded.environment == current)
        #expect(reloaded.waitingForRestart.isEmpty)
    }

    @Test func aChangeOnlyARestartAppliesKeepsTheRunningValueAndIsNamed() {
        var current = self.running
        current["METRICSD_WORKERS"] = "8"
        current["DATABASE_URL"] = "postgresql://db2/metricsd"
        current["METRICSD_LISTEN"] = "127.0.0.1:9090"
        current["METRICSD_LOG_LEVEL"] = "debug"
        let reloaded = ReloadedSettings(current: current, running: self.running)
        #expect(reloaded.environment["METRICSD_WORKERS"] == "2")
        #expect(reloaded.environment["DATABASE_URL"] == "postgresql:///metricsd")
        #expect(reloaded.environment["METRICSD_LISTEN"] == nil)
        #expect(reloaded.environment["METRICSD_LOG_LEVEL"] == "debug")
        // In the catalogue's order.
        #expect(reloaded.waitingForRestart == ["DATABASE_URL", "METRICSD_LISTEN", "METRICSD_WORKERS"])
    }

    @Test func aReloadableSettingTakenOutFallsBackAndAnEmptyValueIsAnUnsetOne() {
        var current = self.running
        current["METRICSD_DAILY_AT"] = nil
        current["METRICSD_WORKERS"] = ""
        var running = self.running
        running["METRICSD_TICK_SECONDS"] = ""
        let reloaded = ReloadedSettings(current: current, running: running)
        #expect(reloaded.environment["METRICSD_DAILY_AT"] == nil)
        #expect(reloaded.environment["METRICSD_WORKERS"] == "2")
        #expect(reloaded.waitingForRestart == ["METRICSD_WORKERS"])
    }

    /// What is not a setting (libpq's variables, systemd's) is never taken from a reload.
    @Test func whatIsNotASettingKeepsItsRunningValue() {
        var current = self.running
        current["PGHOST"] = "/elsewhere"
        current["CREDENTIALS_DIRECTORY"] = "/run/credentials/other"
        let reloaded = ReloadedSettings(current: current, running: self.running)
        #expect(reloaded.environment == self.running)
        #expect(reloaded.waitingForRestart.isEmpty)
    }

    /// The catalogue's reloadable settings are the ones a reload applies: the log level, the request log, the
    /// daily time, the token and admin-token settings and the TLS certificate's files.
    @Test func theCatalogueNamesWhatAReloadApplies() {
        let reloadable = SettingsCatalog.all.filter(\.reloadable).map(\.name)
        #expect(
            Set(reloadable) == [
                "METRICSD_DAILY_AT", "METRICSD_LOG_LEVEL", "METRICSD_REQUEST_LOG", "METRICSD_JWT_SECRET_FILE",
                "METRICSD_JWT_SECRET", "METRICSD_JWT_PUBLIC_KEY_FILE", "METRICSD_JWT_HS256", "METRICSD_JWT_ISSUER",
                "METRICSD_JWT_AUDIENCE", "METRICSD_JWT_LEEWAY_SECONDS", "METRICSD_ADMIN_TOKEN_FILE",
                "METRICSD_ADMIN_TOKEN", "METRICSD_TLS_CERTIFICATE_FILE", "METRICSD_TLS_KEY_FILE",
            ])
    }
}
