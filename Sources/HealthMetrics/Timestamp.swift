/// An instant at millisecond precision: milliseconds since 1970-01-01T00:00:00Z.
///
/// `computed_at` is stored at millisecond precision, carried as this integer and printed from it, so the value a
/// client reads (`"2025-10-29T14:30:45.123Z"`) and sends back in an acknowledgement compares exactly.
public struct Timestamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let millisecondsSinceEpoch: Int64

    public init(millisecondsSinceEpoch: Int64) {
        self.millisecondsSinceEpoch = millisecondsSinceEpoch
    }

    public static func < (lhs: Timestamp, rhs: Timestamp) -> Bool {
        lhs.millisecondsSinceEpoch < rhs.millisecondsSinceEpoch
    }

    /// ISO 8601 in UTC with exactly three fractional digits: `2025-10-29T14:30:45.123Z`.
    public var iso8601: String {
        let millis = self.millisecondsSinceEpoch
        let (days, dayMillis) = Self.floorDivide(millis, 86_400_000)
        let date = LocalDate(daysSinceEpoch: Int(days)) ?? LocalDate(year: 1970, month: 1, day: 1)!
        let hours = dayMillis / 3_600_000
        let minutes = dayMillis / 60_000 % 60
        let seconds = dayMillis / 1000 % 60
        let fraction = dayMillis % 1000
        guard (0...9999).contains(date.year) else {
            return "\(date)T" + Digits.pad(Int(hours), 2) + ":" + Digits.pad(Int(minutes), 2) + ":"
                + Digits.pad(Int(seconds), 2) + "." + Digits.pad(Int(fraction), 3) + "Z"
        }
        // The common case written straight into one string (it is in every response body).
        return String(unsafeUninitializedCapacity: 24) { buffer in
            func put(_ value: Int, width: Int, at offset: Int) {
                var rest = value
                for position in stride(from: offset + width - 1, through: offset, by: -1) {
                    buffer[position] = UInt8(ascii: "0") + UInt8(rest % 10)
                    rest /= 10
                }
            }
            put(date.year, width: 4, at: 0)
            buffer[4] = UInt8(ascii: "-")
            put(date.month, width: 2, at: 5)
            buffer[7] = UInt8(ascii: "-")
            put(date.day, width: 2, at: 8)
            buffer[10] = UInt8(ascii: "T")
            put(Int(hours), width: 2, at: 11)
            buffer[13] = UInt8(ascii: ":")
            put(Int(minutes), width: 2, at: 14)
            buffer[16] = UInt8(ascii: ":")
            put(Int(seconds), width: 2, at: 17)
            buffer[19] = UInt8(ascii: ".")
            put(Int(fraction), width: 3, at: 20)
            buffer[23] = UInt8(ascii: "Z")
            return 24
        }
    }

    public var description: String { self.iso8601 }

    /// Parses an ISO 8601 / RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`.
    ///
    /// The fraction may have 1 to 9 digits; digits beyond milliseconds must be zeros, so that a value the
    /// server never printed cannot silently round onto one it did. `t`/`z` and a space for `T` are accepted as
    /// RFC 3339 allows. Returns nil for anything else (no date-only forms, no week dates, no leap seconds).
    public init?(iso8601 text: some StringProtocol) {
        let bytes = Array(text.utf8)
        guard bytes.count >= 20, bytes.count <= 35 else { return nil }
        guard let date = LocalDate(iso: String(decoding: bytes[0..<10], as: UTF8.self)) else { return nil }
        let separator = bytes[10]
        guard separator == UInt8(ascii: "T") || separator == UInt8(ascii: "t") || separator == UInt8(ascii: " ")
        else { return nil }
        guard bytes[13] == UInt8(ascii: ":"), bytes[16] == UInt8(ascii: ":"),
            let hour = Digits.parse(bytes[11..<13]), let minute = Digits.parse(bytes[14..<16]),
            let second = Digits.parse(bytes[17..<19]), hour < 24, minute < 60, second < 60
        else { return nil }
        var index = 19
        var millis = 0
        if bytes[index] == UInt8(ascii: ".") {
            index += 1
            let start = index
            while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
                let digit = Int(bytes[index] - UInt8(ascii: "0"))
                let position = index - start
                if position < 3 {
                    millis = millis * 10 + digit
                } else if digit != 0 {
                    return nil
                }
                index += 1
            }
            let count = index - start
            guard (1...9).contains(count) else { return nil }
            for _ in min(count, 3)..<3 { millis *= 10 }
        }
        guard index < bytes.count else { return nil }
        var offsetMinutes = 0
        switch bytes[index] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            guard index + 1 == bytes.count else { return nil }
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            guard index + 6 == bytes.count, bytes[index + 3] == UInt8(ascii: ":"),
                let offsetHours = Digits.parse(bytes[(index + 1)..<(index + 3)]),
                let offsetMins = Digits.parse(bytes[(index + 4)..<(index + 6)]), offsetHours < 24, offsetMins < 60
            else { return nil }
            offsetMinutes = (offsetHours * 60 + offsetMins) * (bytes[index] == UInt8(ascii: "-") ? -1 : 1)
        default:
            return nil
        }
        let secondsOfDay = hour * 3600 + minute * 60 + second - offsetMinutes * 60
        let total = Int64(date.daysSinceEpoch) * 86_400_000 + Int64(secondsOfDay) * 1000 + Int64(millis)
        self.init(millisecondsSinceEpoch: total)
    }

    private static func floorDivide(_ value: Int64, _ divisor: Int64) -> (Int64, Int64) {
        let quotient = value >= 0 ? value / divisor : (value - divisor + 1) / divisor
        return (quotient, value - quotient * divisor)
    }
}
