import HealthMetrics
import Hummingbird
import NIOCore

/// `/healthz` (the process answers), `/readyz` (database reachable and schema current) and `/openapi.yaml`.
struct HealthController {
    let store: any MetricsStore

    func addRoutes(to router: Router<AppRequestContext>) {
        router.get("healthz") { _, _ in JSONResponse(body: #"{"status":"ok"}"#) }
        router.get("readyz") { _, _ in
            let readiness = await self.store.readiness()
            return JSONResponse(
                status: readiness.isReady ? .ok : .serviceUnavailable,
                body: JSONWriter.object([
                    "status": .string(readiness.isReady ? "ready" : "not_ready"),
                    "database": .string(readiness.database.rawValue),
                    "schema": .string(readiness.schema.rawValue),
                    "reason": readiness.reason.map { .string($0) } ?? .null,
                ]))
        }
        router.get("openapi.yaml") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/yaml"],
                body: .init(byteBuffer: ByteBuffer(string: OpenAPIDocument.yaml)))
        }
    }
}
