import HTTPTypes

/// The endpoints by method and path.
///
/// Paths are compared segment by segment (the query string dropped); `{name}` matches any one segment. A path
/// with an empty or dot segment is not routed (404). A path that exists with other methods is a 405 naming them.
/// HEAD is answered as GET (the connection leaves out the body); CONNECT, which would turn the connection into a
/// tunnel, is not implemented.
struct RouteTable: Sendable {
    enum Match {
        case found(Endpoint, parameter: Substring?)
        case methodNotAllowed([String])
        case notImplemented
        case notFound
    }

    private struct Entry: Sendable {
        let segments: [Substring]
        let endpoints: [Endpoint]
        let parameterIndex: Int?
    }

    /// Routes without parameters by their normalised path: one dictionary lookup for the common case.
    private let exact: [String: Entry]
    private let parameterised: [Entry]

    init(_ endpoints: [Endpoint]) {
        var byRoute: [String: [Endpoint]] = [:]
        var order: [String] = []
        for endpoint in endpoints {
            if byRoute[endpoint.route] == nil { order.append(endpoint.route) }
            byRoute[endpoint.route, default: []].append(endpoint)
        }
        var exact: [String: Entry] = [:]
        var parameterised: [Entry] = []
        for route in order {
            let segments = route.split(separator: "/")
            let parameterIndex = segments.firstIndex { $0.hasPrefix("{") }
            let entry = Entry(segments: segments, endpoints: byRoute[route]!, parameterIndex: parameterIndex)
            if parameterIndex == nil {
                exact["/" + segments.joined(separator: "/")] = entry
            } else {
                parameterised.append(entry)
            }
        }
        self.exact = exact
        self.parameterised = parameterised
    }

    /// The path of a request target: what comes before the query string. An absolute-form target
    /// (`http://host:port/path?query`, which RFC 9112 §3.2.2 says a server must accept) is reduced to its path;
    /// the origin form, which every ordinary client sends, is taken as it is.
    static func path(of target: String) -> String {
        let path = target.utf8.first == UInt8(ascii: "/") ? Substring(target) : Self.originPath(ofAbsolute: target)
        guard let query = path.utf8.firstIndex(of: UInt8(ascii: "?")) else { return String(path) }
        return String(path[..<query])
    }

    /// The path of an absolute-form target: what follows `scheme://authority`; `/` when nothing does. A target
    /// that is neither form (`*`, an authority) has no path and matches no route.
    private static func originPath(ofAbsolute target: String) -> Substring {
        guard let separator = target.firstRange(of: "://") else { return Substring(target) }
        let afterAuthority = target[separator.upperBound...]
        guard let slash = afterAuthority.firstIndex(where: { $0 == "/" || $0 == "?" }) else { return "/" }
        return afterAuthority[slash] == "/" ? afterAuthority[slash...] : Substring("/" + afterAuthority[slash...])
    }

    func match(method: HTTPRequest.Method, target: String) -> Match {
        if method == .connect { return .notImplemented }
        let path = Self.path(of: target)
        if let entry = self.exact[path] { return Self.pick(method, entry, parameter: nil) }
        // Canonical paths only (an empty or dot segment is a 404): a proxy rule guarding `/v1/admin/` sees every
        // way in.
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        guard path.hasPrefix("/"), !segments.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." }) else {
            return .notFound
        }
        for entry in self.parameterised where entry.segments.count == segments.count {
            var parameter: Substring?
            let matches = zip(entry.segments, segments).enumerated().allSatisfy { index, pair in
                if index == entry.parameterIndex {
                    parameter = pair.1
                    return true
                }
                return pair.0 == pair.1
            }
            if matches { return Self.pick(method, entry, parameter: parameter) }
        }
        return .notFound
    }

    private static func pick(_ method: HTTPRequest.Method, _ entry: Entry, parameter: Substring?) -> Match {
        let wanted = method == .head ? .get : method
        for endpoint in entry.endpoints where endpoint.method == wanted {
            return .found(endpoint, parameter: parameter)
        }
        var allowed = entry.endpoints.map(\.method.rawValue)
        if let get = allowed.firstIndex(of: "GET") { allowed.insert("HEAD", at: get + 1) }
        return .methodNotAllowed(allowed)
    }
}
