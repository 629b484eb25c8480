import ArgumentParser
import Foundation
import MetricsdApp

@main
struct Metricsd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "metricsd",
        abstract: "Daily health metrics (BMI, BMR, TDEE) for every user, at 00:05 in their own time zone.",
        discussion: "Configuration comes from the environment and systemd credentials; see the README.",
        version: BuildInfo.version,
        subcommands: [
            Serve.self, Migrate.self, RecomputeAll.self, RecomputeStatus.self, RecomputeCancel.self, Skipped.self,
            Status.self, Healthcheck.self,
        ],
        defaultSubcommand: Serve.self)
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
        try await CommandLineTool.run { tool in
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
        try await CommandLineTool.run { tool in
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
        try await CommandLineTool.run { tool in
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
        try await CommandLineTool.run { tool in
            try await tool.recomputeCancel(id: self.id)
        }
    }
}

struct Skipped: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List users who got no metrics, and why.")

    @Option(help: "How many users to list (newest first).")
    var limit = 50

    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        try await CommandLineTool.run { tool in
            try await tool.skipped(limit: self.limit, json: self.json)
        }
    }
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show schema, instances, today's units per zone, skips, recompute jobs and formula versions.")

    @Flag(help: "Print JSON for scripts.")
    var json = false

    func run() async throws {
        try await CommandLineTool.run { tool in
            try await tool.status(json: self.json)
        }
    }
}

struct Healthcheck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Ask the running daemon whether it is ready; exit 0 if so, 1 with a one-line reason if not.")

    @Option(help: "The daemon's address (default: METRICSD_LISTEN, else 127.0.0.1:8080).")
    var address: String?

    @Option(help: "Seconds to wait for an answer.")
    var timeout: Double = 5

    func run() async throws {
        let code = await CommandLineTool.healthcheck(
            address: self.address, timeout: self.timeout, environment: ProcessInfo.processInfo.environment)
        if code != 0 { throw ExitCode(code) }
    }
}
