import MetricsdHTTP
import HealthMetrics
import HTTPTypes
import NIOCore

/// `/healthz` (the process answers), `/readyz` (database reachable and schema current) and `/openapi.yaml`.
struct HealthController {
    let store: any MetricsStore

    var endpoints: [Endpoint] {
        let store = self.store
        return [
            Endpoint(.get, "/healthz", access: .open, caching: .noStore, .immediate { _ in .json(#"{"status":"ok"}"#) }),
            Endpoint(
                .get, "/readyz", access: .open, caching: .noStore,
                .async { _ in
                    let readiness = await store.readiness()
                    return .json(
                        JSONWriter.object([
                            "status": .string(readiness.isReady ? "ready" : "not_ready"),
                            "database": .string(readiness.database.rawValue),
                            "schema": .string(readiness.schema.rawValue),
                            "reason": readiness.reason.map { .string($0) } ?? .null,
                        ]), status: readiness.isReady ? .ok : .serviceUnavailable)
                }),
            Endpoint(
                .get, "/openapi.yaml", access: .open, caching: .revalidate,
                .immediate { _ in Reply(headers: [.contentType: "application/yaml"], body: Self.document) }),
        ]
    }

    private static let document = ByteBuffer(string: OpenAPIDocument.yaml)
}
