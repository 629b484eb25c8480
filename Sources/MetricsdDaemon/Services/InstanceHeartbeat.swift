import HealthMetrics
import Logging
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import ServiceLifecycle

/// Writes this instance's heartbeat row every `interval` (with what its latest reads see of their read servers,
/// when it has any), and marks it stopped on a clean shutdown.
package struct InstanceHeartbeat: Service {
    let instances: Instances
    let identity: Instances.Identity
    let interval: Duration
    let replicas: ReadReplicas?
    let logger: Logger

    package init(
        instances: Instances, identity: Instances.Identity, interval: Duration, replicas: ReadReplicas? = nil,
        logger: Logger
    ) {
        self.instances = instances
        self.identity = identity
        self.interval = interval
        self.replicas = replicas
        self.logger = logger
    }

    package func run() async throws {
        var failing = false
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await self.instances.beat(self.identity, readServers: self.replicas?.status() ?? [])
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
