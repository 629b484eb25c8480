import HTTPTypes
import NIOCore

/// How a reply may be cached: chosen once per endpoint, written on every reply by the dispatcher.
///
/// - ``personal``: a person's health data (the latest read). `Cache-Control: private, no-cache` and
///   `Vary: Authorization`: no shared cache (a proxy, a CDN) may keep it; the phone's own HTTP cache may, but
///   must ask the daemon before every use, with the reply's `ETag` in `If-None-Match`, and gets a small `304`
///   while nothing changed. Metrics change at 00:05 local time, after a settings change, a recompute or an
///   acknowledgement; a reply reused without asking would show yesterday's metrics, which is what this service
///   exists to prevent.
/// - ``noStore``: state of the moment (health, readiness, `/metrics`, the admin API, a POST's reply, every
///   error): `Cache-Control: no-store`; a stored copy would only ever be wrong.
/// - ``revalidate``: the same for every client and changing only with a release (`/openapi.yaml`):
///   `Cache-Control: no-cache`, any cache may keep it and revalidates it with its `ETag`.
package enum CachePolicy: Sendable {
    case personal
    case noStore
    case revalidate

    /// The `Cache-Control` value.
    package var cacheControl: String {
        switch self {
        case .personal: return "private, no-cache"
        case .noStore: return "no-store"
        case .revalidate: return "no-cache"
        }
    }

    /// Whether a successful reply carries a strong `ETag` and answers `If-None-Match` with `304`.
    package var hasValidator: Bool {
        switch self {
        case .personal, .revalidate: return true
        case .noStore: return false
        }
    }

    /// Sets `Cache-Control` (and `Vary` for personal replies) on a reply's fields.
    package func apply(to fields: inout HTTPFields) {
        fields[.cacheControl] = self.cacheControl
        if case .personal = self { fields[.vary] = "Authorization" }
    }
}

extension CachePolicy {
    /// Gives a reply its caching headers. An error (any status outside 2xx) is `no-store` whatever the endpoint.
    /// A `200` of an endpoint with a validator gets its strong `ETag`; when the request is a GET or HEAD whose
    /// `If-None-Match` matches it (RFC 9110 §13.1.2: `*`, or a listed tag by weak comparison), the reply becomes
    /// `304 Not Modified` with the same caching headers and tag and no body. The tag is computed from the body
    /// the handler built (or given by the endpoint, computed once, for a body that never changes), so a `304`
    /// costs the database what a `200` does (one read) and saves the body's bytes on the wire.
    func prepare(_ reply: inout Reply, method: HTTPRequest.Method, ifNoneMatch: [String]?) {
        guard (200..<300).contains(reply.status.code) else {
            reply.headers[.cacheControl] = CachePolicy.noStore.cacheControl
            return
        }
        self.apply(to: &reply.headers)
        guard self.hasValidator, reply.status == .ok else { return }
        let tag = reply.entityTag ?? EntityTag.strong(of: reply.body)
        reply.headers[.eTag] = tag.description
        guard method == .get || method == .head, let ifNoneMatch,
            let condition = IfNoneMatch(fieldLines: ifNoneMatch), condition.matches(tag)
        else { return }
        reply.status = .notModified
        reply.body.clear()
    }
}
