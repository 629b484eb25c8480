import HealthMetrics
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Text produced from ``SettingsCatalog``: the environment part of `metricsd help`, `systemd/metricsd.env.example`
/// and the environment, files and exit-code sections of the man page.
public enum Documentation {
    /// Where the configuration comes from, for help texts.
    public static let configurationSources = """
        Settings come from the environment. Run outside systemd, metricsd also reads
        /etc/metricsd/metricsd.env (METRICSD_ENV_FILE) for every setting not exported,
        and the credentials metricsd-jwt-secret, metricsd-admin-token and
        metricsd-db-password from /etc/credstore (METRICSD_CREDSTORE) when readable, so
        `sudo metricsd status` sees what the service sees. An exported variable wins.
        Under systemd the unit provides both (EnvironmentFile=, LoadCredential=).
        """

    /// Exit codes of every command.
    public static let exitCodes: [(code: Int, meaning: String)] = [
        (0, "success (healthcheck: ready; check-config: configuration OK)"),
        (1, "failure: configuration or database error, not ready, a recompute job failed or was cancelled"),
        (64, "usage error: unknown command, unknown option, bad value on the command line"),
        (78, "check-config found problems (each printed as one line)"),
    ]

    /// The files metricsd reads.
    public static let files: [(path: String, meaning: String)] = [
        (
            "/etc/metricsd/metricsd.env",
            "settings (NAME=value): the unit's EnvironmentFile=, read by hand-run commands too"
        ),
        ("/etc/metricsd/metricsd.conf", "reloadable settings, re-read on SIGHUP (METRICSD_CONFIG_FILE)"),
        ("/etc/credstore/metricsd-jwt-secret", "HS256 secret for end-user tokens (credential jwt-secret)"),
        ("/etc/credstore/metricsd-admin-token", "admin bearer token (credential admin-token)"),
        ("/etc/credstore/metricsd-db-password", "optional database password (credential db-password)"),
    ]

    /// `ENVIRONMENT` for `metricsd help`: every setting with default, range and meaning, by group.
    public static func environmentHelp(width: Int = 80) -> String {
        var lines = ["ENVIRONMENT:"]
        for line in Self.configurationSources.split(separator: "\n") { lines.append("  " + line) }
        for group in Setting.Group.allCases {
            let settings = SettingsCatalog.all.filter { $0.group == group }
            guard !settings.isEmpty else { continue }
            lines.append("")
            lines.append("  \(group.rawValue):")
            for setting in settings {
                var head = "\(setting.name) (default: \(setting.defaultText); \(setting.rangeText)"
                head += setting.reloadable ? "; reloadable)" : ")"
                lines += Self.wrap(head, width: width, indent: "      ", first: "  ")
                lines += Self.wrap(setting.meaning, width: width, indent: "      ", first: "      ")
            }
        }
        lines.append("")
        lines.append("FILES:")
        for file in Self.files {
            lines.append("  \(file.path)")
            lines += Self.wrap(file.meaning, width: width, indent: "      ", first: "      ")
        }
        lines.append("")
        lines.append("EXIT CODES:")
        for exit in Self.exitCodes {
            lines += Self.wrap(
                exit.meaning, width: width, indent: "      ", first: "  \(exit.code)".padded(to: 6))
        }
        lines.append("")
        lines.append("See man 8 metricsd.")
        return lines.joined(separator: "\n")
    }

    /// The short environment section of a command's help: the settings it reads most, and where they come from.
    public static func commandEnvironmentHelp(_ names: [String], width: Int = 80) -> String {
        var lines = ["ENVIRONMENT:"]
        for name in names {
            guard let setting = SettingsCatalog.setting(name) else { continue }
            lines += Self.wrap("\(name) (default: \(setting.defaultText))", width: width, indent: "      ", first: "  ")
        }
        lines.append("  and every other setting listed by `metricsd help`.")
        lines.append("")
        for line in Self.configurationSources.split(separator: "\n") { lines.append("  " + line) }
        lines.append("")
        lines.append("See man 8 metricsd.")
        return lines.joined(separator: "\n")
    }

    /// `systemd/metricsd.env.example`, installed as `/etc/metricsd/metricsd.env`: every operator setting, commented
    /// out at its default, with its meaning.
    public static func environmentFileExample() -> String {
        let secretSettings = SettingsCatalog.secretSettings.map(\.name).joined(separator: " or ")
        var lines = [
            "# /etc/metricsd/metricsd.env - settings of metricsd: the service reads it (EnvironmentFile=), and so do",
            "# metricsd commands run by hand on this host (`sudo metricsd status`), for every variable not exported.",
            "# Generated from metricsd's settings table (`metricsd generate-docs env-example`); man 8 metricsd.",
            "#",
            "# Syntax: NAME=value lines; blank lines and lines starting with # or ; are ignored; values may be quoted",
            "# with \"...\" or '...'. A line metricsd cannot read stops it with an error naming file:line.",
            "# Every setting below is commented out at its default. After editing: systemctl restart metricsd",
            "# (settings marked \"reloadable\" can instead go in /etc/metricsd/metricsd.conf: systemctl reload metricsd).",
            "#",
            "# SECRETS DO NOT BELONG IN THIS FILE. It is installed 0644 so that every local user's metricsd commands can",
            "# read their settings, so anything in it is readable by every local user; and every variable set here",
            "# is in the service's environment, which every program it starts inherits. Secrets are credentials in",
            "# /etc/credstore/ (root:root, 0600), which the unit passes to the service alone (LoadCredential=) and",
            "# which root's metricsd commands read directly:",
            "#   /etc/credstore/metricsd-jwt-secret     HS256 secret for end-user tokens (at least 32 bytes)",
            "#   /etc/credstore/metricsd-admin-token    admin bearer token (at least 16 characters)",
            "#   /etc/credstore/metricsd-db-password    database password (optional; enable its line in the unit)",
            "# So no password in DATABASE_URL, no PGPASSWORD, and not \(secretSettings)",
            "# (development only): metricsd check-config and the service's start-up warn about each of them.",
            "# Check everything with: sudo metricsd check-config",
        ]
        for group in Setting.Group.allCases where group != .testing {
            lines.append("")
            lines.append(
                "# ---- \(group.rawValue) " + String(repeating: "-", count: max(3, 100 - group.rawValue.count)))
            for setting in SettingsCatalog.operatorSettings where setting.group == group {
                lines.append("")
                var text = setting.meaning
                text += " Accepts: \(setting.rangeText)."
                if setting.reloadable { text += " Reloadable." }
                if setting.defaultValue == nil { text += " Default: \(setting.defaultText)." }
                lines += Self.wrap(text, width: 110, indent: "# ", first: "# ")
                lines.append("#\(setting.name)=\(setting.defaultValue ?? "")")
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// The man page's ENVIRONMENT, FILES and EXIT STATUS sections, in roff.
    public static func manSections() -> String {
        var roff: [String] = [".SH ENVIRONMENT"]
        roff.append(Self.roff(Self.configurationSources.replacing("\n", with: " ")))
        for group in Setting.Group.allCases {
            roff.append(".SS \(Self.roff(group.rawValue))")
            for setting in SettingsCatalog.all where setting.group == group {
                roff.append(".TP")
                roff.append(".B \(setting.name)")
                var text = setting.meaning + " Default: \(setting.defaultText). Accepts: \(setting.rangeText)."
                if setting.reloadable { text += " Reloadable (SIGHUP, from METRICSD_CONFIG_FILE)." }
                roff.append(Self.roff(text))
            }
        }
        roff.append(".SS Set by systemd")
        for variable in SettingsCatalog.systemdVariables {
            roff.append(".TP")
            roff.append(".B \(variable.name)")
            roff.append(Self.roff(variable.meaning))
        }
        roff.append(".PP")
        roff.append(
            "libpq also reads its own variables (PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSFILE, PGSSLMODE, ...).")
        roff.append(".SH FILES")
        for file in Self.files {
            roff.append(".TP")
            roff.append(".I \(file.path)")
            roff.append(Self.roff(file.meaning))
        }
        roff.append(".SH EXIT STATUS")
        for exit in Self.exitCodes {
            roff.append(".TP")
            roff.append(".B \(exit.code)")
            roff.append(Self.roff(exit.meaning))
        }
        return roff.joined(separator: "\n")
    }

    /// Escapes text for roff: backslashes, and a leading `.` or `'`.
    public static func roff(_ text: String) -> String {
        var escaped = text.replacing("\\", with: "\\e").replacing("-", with: "\\-")
        if escaped.hasPrefix(".") || escaped.hasPrefix("'") { escaped = "\\&" + escaped }
        return escaped
    }

    /// Greedy word wrap; continuation lines get `indent`.
    static func wrap(_ text: String, width: Int, indent: String, first: String = "") -> [String] {
        var lines: [String] = []
        var current = first
        var empty = true
        for word in text.split(separator: " ") {
            if !empty && current.count + 1 + word.count > width {
                lines.append(current)
                current = indent
                empty = true
            }
            current += (empty ? "" : " ") + word
            empty = false
        }
        if !empty || lines.isEmpty { lines.append(current) }
        return lines
    }
}
