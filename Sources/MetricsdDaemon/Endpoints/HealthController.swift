import HTTPTypes
import HealthMetrics
import MetricsdHTTP
import MetricsdWork
import NIOCore

/// `/healthz` (the process answers), `/readyz` (database reachable and schema current, probed at most once a
/// second: ``ReadinessProbe``) and `/openapi.yaml`.
struct HealthController {
    let store: any MetricsStore
    let notifications: NotificationStatus

    var endpoints: [Endpoint] {
        let probe = ReadinessProbe(store: self.store)
        let notifications = self.notifications
        return [
            Endpoint(
                .get, "/healthz", access: .open, caching: .noStore, .immediate { _ in .json(#"{"status":"ok"}"#) }),
            Endpoint(
                .get, "/readyz", access: .open, caching: .noStore,
                .async { _ in
                    let (readiness, measured) = await probe.current()
                    let age = ContinuousClock.now - measured
                    let milliseconds =
                        age.components.seconds * 1000 + age.components.attoseconds / 1_000_000_000_000_000
                    return .json(
                        JSONWriter.object([
                            "status": .string(readiness.isReady ? "ready" : "not_ready"),
                            "database": .string(readiness.database.rawValue),
                            "schema": .string(readiness.schema.rawValue),
                            "reason": readiness.reason.map { .string($0) } ?? .null,
                            // Polling is no reason to take the instance out of service: a detail, not a 503.
                            "notifications": notifications.detail.map { .string($0) } ?? .null,
                            "ageSeconds": .raw(Self.seconds(milliseconds: max(0, milliseconds))),
                        ]), status: readiness.isReady ? .ok : .serviceUnavailable)
                }),
            Endpoint(
                .get, "/openapi.yaml", access: .open, caching: .revalidate,
                .immediate { _ in
                    Reply(headers: [.contentType: "application/yaml"], body: Self.document, entityTag: Self.documentTag)
                }),
        ]
    }

    /// Milliseconds as seconds with three decimals (`0.042`): the same width for every age under 10 s, so a HEAD
    /// and the GET after it announce the same length.
    static func seconds(milliseconds: Int64) -> String {
        let fraction = String(milliseconds % 1000)
        return "\(milliseconds / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
    }

    /// The document: one buffer every reply shares (a reply's body is a reference to it, not a copy), and its tag,
    /// computed once (a digest of its 51 KB on every request cost the event loop more than the rest of the reply).
    private static let document = ByteBuffer(string: OpenAPIDocument.yaml)
    private static let documentTag = EntityTag.strong(of: document)
}
