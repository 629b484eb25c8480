import HTTPTypes
import MetricsdTestSupport
import Testing

/// Only a path's canonical form is routed. A target with an empty segment (`//v1//admin//recompute`, a trailing
/// `/`) or a dot segment is a 404, with the right token too and before any work is done, so that a proxy rule
/// guarding a prefix (`/v1/admin/`) covers every way to reach what is under it.
@Suite struct CanonicalPathTests {
    static let admin = TestTokens.bearer(APIServer.adminToken)

    @Test func emptyAndDotSegmentsAreNotRouted() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(42)])
            try await database.insertMetrics(user: 42, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let user = TestTokens.bearer(TestTokens.user(42))
                let refused: [(String, HTTPRequest.Method, HTTPFields)] = [
                    ("//v1//admin//recompute", .post, Self.admin),
                    ("//v1/admin/recompute", .post, Self.admin),
                    ("/v1//admin/recompute", .post, Self.admin),
                    ("/v1/admin/recompute/", .post, Self.admin),
                    ("/v1/admin//recompute?x=1", .post, Self.admin),
                    ("/v1/./admin/recompute", .post, Self.admin),
                    ("/v1/admin/../admin/recompute", .post, Self.admin),
                    ("/v1/admin/recompute/.", .get, Self.admin),
                    ("/v1//admin/recompute", .get, Self.admin),
                    ("/v1/admin/recompute//1", .get, Self.admin),
                    ("/v1/admin/recompute/1/", .get, Self.admin),
                    ("//v1/profile/metrics/today", .get, user),
                    ("/v1/profile/metrics//today", .get, user),
                    ("/v1/profile/metrics/today/", .get, user),
                    ("//healthz", .get, [:]),
                    ("/healthz/", .get, [:]),
                    ("/./healthz", .get, [:]),
                ]
                for (path, method, headers) in refused {
                    let reply = try await API.send(port: port, path, method: method, headers: headers)
                    #expect(reply.status == 404, "\(method) \(path): \(reply)")
                }
                // None of them reached the admin API: no job exists until the canonical trigger creates one.
                let listed = try await API.send(port: port, "/v1/admin/recompute", headers: Self.admin)
                #expect(listed.status == 200 && listed.text.contains(#""jobs":[]"#), "\(listed)")
                let created = try await API.send(port: port, "/v1/admin/recompute", method: .post, headers: Self.admin)
                #expect(created.status == 202, "\(created)")

                // The canonical forms answer.
                for (path, headers) in [
                    ("/healthz", HTTPFields()), ("/v1/profile/metrics/today", user), ("/healthz?x=1", [:]),
                ] {
                    let reply = try await API.send(port: port, path, headers: headers)
                    #expect(reply.status == 200, "\(path): \(reply)")
                }
            }
        }
    }
}
