import Foundation
import HealthMetrics
import NIOCore
import Testing

@testable import MetricsdHTTP

/// The hand-written encoders and decoders on the request path, against Foundation's.
@Suite struct EncodingTests {
    /// base64url: every length 0…64 of random bytes decodes to the same bytes as Foundation's base64 decoder.
    @Test func base64URLAgreesWithFoundation() throws {
        var generator = SystemRandomNumberGenerator()
        for length in 0...64 {
            for _ in 0..<20 {
                let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let standard = Data(bytes).base64EncodedString()
                let url = standard.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                    .replacingOccurrences(of: "=", with: "")
                #expect(Base64URL.decode(Substring(url)) == bytes, "\(url)")
            }
        }
    }

    @Test(arguments: [
        "a",  // a length of 4n+1 is never valid
        "eyJ=",  // padding is not base64url
        "ab+c", "ab/c",  // the standard alphabet's characters
        "ab c", "abc\n", "abcé",  // anything else
        "QR",  // 'R' leaves non-zero bits after the last byte: not canonical
    ])
    func base64URLRefuses(_ text: String) {
        #expect(Base64URL.decode(Substring(text)) == nil)
    }

    /// The hand-written claims reader: where it answers, it answers as `JSONDecoder` does; outside its plain
    /// subset it gives up (nil) and the verifier asks `JSONDecoder`.
    @Test(arguments: [
        (#"{"sub":"42","exp":1700000000,"iat":1699996400}"#, true),
        (
            #" { "exp" : 1700000000 ,"sub":"42" , "nbf":1699990000, "iss":"https://id.example", "aud":"metricsd" } "#,
            true
        ),
        (#"{"sub":42,"exp":1700000000,"jti":"x-1","scope":"read write","n":0}"#, true),
        (#"{"sub":"0042","exp":1}"#, true), (#"{}"#, true), (#"{"exp":0}"#, true),
        (#"{"sub":"42","aud":["a","b"],"exp":1700000000}"#, false), (#"{"sub":"42","exp":1700000000.5}"#, false),
        (#"{"sub":"42","exp":1.7e9}"#, false), (#"{"sub":"42","exp":-5}"#, false),
        (#"{"sub":"4\u0032","exp":1}"#, false),
        (#"{"sub":"42","exp":1,"sub":"43"}"#, false), (#"{"sub":"42","exp":1,"ctx":{"a":1}}"#, false),
        (#"{"sub":"42","exp":1,"admin":true}"#, false), (#"{"sub":null,"exp":1}"#, false),
        (#"{"sub":"42","exp":1}x"#, false),
        (#"{"sub":"42","exp":1,}"#, false), (#"{"exp":0123}"#, false), (#"{"exp":1234567890123456}"#, false),
        (#"{"sub":"é","exp":1}"#, false), (#"[]"#, false), (#""#, false), (#"{"sub":"42""#, false),
        (#"{"sub"}"#, false),
    ])
    func compactClaimsAgreeWithJSONDecoder(_ payload: String, plain: Bool) {
        let fast = JWTClaims(compact: Array(payload.utf8))
        let decoded = try? JSONDecoder().decode(JWTClaims.self, from: Data(payload.utf8))
        #expect((fast != nil) == plain, "\(payload): \(String(describing: fast))")
        if let fast { #expect(fast == decoded, "\(payload)") }
    }

    /// Random flat claim sets as a token library writes them (any key order, string and integer values, extra
    /// claims): always read by hand, always as `JSONDecoder` reads them.
    @Test func compactClaimsAgreeOnRandomPayloads() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            var claims: [String: Any] = [:]
            if Bool.random(using: &generator) {
                claims["sub"] = String(Int64.random(in: 1...999_999_999_999, using: &generator))
            } else if Bool.random(using: &generator) {
                claims["sub"] = Int.random(in: 1...999_999_999, using: &generator)
            }
            for key in ["exp", "nbf", "iat"] where Bool.random(using: &generator) {
                claims[key] = Int.random(in: 0...4_000_000_000, using: &generator)
            }
            for key in ["iss", "aud", "jti", "scope"] where Bool.random(using: &generator) {
                claims[key] = String(
                    (0..<Int.random(in: 0...20, using: &generator)).map { _ in
                        "abcdefghijklmnopqrstuvwxyz0123456789-_.: ".randomElement(using: &generator)!
                    })
            }
            let data = try JSONSerialization.data(
                withJSONObject: claims, options: Bool.random() ? [.prettyPrinted] : [])
            let fast = JWTClaims(compact: Array(data))
            let decoded = try JSONDecoder().decode(JWTClaims.self, from: data)
            #expect(fast == decoded, "\(String(decoding: data, as: UTF8.self))")
        }
    }

    /// New request ids: 16 lowercase hex digits, never the same twice (100,000 in a row), a client's well-formed
    /// id kept and a malformed one replaced.
    @Test func requestIDs() {
        var seen = Set<String>()
        for _ in 0..<100_000 {
            let id = APIDispatcher.newRequestID()
            #expect(
                id.utf8.count == 16 && id.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }, "\(id)"
            )
            seen.insert(id)
        }
        #expect(seen.count == 100_000)
        #expect(APIDispatcher.requestID(from: "trace-1.A_b") == "trace-1.A_b")
        #expect(APIDispatcher.requestID(from: "bad id") != "bad id")
        #expect(APIDispatcher.requestID(from: String(repeating: "a", count: 65)).utf8.count == 16)
    }

    /// JSON strings: the fast path (copied whole) and the escaping path give what JSONSerialization reads back.
    @Test(arguments: [
        "plain ASCII", "Mifflin–St Jeor (en dash), kg/m², ünïcödé, 😀", "quote \" and backslash \\",
        "control \u{01}\t\n\r", "line separator \u{2028} and paragraph separator \u{2029}", "",
    ])
    func jsonStringsRoundTrip(_ text: String) throws {
        var writer = JSONWriter()
        writer.writeString(text)
        let json = writer.text
        let decoded = try JSONSerialization.jsonObject(with: Data("[\(json)]".utf8)) as? [String]
        #expect(decoded == [text], "\(json)")
        #expect(!json.contains("\u{2028}") && !json.contains("\u{2029}"))
        #expect(
            JSONWriter.needsEscaping(text)
                == text.unicodeScalars.contains {
                    $0.value < 0x20 || $0 == "\"" || $0 == "\\" || $0.value == 0x2028 || $0.value == 0x2029
                })
    }

}
