import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `METRICSD_CONFIG_FILE`: optional `NAME=value` lines (the settings of `metricsd help`) that override the
/// environment. Unlike the environment of a running process, this file is re-read on `SIGHUP`, so the settings
/// the catalogue marks reloadable (``ReloadedSettings``) can be changed there. Same syntax as `EnvironmentFile=`
/// (``EnvironmentFile``).
public enum ConfigFile {
    /// The environment with the file's values on top (the environment alone when the variable is unset).
    /// A leading `-` (`-/etc/metricsd/metricsd.conf`) makes the file optional, as in systemd's `EnvironmentFile=`.
    public static func merge(into environment: [String: String]) throws(ConfigurationError) -> [String: String] {
        guard var path = environment["METRICSD_CONFIG_FILE"], !path.isEmpty else { return environment }
        if path.hasPrefix("-") {
            path.removeFirst()
            guard FileManager.default.fileExists(atPath: path) else { return environment }
        }
        var merged = environment
        for assignment in try EnvironmentFile.read(path) {
            merged[assignment.name] = assignment.value
        }
        return merged
    }
}
