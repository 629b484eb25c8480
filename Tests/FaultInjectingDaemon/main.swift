import Foundation
import MetricsdCLI
import MetricsdDaemon
import MetricsdPostgres

// `metricsd` with faults injected through the daemon's test seams (`DaemonHooks`), for the fault-injection tests.
// Built beside the real binary, never packaged. The faults come from METRICSD_FAULTS, comma-separated:
//   batch-delay-ms=N           every batch waits N ms before its COMMIT (tests interrupt a unit mid-way)
//   stall-scheduler-after=N    after N ticks the scheduler loop hangs (no liveness beats), as a deadlock would
// The variable is removed before the daemon reads its environment.

var hooks = DaemonHooks()
let faults = ProcessInfo.processInfo.environment["METRICSD_FAULTS"] ?? ""
unsetenv("METRICSD_FAULTS")
for item in faults.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
    let parts = item.split(separator: "=", maxSplits: 1).map(String.init)
    guard parts.count == 2, let value = Int(parts[1]), value >= 0 else {
        FileHandle.standardError.write(Data("metricsd-faults: '\(item)' is not name=number\n".utf8))
        exit(64)
    }
    switch parts[0] {
    case "batch-delay-ms":
        hooks.beforeCommit = { _, _ in usleep(UInt32(value) * 1000) }
    case "stall-scheduler-after":
        hooks.beforeTick = { ticks in
            guard ticks >= value else { return }
            FileHandle.standardError.write(Data("metricsd-faults: scheduler loop stalled after \(ticks) ticks\n".utf8))
            while !Task.isCancelled { try? await Task.sleep(for: .milliseconds(200)) }
        }
    default:
        FileHandle.standardError.write(Data("metricsd-faults: unknown fault '\(parts[0])'\n".utf8))
        exit(64)
    }
}
await DaemonHooks.$current.withValue(hooks) {
    await MetricsdCommand.main()
}
