#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The member names of a JSON object, read without decoding its values: for RFC 7515/7519's rule that a
/// JOSE header or a claims set must not name a member twice (`JSONDecoder` silently keeps one of them).
enum JSONObjectNames {
    /// Whether the top-level object of `bytes` repeats a member name (names compared after unescaping, as
    /// Swift strings, as the decoder would see them). Nil when `bytes` is not one JSON object.
    static func hasDuplicates(_ bytes: [UInt8]) -> Bool? {
        var reader = Reader(bytes: bytes)
        reader.skipSpace()
        guard reader.consume(0x7B) else { return nil }
        var names = Set<String>()
        var duplicate = false
        reader.skipSpace()
        if reader.consume(0x7D) {
            reader.skipSpace()
            return reader.atEnd ? false : nil
        }
        while true {
            reader.skipSpace()
            guard let name = reader.string() else { return nil }
            if !names.insert(name).inserted { duplicate = true }
            reader.skipSpace()
            guard reader.consume(0x3A), reader.skipValue() else { return nil }
            reader.skipSpace()
            if reader.consume(0x2C) { continue }
            guard reader.consume(0x7D) else { return nil }
            break
        }
        reader.skipSpace()
        return reader.atEnd ? duplicate : nil
    }

    /// The text of the top-level member `name`'s value when it is not a string (a number or a literal, as
    /// written: `1e3`, `1.0000000000000001`); nil when the member is absent or a string, or `bytes` is not one JSON
    /// object. Names compared after unescaping, as the decoder would see them.
    static func literal(of name: String, in bytes: [UInt8]) -> ArraySlice<UInt8>? {
        var reader = Reader(bytes: bytes)
        reader.skipSpace()
        guard reader.consume(0x7B) else { return nil }
        reader.skipSpace()
        if reader.consume(0x7D) { return nil }
        while true {
            reader.skipSpace()
            guard let member = reader.string() else { return nil }
            reader.skipSpace()
            guard reader.consume(0x3A) else { return nil }
            reader.skipSpace()
            let start = reader.index
            guard reader.skipValue() else { return nil }
            if member == name { return bytes[start] == 0x22 ? nil : bytes[start..<reader.index] }
            reader.skipSpace()
            guard reader.consume(0x2C) else { return nil }
        }
    }

    private struct Reader {
        let bytes: [UInt8]
        var index = 0
        /// Nesting allowed in values (deeper payloads are not tokens).
        static let maxDepth = 64

        var atEnd: Bool { self.index == self.bytes.count }

        mutating func skipSpace() {
            while self.index < self.bytes.count,
                self.bytes[self.index] == 0x20 || self.bytes[self.index] == 0x0A || self.bytes[self.index] == 0x0D
                    || self.bytes[self.index] == 0x09
            {
                self.index += 1
            }
        }

        mutating func consume(_ byte: UInt8) -> Bool {
            guard self.index < self.bytes.count, self.bytes[self.index] == byte else { return false }
            self.index += 1
            return true
        }

        /// A string at the current position, unescaped; nil when malformed.
        mutating func string() -> String? {
            guard self.consume(0x22) else { return nil }
            var scalars = String.UnicodeScalarView()
            var raw: [UInt8] = []
            func flush() -> Bool {
                guard !raw.isEmpty else { return true }
                guard let text = String(validating: raw, as: UTF8.self) else { return false }
                scalars.append(contentsOf: text.unicodeScalars)
                raw.removeAll(keepingCapacity: true)
                return true
            }
            while self.index < self.bytes.count {
                let byte = self.bytes[self.index]
                self.index += 1
                switch byte {
                case 0x22:
                    guard flush() else { return nil }
                    return String(scalars)
                case 0x5C:
                    guard flush(), self.index < self.bytes.count else { return nil }
                    let escape = self.bytes[self.index]
                    self.index += 1
                    switch escape {
                    case 0x22, 0x5C, 0x2F: scalars.append(Unicode.Scalar(escape))
                    case 0x62: scalars.append("\u{08}")
                    case 0x66: scalars.append("\u{0C}")
                    case 0x6E: scalars.append("\n")
                    case 0x72: scalars.append("\r")
                    case 0x74: scalars.append("\t")
                    case 0x75:
                        guard var unit = self.hex4() else { return nil }
                        if (0xD800..<0xDC00).contains(unit) {
                            // A high surrogate must be followed by an escaped low one.
                            guard self.consume(0x5C), self.consume(0x75), let low = self.hex4(),
                                (0xDC00..<0xE000).contains(low)
                            else { return nil }
                            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let scalar = Unicode.Scalar(unit) else { return nil }
                        scalars.append(scalar)
                    default: return nil
                    }
                default:
                    guard byte >= 0x20 else { return nil }
                    raw.append(byte)
                }
            }
            return nil
        }

        private mutating func hex4() -> UInt32? {
            guard self.index + 4 <= self.bytes.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = self.bytes[self.index]
                self.index += 1
                let digit: UInt32
                switch byte {
                case 0x30...0x39: digit = UInt32(byte - 0x30)
                case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
                case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
                default: return nil
                }
                value = value << 4 | digit
            }
            return value
        }

        /// Skips one value (nested objects and arrays included); false when malformed.
        mutating func skipValue(depth: Int = 0) -> Bool {
            guard depth < Self.maxDepth, self.index < self.bytes.count else { return false }
            switch self.bytes[self.index] {
            case 0x22:
                return self.string() != nil
            case 0x7B, 0x5B:
                let close: UInt8 = self.bytes[self.index] == 0x7B ? 0x7D : 0x5D
                let isObject = close == 0x7D
                self.index += 1
                self.skipSpace()
                if self.consume(close) { return true }
                while true {
                    self.skipSpace()
                    if isObject {
                        guard self.string() != nil else { return false }
                        self.skipSpace()
                        guard self.consume(0x3A) else { return false }
                        self.skipSpace()
                    }
                    guard self.skipValue(depth: depth + 1) else { return false }
                    self.skipSpace()
                    if self.consume(0x2C) { continue }
                    return self.consume(close)
                }
            default:
                // A number or a literal: the decoder judges its form; here it only has to end.
                let start = self.index
                while self.index < self.bytes.count {
                    let byte = self.bytes[self.index]
                    if byte == 0x2C || byte == 0x7D || byte == 0x5D || byte == 0x20 || byte == 0x0A || byte == 0x0D
                        || byte == 0x09
                    {
                        break
                    }
                    self.index += 1
                }
                return self.index > start
            }
        }
    }
}

/// Any JSON value, not looked at (only its presence matters).
package struct AnyJSON: Decodable {
    package init(from decoder: any Decoder) throws {}
}
