/// The local wall-clock time at which each user's daily metrics are due (`METRICSD_DAILY_AT`, default 00:05).
///
/// Only the value lives here. *When* a zone's time has come is decided by PostgreSQL, from its own clock and
/// time zone rules, in one statement (the due rule, `SQL.zoneScheduleCTE` in MetricsdWork), so that every instance
/// agrees.
public struct DailyTime: Hashable, Sendable, CustomStringConvertible {
    public let hour: Int
    public let minute: Int

    public static let `default` = DailyTime(hour: 0, minute: 5)!

    public init?(hour: Int, minute: Int) {
        guard (0...23).contains(hour), (0...59).contains(minute) else { return nil }
        self.hour = hour
        self.minute = minute
    }

    /// Parses `HH:MM` (24-hour, two digits each, as in `00:05` or `23:30`).
    public init?(parsing text: some StringProtocol) {
        let bytes = Array(text.utf8)
        guard bytes.count == 5, bytes[2] == UInt8(ascii: ":"),
            let hour = Digits.parse(bytes[0..<2]), let minute = Digits.parse(bytes[3..<5])
        else { return nil }
        self.init(hour: hour, minute: minute)
    }

    /// `HH:MM`, also the literal PostgreSQL reads as a `time`.
    public var description: String { Digits.pad(self.hour, 2) + ":" + Digits.pad(self.minute, 2) }
}
