/// What a reload (SIGHUP) runs with. The settings catalogue is the one list of what a reload takes: a setting it
/// marks `reloadable` gets its value as the environment and `METRICSD_CONFIG_FILE` give it now; every other
/// setting keeps the value the daemon runs with, and a change to it waits for the next restart, named so that the
/// operator is not left thinking it took effect.
public struct ReloadedSettings: Sendable, Equatable {
    /// The environment to read the reloaded configuration from.
    public let environment: [String: String]
    /// The settings whose value changed but which only a restart applies, in the catalogue's order.
    public let waitingForRestart: [String]

    /// `current`: the environment with the configuration file merged in as it is now; `running`: the environment
    /// the daemon's configuration was last read from (at start or by the last reload that succeeded). An empty
    /// value is an unset one, as the configuration reads it.
    public init(current: [String: String], running: [String: String]) {
        func value(_ environment: [String: String], _ name: String) -> String? {
            environment[name].flatMap { $0.isEmpty ? nil : $0 }
        }
        var environment = running
        var waiting: [String] = []
        for setting in SettingsCatalog.all {
            let now = value(current, setting.name)
            guard now != value(running, setting.name) else { continue }
            if setting.reloadable {
                environment[setting.name] = now
            } else {
                waiting.append(setting.name)
            }
        }
        self.environment = environment
        self.waitingForRestart = waiting
    }
}
