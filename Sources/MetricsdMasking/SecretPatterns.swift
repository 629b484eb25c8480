/// The pattern half of ``SecretMask``: secrets recognised by their shape, in text that may hold a secret nobody
/// told the mask about (a connection string quoted in a message, a settings line, a log record).
///
/// - `scheme://user:password@host…`: the password becomes `***` (up to the *last* `@` before the query, so a
///   password with an unescaped `@` is masked whole).
/// - `NAME=value` where `NAME` contains `password`, `passwd`, `secret` or `token` (any case: `password=` of a
///   libpq keyword string or URI query, `PGPASSWORD=`, `METRICSD_JWT_SECRET=`, `access_token=`), except names
///   ending in `file` (a path, not a secret): the value becomes `***` — quoted (`'…'`, `"…"`) or up to the next
///   blank, `&` or quote.
public enum SecretPatterns {
    /// `text` with every pattern's secret replaced by ``SecretMask/placeholder``.
    public static func apply(_ text: String) -> String {
        var text = text
        guard text.withUTF8({ Self.mayContainSecret($0) }) else { return text }
        var bytes = Array(text.utf8)
        let urlMasked = Self.maskURLPasswords(&bytes)
        let assignmentMasked = Self.maskAssignments(&bytes)
        return urlMasked || assignmentMasked ? String(decoding: bytes, as: UTF8.self) : text
    }

    /// A cheap pre-check: both patterns need an `@` or an `=`.
    public static func mayContainSecret(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        bytes.contains { $0 == UInt8(ascii: "@") || $0 == UInt8(ascii: "=") }
    }

    // MARK: - scheme://user:password@host

    private static func maskURLPasswords(_ bytes: inout [UInt8]) -> Bool {
        var changed = false
        var index = 0
        while index + 3 <= bytes.count {
            guard bytes[index] == UInt8(ascii: ":"), bytes[index + 1] == UInt8(ascii: "/"),
                bytes[index + 2] == UInt8(ascii: "/")
            else {
                index += 1
                continue
            }
            let start = index + 3
            // The authority and path: to the end of the token, the query or the fragment.
            var end = start
            while end < bytes.count, !Self.endsURLToken(bytes[end]), bytes[end] != UInt8(ascii: "?"),
                bytes[end] != UInt8(ascii: "#")
            {
                end += 1
            }
            guard let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")),
                let colon = bytes[start..<at].firstIndex(of: UInt8(ascii: ":")),
                !Self.isPlaceholder(bytes, colon + 1, at)
            else {
                index = start
                continue
            }
            bytes.replaceSubrange((colon + 1)..<at, with: SecretMask.placeholder.utf8)
            changed = true
            index = colon + 1 + SecretMask.placeholder.utf8.count + 1
        }
        return changed
    }

    private static func endsURLToken(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\""),
            UInt8(ascii: "'"), UInt8(ascii: "<"), UInt8(ascii: ">"):
            return true
        default:
            return false
        }
    }

    // MARK: - NAME=value

    private static func maskAssignments(_ bytes: inout [UInt8]) -> Bool {
        var changed = false
        var index = 0
        while index < bytes.count {
            guard bytes[index] == UInt8(ascii: "=") else {
                index += 1
                continue
            }
            // The name before "=" (blanks between allowed, as in libpq's keyword strings).
            var nameEnd = index
            while nameEnd > 0, Self.isBlank(bytes[nameEnd - 1]) { nameEnd -= 1 }
            var nameStart = nameEnd
            while nameStart > 0, Self.isNameCharacter(bytes[nameStart - 1]) { nameStart -= 1 }
            guard nameStart < nameEnd, Self.namesSecret(bytes[nameStart..<nameEnd]) else {
                index += 1
                continue
            }
            // The value after "=".
            var valueStart = index + 1
            while valueStart < bytes.count, Self.isBlank(bytes[valueStart]) { valueStart += 1 }
            guard valueStart < bytes.count else { break }
            var valueEnd: Int
            let first = bytes[valueStart]
            if first == UInt8(ascii: "'") || first == UInt8(ascii: "\"") {
                valueEnd = valueStart + 1
                while valueEnd < bytes.count, bytes[valueEnd] != first {
                    valueEnd += bytes[valueEnd] == UInt8(ascii: "\\") ? 2 : 1
                }
                valueStart += 1
                valueEnd = min(valueEnd, bytes.count)
            } else {
                valueEnd = valueStart
                while valueEnd < bytes.count, !Self.endsValue(bytes[valueEnd]) { valueEnd += 1 }
            }
            guard valueEnd > valueStart, !Self.isPlaceholder(bytes, valueStart, valueEnd) else {
                index = max(valueEnd, index + 1)
                continue
            }
            bytes.replaceSubrange(valueStart..<valueEnd, with: SecretMask.placeholder.utf8)
            changed = true
            index = valueStart + SecretMask.placeholder.utf8.count
        }
        return changed
    }

    /// Whether a setting or keyword named `name` holds a secret: its name contains password, passwd, secret or
    /// token (any case), and does not end in "file" (`METRICSD_JWT_SECRET_FILE` holds a path).
    public static func namesSecret(_ name: String) -> Bool { Self.namesSecret(Array(name.utf8)[...]) }

    static func namesSecret(_ name: ArraySlice<UInt8>) -> Bool {
        let lower = name.map { $0 | 0x20 }
        if lower.count >= 4, lower.suffix(4).elementsEqual("file".utf8) { return false }
        return ["password", "passwd", "secret", "token"].contains { word in
            lower.count >= word.utf8.count
                && (0...(lower.count - word.utf8.count)).contains {
                    lower[$0..<($0 + word.utf8.count)].elementsEqual(word.utf8)
                }
        }
    }

    private static func isNameCharacter(_ byte: UInt8) -> Bool {
        Self.isAlphanumeric(byte) || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
    }

    private static func endsValue(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "&"),
            UInt8(ascii: "\""), UInt8(ascii: "'"):
            return true
        default:
            return false
        }
    }

    private static func isBlank(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }

    /// Letters and digits (ASCII).
    public static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
    }

    /// Whether `bytes[start..<end]` is already the placeholder (masking twice changes nothing).
    private static func isPlaceholder(_ bytes: [UInt8], _ start: Int, _ end: Int) -> Bool {
        bytes[start..<end].elementsEqual(SecretMask.placeholder.utf8)
    }
}
