/// A calendar date with no time zone: a user's local date (`profile_metrics.metrics_date`).
///
/// Proleptic Gregorian, years 1...9999. Parsing and printing use ISO 8601 `YYYY-MM-DD`, which is also how
/// PostgreSQL prints a `date` with the default `DateStyle`.
public struct LocalDate: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let year: Int
    public let month: Int
    public let day: Int

    /// A valid date, or nil (month 13, February 30, year 0 …).
    public init?(year: Int, month: Int, day: Int) {
        guard (1...9999).contains(year), (1...12).contains(month),
            (1...LocalDate.daysInMonth(year: year, month: month)).contains(day)
        else { return nil }
        self.year = year
        self.month = month
        self.day = day
    }

    /// Parses `YYYY-MM-DD` exactly (no time, no zone); nil for anything else.
    public init?(iso string: some StringProtocol) {
        let bytes = Array(string.utf8)
        guard bytes.count == 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
            let year = Digits.parse(bytes[0..<4]), let month = Digits.parse(bytes[5..<7]),
            let day = Digits.parse(bytes[8..<10])
        else { return nil }
        self.init(year: year, month: month, day: day)
    }

    public var description: String {
        Digits.pad(self.year, 4) + "-" + Digits.pad(self.month, 2) + "-" + Digits.pad(self.day, 2)
    }

    public static func < (lhs: LocalDate, rhs: LocalDate) -> Bool {
        (lhs.year, lhs.month, lhs.day) < (rhs.year, rhs.month, rhs.day)
    }

    public static func isLeapYear(_ year: Int) -> Bool {
        (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
    }

    public static func daysInMonth(year: Int, month: Int) -> Int {
        switch month {
        case 2: return isLeapYear(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Whole years from `birth` to this date.
    ///
    /// The birthday counts on its month and day; someone born on 29 February becomes a year older on 1 March in
    /// common years (their birthday has not happened on 28 February). Negative when `birth` is after this date.
    public func years(since birth: LocalDate) -> Int {
        var years = self.year - birth.year
        if (self.month, self.day) < (birth.month, birth.day) { years -= 1 }
        return years
    }

    /// Days since 1970-01-01 (negative before), for arithmetic on dates.
    public var daysSinceEpoch: Int {
        // Howard Hinnant's days_from_civil.
        let y = self.month <= 2 ? self.year - 1 : self.year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (self.month + 9) % 12
        let doy = (153 * mp + 2) / 5 + self.day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// The date `daysSinceEpoch` days after 1970-01-01; nil outside years 1...9999.
    public init?(daysSinceEpoch days: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        self.init(year: yoe + era * 400 + (month <= 2 ? 1 : 0), month: month, day: day)
    }

    /// The date `days` later (earlier when negative); nil outside years 1...9999.
    public func adding(days: Int) -> LocalDate? {
        LocalDate(daysSinceEpoch: self.daysSinceEpoch + days)
    }
}

/// Small ASCII digit helpers shared by the parsers of this module.
enum Digits {
    /// The value of a run of ASCII digits (1 to 18 of them), or nil if any byte is not a digit.
    static func parse(_ bytes: ArraySlice<UInt8>) -> Int? {
        guard !bytes.isEmpty, bytes.count <= 18 else { return nil }
        var value = 0
        for byte in bytes {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }

    /// `value` in decimal, left-padded with zeros to `width` digits.
    static func pad(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }
}
