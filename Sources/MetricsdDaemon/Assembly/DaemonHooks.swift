import MetricsdConfiguration
import MetricsdPostgres
import MetricsdReads
import MetricsdWork

/// Seams through which a test build injects faults into a running daemon: the fault-injecting test daemon
/// (`Tests/FaultInjectingDaemon`) sets them around `metricsd serve`; the shipped binary never does, and no setting
/// reaches them.
package struct DaemonHooks: Sendable {
    /// Runs after each batch's statement, before its `COMMIT` (a delay lets a test interrupt a unit mid-way).
    package var beforeCommit: (@Sendable (PostgresConnection, ClaimedChunk) throws -> Void)?
    /// Runs before each turn of the scheduler loop with the number of ticks so far (a hang there stops the loop's
    /// liveness beats, as a deadlock would).
    package var beforeTick: (@Sendable (Int) async -> Void)?

    package init() {}

    /// The hooks of the daemon started in this task (none outside the test daemon).
    @TaskLocal package static var current = DaemonHooks()
}
