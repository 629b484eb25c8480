import Testing

@testable import MetricsdHTTP

/// `Authorization: Bearer <token>`: the scheme in any case, the token everything after the space that ends it.
@Suite struct BearerTokenTests {
    @Test(arguments: [
        ("Bearer abc.def.ghi", "abc.def.ghi"), ("bearer abc", "abc"), ("BEARER abc", "abc"), ("bEaReR abc", "abc"),
        ("  Bearer abc", "abc"), ("Bearer  abc", " abc"), ("Bearer a b", "a b"),
    ])
    func theTokenAfterTheScheme(_ header: String, _ token: String) throws {
        #expect(try bearerToken(header) == Substring(token), "\(header)")
    }

    @Test(arguments: [
        "", " ", "Bearer", "Bearer ", "  Bearer ", "Basic abc", "Bearerx abc", "Bear abc", "Bearer\tabc",
        "B\u{E9}arer abc",
    ])
    func anythingElseIsMalformed(_ header: String) {
        #expect(throws: AppError.self, "\(header)") { try bearerToken(header) }
        do {
            _ = try bearerToken(header)
        } catch {
            #expect(error.code == .authorizationMalformed, "\(header)")
        }
    }

    @Test func noHeaderIsAMissingToken() {
        do {
            _ = try bearerToken(nil)
            Issue.record("no header gave a token")
        } catch {
            #expect(error.code == .tokenMissing)
        }
    }
}
