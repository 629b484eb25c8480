#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The JOSE header fields metricsd looks at.
struct JWTHeaderFields: Decodable {
    let alg: String
    let crit: AnyJSON?
}

/// The registered claims metricsd checks; anything else in the payload is ignored.
struct JWTClaims: Decodable, Equatable {
    var sub: JSONScalar?
    var exp: JSONScalar?
    var nbf: JSONScalar?
    var iss: JSONScalar?
    var aud: Audience?

    /// What ``read(_:)`` found.
    enum Reading {
        case claims(JWTClaims)
        /// A member name appears twice: the token is refused.
        case duplicateName
        /// Not a plain claims set: `JSONDecoder` decides (after the duplicate check).
        case notPlain
    }

    /// The claims of the payloads token libraries write, read without `JSONDecoder` (the busiest request): one
    /// flat object whose values are plain strings (no escapes, ASCII) or integers.
    static func read(_ bytes: [UInt8]) -> Reading {
        var duplicate = false
        guard let claims = JWTClaims(compact: bytes, duplicate: &duplicate) else {
            return duplicate ? .duplicateName : .notPlain
        }
        return .claims(claims)
    }

    /// The plain claims set, or nil for anything else (arrays, nested objects, escapes, fractions, exponents,
    /// negative numbers, malformed JSON) and for a repeated name (`duplicate` is then set).
    init?(compact bytes: [UInt8]) {
        var duplicate = false
        self.init(compact: bytes, duplicate: &duplicate)
    }

    private init?(compact bytes: [UInt8], duplicate: inout Bool) {
        var index = 0
        let count = bytes.count
        Self.skipSpace(bytes, &index)
        guard index < count, bytes[index] == 0x7B else { return nil }
        index += 1
        Self.skipSpace(bytes, &index)
        // Names seen so far, as byte ranges (a claims set has a handful: compared byte by byte, no strings).
        var seen: [Range<Int>] = []
        if index < count, bytes[index] == 0x7D {
            index += 1
        } else {
            while true {
                guard index < count, bytes[index] == 0x22, let keyRange = Self.plainString(bytes, &index) else {
                    return nil
                }
                let key = bytes[keyRange]
                guard !seen.contains(where: { bytes[$0].elementsEqual(key) }) else {
                    duplicate = true
                    return nil
                }
                seen.append(keyRange)
                Self.skipSpace(bytes, &index)
                guard index < count, bytes[index] == 0x3A else { return nil }
                index += 1
                Self.skipSpace(bytes, &index)
                guard let value = Self.plainValue(bytes, &index, keepString: key.count == 3),
                    self.assign(value, to: key)
                else { return nil }
                Self.skipSpace(bytes, &index)
                guard index < count else { return nil }
                if bytes[index] == 0x2C {
                    index += 1
                    Self.skipSpace(bytes, &index)
                    continue
                }
                guard bytes[index] == 0x7D else { return nil }
                index += 1
                break
            }
        }
        Self.skipSpace(bytes, &index)
        guard index == count else { return nil }
    }

    /// Moves `index` past JSON whitespace.
    private static func skipSpace(_ bytes: [UInt8], _ index: inout Int) {
        while index < bytes.count,
            bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09
        {
            index += 1
        }
    }

    /// A plain string at `index` (which is at its opening quote), as its byte range; `index` moves past it.
    private static func plainString(_ bytes: [UInt8], _ index: inout Int) -> Range<Int>? {
        index += 1
        let start = index
        while index < bytes.count {
            let byte = bytes[index]
            if byte == 0x22 {
                index += 1
                return start..<(index - 1)
            }
            guard byte >= 0x20, byte < 0x80, byte != 0x5C else { return nil }
            index += 1
        }
        return nil
    }

    /// A plain value at `index`: a plain string (as a string only with `keepString`) or an integer; nil for
    /// anything else. `index` moves past it.
    private static func plainValue(_ bytes: [UInt8], _ index: inout Int, keepString: Bool) -> JSONScalar? {
        let count = bytes.count
        guard index < count else { return nil }
        if bytes[index] == 0x22 {
            guard let range = Self.plainString(bytes, &index) else { return nil }
            // Only the registered claims (three-letter names) are kept: no string for the others.
            return keepString ? .string(String(decoding: bytes[range], as: UTF8.self)) : .other
        }
        guard bytes[index] >= 0x30, bytes[index] <= 0x39 else { return nil }
        let start = index
        var number: Int64 = 0
        while index < count, bytes[index] >= 0x30, bytes[index] <= 0x39 {
            number = number &* 10 &+ Int64(bytes[index] - 0x30)
            index += 1
        }
        let digits = index - start
        // No leading zeros (invalid JSON), at most 15 digits (exact as a Double), an integer.
        guard digits <= 15, digits == 1 || bytes[start] != 0x30 else { return nil }
        if index < count, bytes[index] == 0x2E || bytes[index] == 0x65 || bytes[index] == 0x45 {
            return nil
        }
        return .number(Double(number))
    }

    /// Keeps `value` when `key` names a registered claim; false for an `aud` that is not a string.
    private mutating func assign(_ value: JSONScalar, to key: ArraySlice<UInt8>) -> Bool {
        guard key.count == 3 else { return true }
        switch (key[key.startIndex], key[key.startIndex + 1], key[key.startIndex + 2]) {
        case (0x73, 0x75, 0x62): self.sub = value  // sub
        case (0x65, 0x78, 0x70): self.exp = value  // exp
        case (0x6E, 0x62, 0x66): self.nbf = value  // nbf
        case (0x69, 0x73, 0x73): self.iss = value  // iss
        case (0x61, 0x75, 0x64):  // aud
            guard case .string(let audience) = value else { return false }
            self.aud = .values([audience])
        default: break
        }
        return true
    }

    /// `aud`: one string or an array of strings.
    enum Audience: Decodable, Equatable {
        case values([String])
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let one = try? container.decode(String.self) {
                self = .values([one])
            } else {
                self = .values((try? container.decode([JSONScalar].self))?.compactMap(\.string) ?? [])
            }
        }
        var values: [String] {
            switch self {
            case .values(let values): values
            }
        }
    }
}
