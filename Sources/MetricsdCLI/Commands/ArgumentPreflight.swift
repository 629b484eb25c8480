import ArgumentParser
import Glibc
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdSystemd

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// What metricsd does before ArgumentParser sees the arguments: with `serve` as the default command, an unknown
/// command would be parsed as an argument of `serve` and answered with serve's usage; and help gets the
/// environment, files and exit codes appended.
enum ArgumentPreflight {
    /// EX_USAGE (sysexits.h), as ArgumentParser uses for its own usage errors.
    static let usageError: Int32 = 64

    /// Each command and the settings its help names (nil: every setting, as for `metricsd help`).
    static let commands: [(type: any ParsableCommand.Type, environment: [String]?)] = [
        (Serve.self, nil),
        (Migrate.self, databaseSettings),
        (RecomputeAll.self, databaseSettings),
        (RecomputeStatus.self, databaseSettings),
        (RecomputeCancel.self, databaseSettings),
        (Skipped.self, databaseSettings),
        (Status.self, databaseSettings + ["METRICSD_DAILY_AT"]),
        (Healthcheck.self, ["METRICSD_LISTEN", "METRICSD_INTERNAL_LISTEN", "METRICSD_TLS", "METRICSD_ENV_FILE"]),
        (CheckConfig.self, nil),
    ]

    static let databaseSettings = [
        "DATABASE_URL", "METRICSD_DB_PASSWORD_FILE", "METRICSD_ENV_FILE", "METRICSD_CREDSTORE",
    ]

    static func name(_ type: any ParsableCommand.Type) -> String {
        type.configuration.commandName ?? String(describing: type).lowercased()
    }

    /// Handles an unknown command and help; returns the exit code, or nil to go on with ArgumentParser.
    static func handle(_ arguments: [String]) -> Int32? {
        let names = Self.commands.map { Self.name($0.type) }
        let known = Set(names + ["help", Self.name(GenerateDocs.self), Self.name(RefreshCredentials.self)])
        guard let first = arguments.first else { return nil }
        if !first.hasPrefix("-"), !known.contains(first) {
            Self.unknown(first, names: names)
            return Self.usageError
        }
        // `metricsd help [COMMAND]`, `metricsd [COMMAND] --help|-h`
        let wantsHelp = first == "help" || arguments.contains("--help") || arguments.contains("-h")
        guard wantsHelp else { return nil }
        let commandName = first == "help" ? arguments.dropFirst().first : (first.hasPrefix("-") ? nil : first)
        if let commandName, !known.contains(commandName) || commandName == "help" {
            if commandName == "help" { return Self.printHelp(nil) }
            Self.unknown(commandName, names: names)
            return Self.usageError
        }
        return Self.printHelp(commandName.flatMap { name in Self.commands.first { Self.name($0.type) == name } })
    }

    static func terminate(_ code: Int32) -> Never {
        exit(code)
    }

    static func printHelp(_ command: (type: any ParsableCommand.Type, environment: [String]?)?) -> Int32 {
        let width = 80
        var text: String
        if let command {
            text = MetricsdCommand.helpMessage(for: command.type, columns: width)
            while text.hasSuffix("\n") { text.removeLast() }
            text += "\n\n"
            text +=
                command.environment.map { Documentation.commandEnvironmentHelp($0, width: width) }
                ?? Documentation.environmentHelp(width: width)
        } else {
            text = MetricsdCommand.helpMessage(columns: width)
            while text.hasSuffix("\n") { text.removeLast() }
            text += "\n\n" + Documentation.environmentHelp(width: width)
        }
        print(text)
        return 0
    }

    static func unknown(_ command: String, names: [String]) {
        var message = "metricsd: unknown command '\(command)'."
        if let nearest = Self.nearest(command, in: names) { message += " Did you mean '\(nearest)'?" }
        message += "\nCommands: \(names.joined(separator: ", ")). Run 'metricsd help' for more; see man 8 metricsd.\n"
        StandardError.write(message)
    }

    /// The command closest to `word` by edit distance, when close enough to be a typo (or `word` is its prefix).
    static func nearest(_ word: String, in names: [String]) -> String? {
        let scored = names.map { (name: $0, distance: editDistance(word.lowercased(), $0)) }
        guard let best = scored.min(by: { $0.distance < $1.distance }) else { return nil }
        if best.distance <= max(2, best.name.count / 3) { return best.name }
        return names.first { $0.hasPrefix(word.lowercased()) && word.count >= 3 }
    }

    /// A whole-number option value in `range`, else a usage error saying so.
    static func wholeNumber(_ text: String, option: String, range: ClosedRange<Int>) throws -> Int {
        guard let value = Int(text), range.contains(value) else {
            throw ValidationError(
                "\(option) must be a whole number from \(range.lowerBound) to \(range.upperBound), got \(text.isEmpty ? "nothing" : text)"
            )
        }
        return value
    }

    /// A number of seconds in `range`, else a usage error saying so.
    static func seconds(_ text: String, option: String, range: ClosedRange<Double>) throws -> Double {
        guard let value = Double(text), value.isFinite, range.contains(value) else {
            throw ValidationError(
                "\(option) must be a number of seconds from \(Self.plain(range.lowerBound)) to \(Self.plain(range.upperBound)), got \(text.isEmpty ? "nothing" : text)"
            )
        }
        return value
    }

    static func plain(_ value: Double) -> String { value == value.rounded() ? String(Int(value)) : String(value) }
}
