import Foundation
import HTTPTypes
import HealthMetrics
import MetricsdHTTP
import MetricsdTestSupport
import NIOCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Every reply states how it may be cached; the latest read carries a strong `ETag` and answers a matching
/// `If-None-Match` with `304`; `HEAD` gives GET's headers and no body. Real HTTP against a real database.
@Suite struct CachingTests {
    /// A response's head as sent: status and fields (lowercased names), and whatever followed the head before the
    /// next response began.
    struct RawResponse {
        let status: Int
        let fields: [String: String]
        let rest: String
    }

    /// Sends `requests` (ending with a `Connection: close` one) on one connection and splits what came back
    /// into responses by their status lines: a body where none belongs shows up as `rest`.
    static func exchange(port: Int, _ requests: String) throws -> [RawResponse] {
        let descriptor = try #require(RawHTTP.connect(port: port))
        defer { close(descriptor) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        #expect(RawHTTP.send(descriptor, requests))
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = recv(descriptor, &chunk, chunk.count, 0)
            if count <= 0 { break }
            bytes += chunk[..<count]
        }
        let text = String(decoding: bytes, as: UTF8.self)
        var responses: [RawResponse] = []
        for part in text.components(separatedBy: "HTTP/1.1 ").dropFirst() {
            let pieces = part.components(separatedBy: "\r\n\r\n")
            var lines = pieces[0].components(separatedBy: "\r\n")
            let status = Int(lines.removeFirst().prefix(3)) ?? 0
            var fields: [String: String] = [:]
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { continue }
                fields[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                    in: .whitespaces)
            }
            responses.append(
                RawResponse(status: status, fields: fields, rest: pieces.dropFirst().joined(separator: "\r\n\r\n")))
        }
        return responses
    }

    static func request(
        _ method: String, _ path: String, port: Int, user: Int64? = nil, _ extra: [String] = [], close: Bool = false
    )
        -> String
    {
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        if let user { text += "Authorization: Bearer \(TestTokens.user(user))\r\n" }
        for line in extra { text += line + "\r\n" }
        if close { text += "Connection: close\r\n" }
        return text + "\r\n"
    }

    @Test func theLatestReadIsPrivateRevalidatedAndConditional() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            try await APIServer.run(database: database) { port in
                let first = try await API.today(port: port, user: 1)
                #expect(first.status == 200, "\(first)")
                #expect(first.headers[.cacheControl] == "private, no-cache")
                #expect(first.headers[.vary] == "Authorization")
                let etag = try #require(first.headers[.eTag])
                #expect(etag.hasPrefix("\"") && etag.hasSuffix("\"") && !etag.hasPrefix("W/"), "a strong tag: \(etag)")
                // The same representation, the same tag; another user's, another.
                #expect(try await API.today(port: port, user: 1).headers[.eTag] == etag)
                #expect(try await API.today(port: port, user: 2).headers[.eTag] != etag)

                // A matching If-None-Match (also weak, in a list, or `*`) gets 304 with the caching headers and
                // tag and no content; the next reply on the connection follows the head directly.
                for condition in [etag, "W/\(etag)", "\"0000000000000000\", \(etag)", "*"] {
                    let replies = try Self.exchange(
                        port: port,
                        Self.request(
                            "GET", "/v1/profile/metrics/today", port: port, user: 1, ["If-None-Match: \(condition)"])
                            + Self.request("GET", "/healthz", port: port, close: true))
                    try #require(replies.count == 2, "If-None-Match: \(condition)")
                    #expect(replies[0].status == 304, "If-None-Match: \(condition)")
                    #expect(replies[0].fields["etag"] == etag)
                    #expect(replies[0].fields["cache-control"] == "private, no-cache")
                    #expect(replies[0].fields["vary"] == "Authorization")
                    #expect(replies[0].fields["content-length"] == nil && replies[0].fields["content-type"] == nil)
                    #expect(replies[0].rest.isEmpty, "a 304 has no content: \(replies[0].rest.prefix(80))")
                    #expect(replies[1].status == 200)
                }
                // A stale tag and a malformed field get the whole reply.
                for condition in ["\"0000000000000000\"", "not-a-tag", "W/", "\"a\" \"b\""] {
                    let reply = try await API.send(
                        port: port, "/v1/profile/metrics/today",
                        headers: TestTokens.bearer(TestTokens.user(1)).merging([.ifNoneMatch: condition]))
                    #expect(reply.status == 200, "If-None-Match: \(condition)")
                    #expect(reply.headers[.eTag] == etag)
                    #expect(reply.text == first.text)
                }
                // HEAD: GET's headers, tag included, and no body.
                let head = try Self.exchange(
                    port: port,
                    Self.request("HEAD", "/v1/profile/metrics/today", port: port, user: 1)
                        + Self.request("GET", "/healthz", port: port, close: true))
                try #require(head.count == 2)
                #expect(head[0].status == 200)
                #expect(head[0].fields["etag"] == etag)
                #expect(head[0].fields["content-length"] == String(first.text.utf8.count))
                #expect(head[0].rest.isEmpty)

                // The acknowledgement changes the representation, so the tag: the old one gets the new reply.
                let data = try #require(first.json?["data"]?["metrics"])
                let acknowledged = try await API.acknowledge(
                    port: port, user: 1, version: Int(try #require(data["version"]?.int)),
                    computedAt: try #require(data["computedAt"]?.string))
                #expect(acknowledged.status == 200)
                #expect(acknowledged.headers[.cacheControl] == "no-store", "a POST's reply is never stored")
                let after = try await API.send(
                    port: port, "/v1/profile/metrics/today",
                    headers: TestTokens.bearer(TestTokens.user(1)).merging([.ifNoneMatch: etag]))
                #expect(after.status == 200)
                let newTag = try #require(after.headers[.eTag])
                #expect(newTag != etag)
                #expect(after.json?["data"]?["acknowledged"] == .bool(true))
            }
        }
    }

    /// A recompute that writes a newer row changes the tag (the row's computed instant is in the body).
    @Test func aNewRowChangesTheTag() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let before = try #require(try await API.today(port: port, user: 1).headers[.eTag])
                try await database.execute(
                    "UPDATE profile_metrics SET computed_at = computed_at + interval '1 second' WHERE user_id = 1")
                let after = try await API.send(
                    port: port, "/v1/profile/metrics/today",
                    headers: TestTokens.bearer(TestTokens.user(1)).merging([.ifNoneMatch: before]))
                #expect(after.status == 200)
                #expect(after.headers[.eTag] != before)
            }
        }
    }

    /// Every other reply says its rule: state of the moment and errors are never stored; the API document may be
    /// kept and revalidated.
    @Test func everyReplyStatesItsCachingRule() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let admin = TestTokens.bearer(APIServer.adminToken)
                let cases: [(String, HTTPFields, Int, String)] = [
                    ("/healthz", [:], 200, "no-store"),
                    ("/readyz", [:], 200, "no-store"),
                    ("/v1/admin/recompute", admin, 200, "no-store"),
                    ("/v1/profile/metrics/today", [:], 401, "no-store"),
                    ("/no-such-route", [:], 404, "no-store"),
                    ("/openapi.yaml", [:], 200, "no-cache"),
                ]
                for (path, headers, status, rule) in cases {
                    let reply = try await API.send(port: port, path, headers: headers)
                    #expect(reply.status == status, "\(path): \(reply)")
                    #expect(reply.headers[.cacheControl] == rule, "\(path)")
                }
                let document = try await API.send(port: port, "/openapi.yaml")
                let tag = try #require(document.headers[.eTag])
                // Computed once for the shared buffer, it is still the digest of the bytes served.
                #expect(tag == EntityTag.strong(of: ByteBuffer(string: document.text)).description, "\(tag)")
                let again = try Self.exchange(
                    port: port, Self.request("GET", "/openapi.yaml", port: port, ["If-None-Match: \(tag)"], close: true)
                )
                #expect(again.first?.status == 304)
                #expect(again.first?.rest.isEmpty == true)
                #expect(
                    try await API.send(port: port, "/healthz").headers[.eTag] == nil,
                    "no validator on state of the moment")
            }
        }
    }
}
