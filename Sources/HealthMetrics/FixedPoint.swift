/// A decimal number held as an integer count of `10^-scale` units, so that the formulas are exact.
///
/// PostgreSQL sends `NUMERIC(6,2)` weights and `NUMERIC(5,1)` heights as text such as `"70.50"` and `"175.0"`;
/// parsing them into integers (7050 hundredths of a kilogram, 1750 tenths of a centimetre) keeps every
/// rounding decision of the formulas exact, with no binary floating point in between.
public struct FixedPoint: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The value in units of `10^-scale`.
    public let units: Int64
    /// Digits after the decimal point.
    public let scale: Int

    public init(units: Int64, scale: Int) {
        precondition((0...9).contains(scale), "scale must be 0...9")
        self.units = units
        self.scale = scale
    }

    /// Parses `[-]digits[.digits]` into `scale` decimals. Extra decimals must be zeros (`"70.500"` is 7050 at
    /// scale 2, `"70.505"` is rejected); nil for anything else, including exponents, `NaN` and `Infinity`.
    public init?(parsing text: some StringProtocol, scale: Int) {
        precondition((0...9).contains(scale), "scale must be 0...9")
        var bytes = Array(text.utf8)[...]
        var negative = false
        if bytes.first == UInt8(ascii: "-") {
            negative = true
            bytes = bytes.dropFirst()
        }
        let point = bytes.firstIndex(of: UInt8(ascii: "."))
        let integerPart = point.map { bytes[bytes.startIndex..<$0] } ?? bytes
        let fractionPart = point.map { bytes[($0 + 1)...] } ?? []
        guard !integerPart.isEmpty, integerPart.count <= 12, let whole = Digits.parse(integerPart) else { return nil }
        if point != nil, fractionPart.isEmpty { return nil }
        var fraction = 0
        for (index, byte) in fractionPart.enumerated() {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            let digit = Int(byte - UInt8(ascii: "0"))
            if index < scale {
                fraction = fraction * 10 + digit
            } else if digit != 0 {
                return nil
            }
        }
        for _ in min(fractionPart.count, scale)..<scale { fraction *= 10 }
        var power = 1
        for _ in 0..<scale { power *= 10 }
        let magnitude = Int64(whole * power + fraction)
        self.init(units: negative ? -magnitude : magnitude, scale: scale)
    }

    /// The value as a `Double`, for display and JSON only.
    public var doubleValue: Double {
        var power = 1.0
        for _ in 0..<self.scale { power *= 10 }
        return Double(self.units) / power
    }

    /// `"70.50"`, `"-0.5"`: exactly `scale` decimals, the form PostgreSQL accepts for a `NUMERIC` parameter.
    public var description: String {
        guard self.scale > 0 else { return String(self.units) }
        var power: Int64 = 1
        for _ in 0..<self.scale { power *= 10 }
        let magnitude = self.units.magnitude
        let whole = magnitude / UInt64(power)
        let fraction = magnitude % UInt64(power)
        let fractionText = String(fraction)
        let padded = String(repeating: "0", count: self.scale - fractionText.count) + fractionText
        return (self.units < 0 ? "-" : "") + String(whole) + "." + padded
    }

    /// A shortest human form: `"70.5"` for 70.50, `"72"` for 72.0.
    public var trimmedDescription: String {
        var text = self.description
        guard text.contains(".") else { return text }
        while text.hasSuffix("0") { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text
    }

    public static func < (lhs: FixedPoint, rhs: FixedPoint) -> Bool {
        precondition(lhs.scale == rhs.scale, "compare values of one scale")
        return lhs.units < rhs.units
    }
}
