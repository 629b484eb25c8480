import HTTPTypes
import NIOCore
import Testing

@testable import MetricsdHTTP

/// Entity tags and `If-None-Match` as RFC 9110 §8.8.3 and §13.1.2 define them.
@Suite struct EntityTagTests {
    private func tag(_ text: String) -> EntityTag { EntityTag.strong(of: ByteBuffer(string: text)) }

    @Test func aTagIsStrongQuotedAndSixteenHexDigits() {
        let etag = self.tag("{\"bmi\":22.5}\n")
        #expect(!etag.isWeak)
        #expect(etag.description.utf8.count == 18)
        #expect(etag.description.hasPrefix("\"") && etag.description.hasSuffix("\""))
        #expect(etag.opaque.allSatisfy { $0.isHexDigit })
        #expect(self.tag("") == self.tag(""))
    }

    /// Any single byte that changes changes the tag (every position of a realistic body, every bit).
    @Test func everyChangedByteChangesTheTag() {
        let body = Array(
            "{\"user_id\":42,\"version\":3,\"computed_at\":\"2026-11-25T00:05:00Z\",\"acknowledged\":false}\n".utf8)
        let original = EntityTag.strong(of: ByteBuffer(bytes: body))
        var seen: Set<EntityTag> = [original]
        for position in body.indices {
            for bit in 0..<8 {
                var changed = body
                changed[position] ^= UInt8(1 << bit)
                let etag = EntityTag.strong(of: ByteBuffer(bytes: changed))
                #expect(etag != original, "byte \(position) bit \(bit)")
                seen.insert(etag)
            }
        }
        #expect(seen.count == body.count * 8 + 1)
    }

    /// The digest reads eight bytes at a time and pads the last word with zeros: bodies that differ only in how
    /// many zero bytes they end with, and bodies around every word boundary, still get tags of their own.
    @Test func lengthsAndWordBoundariesGetTheirOwnTags() {
        let zeros = (0...24).map { EntityTag.strong(of: ByteBuffer(bytes: [UInt8](repeating: 0, count: $0))) }
        #expect(Set(zeros).count == zeros.count)
        let prefixes = (0...24).map {
            EntityTag.strong(of: ByteBuffer(bytes: Array("abcdefghijklmnopqrstuvwx".utf8.prefix($0))))
        }
        #expect(Set(prefixes).count == prefixes.count)
        #expect(self.tag("metrics") == self.tag("metrics"), "the same bytes, the same tag")
    }

    @Test func starMatchesAnyRepresentation() {
        let condition = IfNoneMatch(fieldLines: ["*"])
        #expect(condition == .any)
        #expect(condition?.matches(self.tag("a")) == true)
    }

    @Test func aListMatchesByWeakComparison() throws {
        let current = self.tag("body")
        let strong = try #require(IfNoneMatch(fieldLines: ["\"other\", \(current)"]))
        #expect(strong.matches(current))
        let weak = try #require(IfNoneMatch(fieldLines: ["W/\(current)"]))
        #expect(weak.matches(current), "If-None-Match compares weakly: W/\"x\" matches \"x\"")
        let stale = try #require(IfNoneMatch(fieldLines: ["\"0000000000000000\""]))
        #expect(!stale.matches(current))
        // Several field lines are one list; empty list elements are allowed.
        let split = try #require(IfNoneMatch(fieldLines: ["\"a\" ,, ", "\t\(current)"]))
        #expect(split.matches(current))
    }

    /// A malformed field is ignored (nil): the client gets the full reply, never a 304 it did not ask for.
    @Test(arguments: [
        "", "   ", "abc", "\"unterminated", "\"a\" \"b\"", "W/abc", "w/\"a\"", "\"a\";", "*, \"a\"", "\"in side\"",
        "\"a\"x", "**", "W", "W/", "\"", "* x", "\"a\" W", "\"a\\\"b\"", "\"a\u{7F}\"",
    ])
    func malformedFieldsAreIgnored(_ value: String) {
        #expect(IfNoneMatch(fieldLines: [value]) == nil, "\(value)")
    }

    /// What a valid field line holds, read byte by byte: the tags in order, weak ones marked, OWS and empty list
    /// elements around them.
    @Test func validFieldLinesGiveTheirTags() throws {
        let cases: [(String, [(String, Bool)])] = [
            ("\"a\"", [("a", false)]),
            ("  \"abc\"\t", [("abc", false)]),
            ("W/\"a\", \"b\"", [("a", true), ("b", false)]),
            (", ,\"a\" ,\t,\"b\",", [("a", false), ("b", false)]),
            ("\"\"", [("", false)]),
            ("\"caf\u{E9}\"", [("caf\u{E9}", false)]),
        ]
        for (line, expected) in cases {
            let parsed = try #require(IfNoneMatch(fieldLines: [line]), "\(line)")
            guard case .tags(let tags) = parsed else {
                Issue.record("\(line): not a list of tags")
                continue
            }
            #expect(tags.map { (String($0.opaque), $0.isWeak) }.elementsEqual(expected, by: ==), "\(line)")
        }
        #expect(IfNoneMatch(fieldLines: [" * "]) == .any)
    }

    @Test func noFieldLineIsNoCondition() {
        #expect(IfNoneMatch(fieldLines: [String]()) == nil)
        #expect(IfNoneMatch(fieldLines: ["*", "\"a\""]) == nil, "* is only valid alone")
    }

    @Test func policiesSayTheirRule() {
        var fields = HTTPFields()
        CachePolicy.personal.apply(to: &fields)
        #expect(fields[.cacheControl] == "private, no-cache")
        #expect(fields[.vary] == "Authorization")
        #expect(CachePolicy.noStore.cacheControl == "no-store")
        #expect(CachePolicy.revalidate.cacheControl == "no-cache")
        #expect(!CachePolicy.noStore.hasValidator && CachePolicy.personal.hasValidator)
    }
}
