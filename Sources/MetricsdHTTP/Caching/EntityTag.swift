import NIOCore

/// An entity tag (`ETag`): the opaque validator of one representation.
///
/// The daemon's tags are strong and derived from the representation's bytes (a 64-bit digest of the body, in
/// hex; ``strong(of:)``): any byte that changes — the metrics row's version or `computed_at`, the acknowledgement
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

    /// The strong tag of a body: a 64-bit digest of its bytes as 16 hex digits.
    ///
    /// The digest takes the body eight bytes at a time (little-endian; the last word padded with zeros, and the
    /// length mixed into the start): each word goes through xxHash64's round (`acc = rotl(acc + word × P2, 31) × P1`),
    /// then MurmurHash3's `fmix64` spreads every bit over the whole digest. Each round is a bijection of `acc` and
    /// of the word, so two bodies of one length that differ in a single word always get different tags. (A plain
    /// `(acc ^ word) × prime` does not do for a word at a time: a change in a word's top bit passes through the
    /// multiplication as the same one-bit change as in the next word's, and such bodies collide.) Byte by byte
    /// (FNV-1a), the digest cost the latest read about 0.7 µs of its ~600 bytes; a word at a time, about 0.2.
    package static func strong(of body: ByteBuffer) -> EntityTag {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325 ^ UInt64(body.readableBytes)
        func round(_ word: UInt64) {
            let mixed = hash &+ word &* 0xC2B2_AE3D_27D4_EB4F
            hash = ((mixed << 31) | (mixed >> 33)) &* 0x9E37_79B1_85EB_CA87
        }
        body.withUnsafeReadableBytes { bytes in
            var offset = 0
            while offset + 8 <= bytes.count {
                round(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
                offset += 8
            }
            if offset < bytes.count {
                var word: UInt64 = 0
                for (shift, byte) in bytes[offset...].enumerated() { word |= UInt64(byte) << UInt64(8 * shift) }
                round(word)
            }
        }
        hash ^= hash >> 33
        hash &*= 0xff51_afd7_ed55_8ccd
        hash ^= hash >> 33
        hash &*= 0xc4ce_b9fe_1a85_ec53
        hash ^= hash >> 33
        return EntityTag(opaque: Substring(hash.hexDigits))
    }

    /// The field value: `"…"` or `W/"…"`.
    package var description: String { (self.isWeak ? "W/\"" : "\"") + self.opaque + "\"" }

    /// RFC 9110 §8.8.3.2 weak comparison: the opaque strings are equal, whether either tag is weak or not
    /// (the comparison `If-None-Match` uses).
    /// Compared octet by octet, as the RFC says (not as Unicode text).
    package func weaklyMatches(_ other: EntityTag) -> Bool { self.opaque.utf8.elementsEqual(other.opaque.utf8) }
}
