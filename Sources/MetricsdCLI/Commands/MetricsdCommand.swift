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

/// `metricsd`: the root command; the executable calls ``main()``.
public struct MetricsdCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "metricsd",
        abstract: "Daily health metrics (BMI, BMR, TDEE) for every user, at 00:05 in their own time zone.",
        discussion: "Without a command, metricsd serves. Settings and files: see ENVIRONMENT below and man 8 metricsd.",
        version: BuildInfo.versionText,
        subcommands: [
            Serve.self, Migrate.self, RecomputeAll.self, RecomputeStatus.self, RecomputeCancel.self, Skipped.self,
            Status.self, Healthcheck.self, CheckConfig.self, GenerateDocs.self, RefreshCredentials.self,
        ],
        defaultSubcommand: Serve.self)

    /// ArgumentParser's entry point, after ``ArgumentPreflight`` has handled what it would get wrong: an unknown
    /// command (else parsed as arguments of the default command, `serve`) and help (with the environment).
    public init() {}

    public static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        if let code = ArgumentPreflight.handle(arguments) { ArgumentPreflight.terminate(code) }
        do {
            var command = try Self.parseAsRoot(arguments)
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch {
            Self.exit(withError: error)
        }
    }
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the daemon (the default).")

    @Flag(help: "Apply pending migrations before serving.")
    var migrate = false

    func run() async throws {
        let code = await Daemon.serve(environment: ProcessInfo.processInfo.environment, migrate: self.migrate)
        if code != 0 { throw ExitCode(code) }
    }
}

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply pending migrations (safe when several instances run it at once).")

    @Flag(help: "Only show which migrations are applied and pending.")
    var dryRun = false

    func run() async throws {
        try await OperatorSession.run { tool in
            try await tool.migrate(dryRun: self.dryRun)
        }
    }
}

struct RecomputeAll: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recompute-all",
        abstract: "Start (or find) the recompute-all job for this build's formula version and print its id.")

    @Flag(help: "Wait for the job and show its progress; exit 0 when it completes, 1 if it fails or is cancelled.")
    var wait = false

    func run() async throws {
        try await OperatorSession.run { tool in
            try await tool.recomputeAll(wait: self.wait)
        }
    }
}

struct RecomputeStatus: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recompute-status", abstract: "Show a recompute job's progress (the recent jobs without an id).")

    @Argument(help: "The job id.")
    var id: Int64?

    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        try await OperatorSession.run { tool in
            try await tool.recomputeStatus(id: self.id, json: self.json)
        }
    }
}

struct RecomputeCancel: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recompute-cancel",
        abstract: "Cancel a recompute job; triggering again later continues where it stopped.")

    @Argument(help: "The job id.")
    var id: Int64

    func run() async throws {
        try await OperatorSession.run { tool in
            try await tool.recomputeCancel(id: self.id)
        }
    }
}

struct Skipped: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List users who got no metrics, and why.")

    // A string, checked in validate(): as an Int, "--limit -1" read "-1" as an option ("Missing value").
    @Option(parsing: .unconditional, help: "How many users to list, newest first (1-10000000).")
    var limit = "50"

    @Flag(help: "Print JSON.")
    var json = false

    func validate() throws {
        _ = try ArgumentPreflight.wholeNumber(self.limit, option: "--limit", range: 1...10_000_000)
    }

    func run() async throws {
        let limit = try ArgumentPreflight.wholeNumber(self.limit, option: "--limit", range: 1...10_000_000)
        try await OperatorSession.run { tool in
            try await tool.skipped(limit: limit, json: self.json)
        }
    }
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show schema, instances, today's units per zone, skips, recompute jobs and formula versions.")

    @Flag(help: "Print JSON for scripts.")
    var json = false

    func run() async throws {
        try await OperatorSession.run { tool in
            try await tool.status(json: self.json)
        }
    }
}

struct Healthcheck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Ask the running daemon whether it is ready; exit 0 if so, 1 with a one-line reason if not.")

    @Option(help: "The daemon's address (default: METRICSD_LISTEN, else \(SettingsCatalog.defaultListen)).")
    var address: String?

    @Option(parsing: .unconditional, help: "Seconds to wait for an answer (0.1-300).")
    var timeout = "5"

    func validate() throws {
        _ = try ArgumentPreflight.seconds(self.timeout, option: "--timeout", range: 0.1...300)
    }

    func run() async throws {
        let timeout = try ArgumentPreflight.seconds(self.timeout, option: "--timeout", range: 0.1...300)
        let code = await OperatorSession.healthcheck(
            address: self.address, timeout: timeout, environment: ProcessInfo.processInfo.environment)
        if code != 0 { throw ExitCode(code) }
    }
}

struct CheckConfig: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Check the whole configuration: settings, secrets, listeners, database and schema.",
        discussion: """
            Reads the configuration as `metricsd serve` would here, starts nothing, and prints each problem as one \
            line, `metricsd: <SETTING>: <problem> [<code>]` (the problem's stable error code), on stderr, then each \
            warning, `metricsd: warning: <SETTING>: …` (a secret other local users can read: a plain environment \
            variable, a world-readable file; a TLS certificate that expires within 14 days or is not valid yet), \
            then a summary of what was checked. A TLS certificate that has expired, or whose key is RSA under 2048 \
            bits or EC on a curve other than P-256, P-384 or P-521, is a problem. Exit 0 when the configuration is \
            fine (warnings or not), 78 when it has problems. Run it as root to check the credentials.
            """)

    func run() async throws {
        let check = await ConfigCheck.run(environment: ProcessInfo.processInfo.environment)
        for line in check.problemLines + check.warningLines {
            StandardError.write(line + "\n")
        }
        print(check.summaryText)
        if !check.isOK { throw ExitCode(78) }
    }
}

/// Writes the man page or the settings file example from the settings table (the committed copies are checked
/// against this output by the tests).
struct GenerateDocs: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "generate-docs", abstract: "Print the man page (man) or metricsd.env.example (env-example).",
        shouldDisplay: false)

    @Argument(help: "man or env-example")
    var document: String

    func validate() throws {
        guard ["man", "env-example"].contains(self.document) else {
            throw ValidationError("the document must be man or env-example, got '\(self.document)'")
        }
    }

    func run() throws {
        switch self.document {
        case "man": print(ManPage.render(), terminator: "")
        default: print(Documentation.environmentFileExample(), terminator: "")
        }
    }
}
