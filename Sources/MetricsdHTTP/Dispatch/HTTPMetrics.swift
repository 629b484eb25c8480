import CoreMetrics
import HTTPTypes
import Synchronization

/// HTTP series for `/metrics`: requests by route and status, latency by route.
///
/// The metric objects are made once per (route, method, status) and kept: making them asks the metrics backend
/// to look its registry up (a lock, label strings) on every request otherwise. Routes are the endpoints' path
/// templates (plus "unmatched", "shed", "too_large"), so the set stays small whatever clients send.
enum HTTPMetrics {
    private struct Key: Hashable {
        let route: String
        let method: String
        let status: Int
    }

    private static let cache = Mutex<[Key: (CoreMetrics.Counter, CoreMetrics.Timer)]>([:])

    static func record(route: String, method: HTTPRequest.Method, status: Int, since started: ContinuousClock.Instant) {
        let elapsed = (ContinuousClock.now - started).components
        let nanoseconds = elapsed.seconds * 1_000_000_000 + elapsed.attoseconds / 1_000_000_000
        let key = Key(route: route, method: method.rawValue, status: status)
        let (counter, timer) = Self.cache.withLock { cache in
            if let cached = cache[key] { return cached }
            let made = (
                Counter(
                    label: "metricsd_http_requests_total",
                    dimensions: [("route", route), ("method", key.method), ("status", String(status))]),
                CoreMetrics.Timer(label: "metricsd_http_request_duration_seconds", dimensions: [("route", route)])
            )
            cache[key] = made
            return made
        }
        counter.increment()
        timer.recordNanoseconds(nanoseconds)
    }
}
