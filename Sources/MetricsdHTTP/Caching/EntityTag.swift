import NIOCore

/// An entity tag (`ETag`): the opaque validator of one representation.
///
/// The daemon's tags are strong and derived from the representation's bytes (a 64-bit FNV-1a digest of the
/// body, in hex): any byte that changes — the metrics row's version or `computed_at`, the acknowledgement
/// state, an explanation's wording — changes the tag, and two instances serving the same row give the same tag.
package struct EntityTag: Hashable, Sendable, CustomStringConvertible {
    /// The quoted string's content, without the quotes.
    package let opaque: Substring
    /// `W/"…"`: a weak tag (only ever received from a client; the daemon sends strong tags).
    package let isWeak: Bool

    package init(opaque: Substring, isWeak: Bool = false) {
        self.opaque = opaque
        self.isWeak = isWeak
    }

    /// The strong tag of a body: its FNV-1a 64-bit digest as 16 hex digits.
    package static func strong(of body: ByteBuffer) -> EntityTag {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        body.withUnsafeReadableBytes { bytes in
            for byte in bytes {
                hash ^= UInt64(byte)
                hash &*= 0x0000_0100_0000_01b3
            }
        }
        let hex = String(hash, radix: 16)
        return EntityTag(opaque: Substring(String(repeating: "0", count: 16 - hex.utf8.count) + hex))
    }

    /// The field value: `"…"` or `W/"…"`.
    package var description: String { (self.isWeak ? "W/\"" : "\"") + self.opaque + "\"" }

    /// RFC 9110 §8.8.3.2 weak comparison: the opaque strings are equal, whether either tag is weak or not
    /// (the comparison `If-None-Match` uses).
    package func weaklyMatches(_ other: EntityTag) -> Bool { self.opaque == other.opaque }
}
