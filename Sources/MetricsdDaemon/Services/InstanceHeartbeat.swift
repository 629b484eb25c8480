import MetricsdHTTP
import HealthMetrics
import Logging
import MetricsdPostgres
import ServiceLifecycle

/// Writes this instance's heartbeat row every `interval`, and marks it stopped on a clean shutdown.
package struct InstanceHeartbeat: Service {
    let instances: Instances
    let identity: Instances.Identity
    let interval: Duration
    let logger: Logger

    package init(instances: Instances, identity: Instances.Identity, interval: Duration, logger: Logger) {
        self.instances = instances
        self.identity = identity
        self.interval = interval
        self.logger = logger
    }

    package func run() async throws {
        var failing = false
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await self.instances.beat(self.identity)
                failing = false
            } catch {
                if !failing {
                    self.logger.warning("Heartbeat not recorded", metadata: .errorFields(error))
                }
                failing = true
            }
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: self.interval) }
        }
        try? await self.instances.stopped(self.identity)
    }
}
