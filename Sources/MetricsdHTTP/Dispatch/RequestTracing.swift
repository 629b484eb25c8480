import HTTPTypes
import MetricsdTracing
import Tracing

/// What the connection knows of a request for its server span (``APIDispatcher``); made only while tracing is on.
struct RequestTraceInput: Sendable {
    /// `traceparent` and `tracestate` as a trusted proxy sent them; nil from any other peer.
    var traceParent: String?
    var traceState: String?
    /// `http` or `https`.
    var scheme: String
    /// The `Host` header.
    var host: String?
    /// The listener's address and port, when the `Host` header names none.
    var localAddress: String?
    var localPort: Int?
}

/// A request's server span (OpenTelemetry's HTTP server conventions): named `METHOD route` once the route is known
/// (the route template, never the path with its values), ended with the status when the reply is ready.
enum RequestTracing {
    static let traceParentField = HTTPField.Name("traceparent")!

    static func start(method: HTTPRequest.Method, input: RequestTraceInput) -> MetricsdSpan? {
        let parent = Traces.remoteParent(traceParent: input.traceParent, traceState: input.traceState)
        guard let span = Traces.startSpan(method.rawValue, kind: .server, parent: parent) else { return nil }
        span.set("http.request.method", .string(method.rawValue))
        span.set("url.scheme", .string(input.scheme))
        let (host, port) = Self.hostAndPort(input.host)
        if let host = host ?? input.localAddress { span.set("server.address", .string(host)) }
        if let port = port ?? input.localPort { span.set("server.port", .int64(Int64(port))) }
        return span
    }

    /// Names the span after its route (metricsd's pseudo-routes `unmatched`, `shed`, `too_large` are no routes:
    /// the name stays the method), sets the status, ends it; returns the `traceparent` to answer with when sampled.
    static func finish(_ span: MetricsdSpan, method: HTTPRequest.Method, route: String, status: Int) -> String? {
        if route.hasPrefix("/") {
            span.operationName = "\(method.rawValue) \(route)"
            span.set("http.route", .string(route))
        }
        span.set("http.response.status_code", .int64(Int64(status)))
        if status >= 500 {
            span.set("error.type", .string(String(status)))
            span.setStatus(SpanStatus(code: .error))
        }
        span.end()
        return span.sampledTraceParent
    }

    /// `example.org:8443` → (`example.org`, 8443); `[::1]` → (`::1`, nil).
    static func hostAndPort(_ host: String?) -> (String?, Int?) {
        guard let host, !host.isEmpty else { return (nil, nil) }
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
            let name = String(host[host.index(after: host.startIndex)..<close])
            let rest = host[host.index(after: close)...]
            return (name, rest.hasPrefix(":") ? Int(rest.dropFirst()) : nil)
        }
        if let colon = host.lastIndex(of: ":"), let port = Int(host[host.index(after: colon)...]) {
            return (String(host[..<colon]), port)
        }
        return (host, nil)
    }
}
