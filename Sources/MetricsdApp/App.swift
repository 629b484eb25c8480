import HealthMetrics
import Hummingbird
import Logging
import MetricsdPostgres
import NIOCore
import Prometheus

/// What the HTTP API is built from.
public struct HTTPDependencies: Sendable {
    public var store: any MetricsStore
    /// Recompute jobs; nil when no admin token is configured (then no admin route exists at all).
    public var jobs: RecomputeJobs?
    public var credentials: CredentialBox
    public var formula: MetricsFormula
    /// Serves `/metrics` on this router when set.
    public var prometheus: PrometheusCollectorRegistry?
    /// Concurrent requests beyond which new ones get an immediate 503.
    public var maxInFlight: Int
    /// Requests in flight, counted by the router and the hot path alike.
    let inFlight = InFlightCounter()

    public init(
        store: any MetricsStore, jobs: RecomputeJobs?, credentials: CredentialBox, formula: MetricsFormula,
        prometheus: PrometheusCollectorRegistry?, maxInFlight: Int = 512
    ) {
        self.store = store
        self.jobs = jobs
        self.credentials = credentials
        self.formula = formula
        self.prometheus = prometheus
        self.maxInFlight = maxInFlight
    }
}

/// The router of the API (OpenAPI document: `Sources/MetricsdApp/Resources/openapi.yaml`).
public func buildRouter(_ dependencies: HTTPDependencies) -> Router<AppRequestContext> {
    let router = Router(context: AppRequestContext.self)
    var known: [(String, [String])] = [
        ("/v1/profile/metrics/today", ["GET"]), ("/v1/profile/metrics/acknowledge", ["POST"]),
        ("/healthz", ["GET"]), ("/readyz", ["GET"]), ("/openapi.yaml", ["GET"]),
    ]
    if dependencies.prometheus != nil { known.append(("/metrics", ["GET"])) }
    if dependencies.jobs != nil {
        known += [
            ("/v1/admin/recompute", ["GET", "POST"]), ("/v1/admin/recompute/{id}", ["GET"]),
            ("/v1/admin/recompute/{id}/cancel", ["POST"]),
        ]
    }
    router.add(
        middleware: EdgeMiddleware(
            maxInFlight: dependencies.maxInFlight, inFlight: dependencies.inFlight, routes: KnownRoutes(known)))
    HealthController(store: dependencies.store).addRoutes(to: router)
    if let registry = dependencies.prometheus { addMetricsRoute(to: router, registry: registry) }
    ProfileMetricsController(store: dependencies.store, formula: dependencies.formula)
        .addRoutes(to: router.group("v1/profile/metrics").add(middleware: UserAuthMiddleware(credentials: dependencies.credentials)))
    if let jobs = dependencies.jobs {
        AdminController(jobs: jobs, formula: dependencies.formula)
            .addRoutes(to: router.group("v1/admin").add(middleware: AdminAuthMiddleware(credentials: dependencies.credentials)))
    }
    return router
}

/// `GET /metrics`: the Prometheus text format.
func addMetricsRoute<Context: RequestContext>(to router: Router<Context>, registry: PrometheusCollectorRegistry) {
    router.get("metrics") { _, _ in
        var buffer: [UInt8] = []
        buffer.reserveCapacity(16 * 1024)
        registry.emit(into: &buffer)
        return Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
    }
}
