import HTTPTypes
import HealthMetrics
import Logging
import MetricsdHTTP
import MetricsdPostgres
import MetricsdWork
import NIOCore
import Prometheus

/// What the HTTP API is built from.
public struct HTTPDependencies: Sendable {
    public var store: any MetricsStore
    /// Recompute jobs; nil when no admin token is configured (then no admin route exists at all).
    public var jobs: RecomputeJobs?
    public var credentials: CredentialBox
    public var formula: MetricsFormula
    /// Serves `/metrics` on the API listener when set.
    public var prometheus: PrometheusCollectorRegistry?
    /// Concurrent requests beyond which new ones get an immediate 503 (`METRICSD_MAX_IN_FLIGHT`).
    public var maxInFlight: Int
    /// The request log (its mode changes on reload).
    public var requestLog: RequestLog
    /// Peers whose `Forwarded`/`X-Forwarded-For` name the client in the request log.
    public var trustedProxies = TrustedProxies()
    /// Whether the daemon hears notifications or polls (`/readyz`'s detail).
    public var notifications = NotificationStatus()
    /// Requests in flight, shared by every listener.
    package let inFlight = InFlightCounter()
    /// Exports streaming, shared by every listener.
    let exports = ExportGate()

    public init(
        store: any MetricsStore, jobs: RecomputeJobs?, credentials: CredentialBox, formula: MetricsFormula,
        prometheus: PrometheusCollectorRegistry?, maxInFlight: Int, requestLog: RequestLog
    ) {
        self.store = store
        self.jobs = jobs
        self.credentials = credentials
        self.formula = formula
        self.prometheus = prometheus
        self.maxInFlight = maxInFlight
        self.requestLog = requestLog
    }
}

/// Which endpoints a listener serves.
public enum HTTPEndpoints: Sendable {
    /// Everything on one listener: the API (OpenAPI document: `Sources/MetricsdDaemon/Resources/openapi.yaml`),
    /// with `/metrics` when the dependencies carry a registry and the admin API when they carry jobs.
    case api
    /// The public listener beside an internal one: the user API and the health checks only (`/metrics` and the
    /// admin paths answer 404 there).
    case `public`
    /// The internal listener (`METRICSD_INTERNAL_LISTEN`): `/metrics` from this registry, the admin API (when the
    /// dependencies carry jobs) and the health checks.
    case `internal`(PrometheusCollectorRegistry)

    func list(_ dependencies: HTTPDependencies) -> [Endpoint] {
        let health = HealthController(store: dependencies.store, notifications: dependencies.notifications).endpoints
        let admin = dependencies.jobs.map { AdminController(jobs: $0, formula: dependencies.formula).endpoints } ?? []
        let user =
            ProfileMetricsController(store: dependencies.store, formula: dependencies.formula).endpoints
            + ((dependencies.store as? any MetricsHistoryStore).map {
                ProfileHistoryController(store: $0, formula: dependencies.formula).endpoints
            } ?? [])
            + ((dependencies.store as? any MetricsExportStore).map {
                ProfileExportController(store: $0, gate: dependencies.exports).endpoints
            } ?? [])
        switch self {
        case .api:
            return user + health + (dependencies.prometheus.map { [metricsEndpoint($0)] } ?? []) + admin
        case .public:
            return user + health
        case .internal(let registry):
            return [metricsEndpoint(registry)] + health + admin
        }
    }
}

/// `GET /metrics`: the Prometheus text format, rendered in the connection's task: rendering every series cost the
/// event loop ~45 µs per request, about what an event loop may be held at most (scripts/bench, step eventloop).
func metricsEndpoint(_ registry: PrometheusCollectorRegistry) -> Endpoint {
    Endpoint(
        .get, "/metrics", access: .open, caching: .noStore,
        .async { _ in
            var buffer: [UInt8] = []
            buffer.reserveCapacity(16 * 1024)
            registry.emit(into: &buffer)
            return Reply(
                headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"], body: ByteBuffer(bytes: buffer))
        })
}

/// The daemon's HTTP server for one listener: the HTTP module's server with this daemon's endpoints.
/// - Parameters:
///   - requestTimeout: for a request's head, and for its body.
///   - idleTimeout: between a reply and the next request.
///   - writeTimeout: for a reply the client does not take (closing replies included).
package func buildAPIServer(
    _ dependencies: HTTPDependencies, endpoints: HTTPEndpoints = .api, sockets: [ListenerSocket],
    requestTimeout: TimeAmount, idleTimeout: TimeAmount, writeTimeout: TimeAmount = .seconds(10),
    tls: TLSIdentity? = nil,
    connectionLimit: ConnectionLimit.Settings? = nil, onServerRunning: (@Sendable ([any Channel]) async -> Void)? = nil,
    logger: Logger
) -> HTTPServer {
    buildHTTPServer(
        endpoints: endpoints.list(dependencies), credentials: dependencies.credentials, inFlight: dependencies.inFlight,
        maxInFlight: dependencies.maxInFlight, requestLog: dependencies.requestLog, sockets: sockets,
        timeouts: HTTPTimeouts(request: requestTimeout, idle: idleTimeout, write: writeTimeout),
        proxies: dependencies.trustedProxies, tls: tls, connectionLimit: connectionLimit,
        onServerRunning: onServerRunning, logger: logger)
}
