import Foundation

/// `METRICSD_CONFIG_FILE`: optional `KEY=value` lines (the variable names of the README's table) that override
/// the environment. Unlike the environment of a running process, this file is re-read on `SIGHUP`, so the
/// settings that reload without a restart (`METRICSD_LOG_LEVEL`, `METRICSD_DAILY_AT`) can be changed there.
public enum ConfigFile {
    /// The environment with the file's values on top (the environment alone when the variable is unset).
    /// A leading `-` (`-/etc/metricsd/metricsd.conf`) makes the file optional, as in systemd's `EnvironmentFile=`.
    public static func merge(into environment: [String: String]) throws(ConfigurationError) -> [String: String] {
        guard var path = environment["METRICSD_CONFIG_FILE"], !path.isEmpty else { return environment }
        if path.hasPrefix("-") {
            path.removeFirst()
            guard FileManager.default.fileExists(atPath: path) else { return environment }
        }
        let text = try Secrets.readFile(path, what: "METRICSD_CONFIG_FILE")
        var merged = environment
        for (number, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            guard let equals = line.firstIndex(of: "=") else {
                throw ConfigurationError("METRICSD_CONFIG_FILE \(path) line \(number + 1): expected KEY=value")
            }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces)
            var value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            if value.count >= 2, let first = value.first, first == "\"" || first == "'", value.last == first {
                value = String(value.dropFirst().dropLast())
            }
            guard !key.isEmpty, key.allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber || $0 == "_") }) else {
                throw ConfigurationError("METRICSD_CONFIG_FILE \(path) line \(number + 1): '\(key)' is not a variable name")
            }
            merged[key] = value
        }
        return merged
    }
}
