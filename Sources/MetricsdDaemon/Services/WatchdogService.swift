import Logging
import MetricsdHTTP
import MetricsdSystemd
import MetricsdWork
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization

/// Pings systemd's watchdog every `WATCHDOG_USEC/2`, but only while the service is genuinely alive: the scheduler
/// loop went round recently and an HTTP event loop runs a task. A hang stops the pings and systemd restarts the
/// service; a database outage does not (the scheduler keeps ticking and reports it in STATUS and `/readyz`).
package struct WatchdogService: Service {
    let configuration: WatchdogConfiguration
    let notifier: SystemdNotifier
    let liveness: Liveness
    let eventLoopGroup: any EventLoopGroup
    let logger: Logger

    /// How old the scheduler's last beat may be. The loop beats every second.
    var staleAfter: Duration { max(.seconds(3), self.configuration.pingInterval) }

    package init(
        configuration: WatchdogConfiguration, notifier: SystemdNotifier, liveness: Liveness,
        eventLoopGroup: any EventLoopGroup, logger: Logger
    ) {
        self.configuration = configuration
        self.notifier = notifier
        self.liveness = liveness
        self.eventLoopGroup = eventLoopGroup
        self.logger = logger
    }

    package func run() async throws {
        var wasAlive = true
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            let schedulerAge = self.liveness.age
            let eventLoopAnswers = await self.eventLoopAnswers(within: .seconds(1))
            let alive = schedulerAge <= self.staleAfter && eventLoopAnswers
            if alive {
                self.notifier.watchdogPing()
            } else if wasAlive {
                self.logger.error(
                    "Not alive: withholding watchdog pings",
                    metadata: [
                        "metricsd.scheduler.beat.age": "\(schedulerAge)",
                        "metricsd.event_loop.answers": "\(eventLoopAnswers)",
                    ])
            }
            wasAlive = alive
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: self.configuration.pingInterval) }
        }
    }

    /// Whether an event loop runs a submitted task within `timeout`. The timeout runs off the loop (a hung loop
    /// could not fire its own timer), in a child task; the wait for the loop's answer gives up when the timeout
    /// wins, so the group never waits for a loop that hangs.
    private func eventLoopAnswers(within timeout: Duration) async -> Bool {
        let answered = self.eventLoopGroup.next().submit { true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await Self.value(of: answered) }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    /// The future's value, or false once the waiting task is cancelled (whether or not the future completes).
    private static func value(of future: EventLoopFuture<Bool>) async -> Bool {
        let once = Mutex<CheckedContinuation<Bool, Never>?>(nil)
        let resume: @Sendable (Bool) -> Void = { value in
            once.withLock { continuation in
                continuation?.resume(returning: value)
                continuation = nil
            }
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                once.withLock { $0 = continuation }
                if Task.isCancelled { resume(false) }
                future.whenComplete { resume((try? $0.get()) ?? false) }
            }
        } onCancel: {
            resume(false)
        }
    }
}
