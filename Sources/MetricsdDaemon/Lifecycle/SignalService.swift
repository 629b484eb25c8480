import Glibc
import Logging
import ServiceLifecycle
import UnixSignals

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The signals the service group does not handle itself: SIGHUP reloads; the first SIGTERM or SIGINT (which the
/// group also traps, and answers with a graceful shutdown) is reported; a second one exits at once.
///
/// Put it first in the group: services stop in reverse order, so it keeps listening until everything else has
/// stopped, and a second stop signal during a slow shutdown is still heard.
package struct SignalService: Service {
    /// What a stop signal starts, called once with the signal's name (`STOPPING=1`, a log line).
    let stopping: @Sendable (String) -> Void
    /// What SIGHUP does.
    let reload: @Sendable () async -> Void
    let logger: Logger

    package init(
        stopping: @escaping @Sendable (String) -> Void, reload: @escaping @Sendable () async -> Void, logger: Logger
    ) {
        self.stopping = stopping
        self.reload = reload
        self.logger = logger
    }

    package func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup, .sigterm, .sigint)
        var stopSignals = 0
        for await signal in signals.cancelOnGracefulShutdown() {
            switch signal {
            case .sighup:
                await self.reload()
            default:
                stopSignals += 1
                if stopSignals == 1 {
                    self.stopping("\(signal)")
                } else {
                    self.logger.warning(
                        "Second stop signal: exiting at once", metadata: ["metricsd.signal": "\(signal)"])
                    exit(1)
                }
            }
        }
    }
}
