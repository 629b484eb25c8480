/// Where text is written: a `String`, or the bytes of a response body (the HTTP layer writes the explanations
/// straight into the body, without building the sentences as strings first).
public protocol TextSink {
    /// Appends text known at compile time.
    mutating func write(_ text: StaticString)
    /// Appends a decimal integer.
    mutating func write(decimal value: Int64)
    /// Appends text.
    mutating func write(_ text: String)
}

/// A `TextSink` that builds a `String`.
public struct StringSink: TextSink {
    public private(set) var text: String

    public init(capacity: Int = 160) {
        self.text = String()
        self.text.reserveCapacity(capacity)
    }

    public mutating func write(_ text: StaticString) {
        text.withUTF8Buffer { self.text += String(decoding: $0, as: UTF8.self) }
    }

    public mutating func write(decimal value: Int64) { self.text += String(value) }
    public mutating func write(_ text: String) { self.text += text }
}

/// Plain-language explanations shown next to the numbers: a sentence or two per metric.
///
/// The sentences are written once, by the `write…` functions, into any `TextSink`; they hold no character that
/// JSON needs escaped (a test checks every category and activity level), so a JSON writer may copy them as
/// they are.
public struct Explanations: Hashable, Sendable {
    public let bmi: String
    public let bmr: String
    public let tdee: String

    public init(bmi: String, bmr: String, tdee: String) {
        self.bmi = bmi
        self.bmr = bmr
        self.tdee = tdee
    }

    /// Explanations for stored metrics. `activityLevel` is the user's current level when known; the TDEE
    /// sentence names it then, and stays generic otherwise.
    public init(_ metrics: ComputedMetrics, activityLevel: ActivityLevel? = nil) {
        var bmi = StringSink()
        Self.writeBMI(metrics, into: &bmi)
        var bmr = StringSink()
        Self.writeBMR(metrics, into: &bmr)
        var tdee = StringSink()
        Self.writeTDEE(metrics, activityLevel: activityLevel, into: &tdee)
        self.bmi = bmi.text
        self.bmr = bmr.text
        self.tdee = tdee.text
    }

    /// "Your BMI is 24.5, which the World Health Organization classifies as a healthy weight (18.5 to 24.9). …"
    public static func writeBMI<Sink: TextSink>(_ metrics: ComputedMetrics, into sink: inout Sink) {
        let category = BMICategory(tenths: metrics.bmiTenths)
        sink.write("Your BMI is ")
        Self.writeTenths(metrics.bmiTenths, into: &sink)
        sink.write(", which the World Health Organization classifies as ")
        sink.write(category.phrase)
        sink.write(" (")
        sink.write(category.band)
        sink.write("). BMI compares weight with height and does not tell muscle from fat.")
    }

    /// "Your body uses about 1650 kcal a day at complete rest (…)."
    public static func writeBMR<Sink: TextSink>(_ metrics: ComputedMetrics, into sink: inout Sink) {
        sink.write("Your body uses about ")
        sink.write(decimal: metrics.bmr)
        sink.write(
            " kcal a day at complete rest (basal metabolic rate, Mifflin–St Jeor equation from your weight, height, age and gender)."
        )
    }

    /// "You burn about 2475 kcal a day for your activity level (…). …"
    public static func writeTDEE<Sink: TextSink>(
        _ metrics: ComputedMetrics, activityLevel: ActivityLevel? = nil, into sink: inout Sink
    ) {
        sink.write("You burn about ")
        sink.write(decimal: metrics.tdee)
        if let activityLevel {
            sink.write(" kcal a day for a ")
            sink.write(activityLevel.phrase)
            sink.write(" lifestyle")
        } else {
            sink.write(" kcal a day for your activity level")
        }
        sink.write(" (total daily energy expenditure). Eating about this much keeps your weight stable.")
    }

    /// A value in tenths as a decimal with one digit after the point ("24.5", "-0.5"), as `ComputedMetrics.bmi`
    /// prints it.
    public static func writeTenths<Sink: TextSink>(_ tenths: Int64, into sink: inout Sink) {
        if tenths < 0 && tenths > -10 { sink.write("-") }
        sink.write(decimal: tenths / 10)
        sink.write(".")
        sink.write(decimal: abs(tenths % 10))
    }
}

/// The WHO adult BMI bands.
public enum BMICategory: String, CaseIterable, Sendable {
    case underweight, normal, overweight, obesityClass1, obesityClass2, obesityClass3

    /// The band containing a BMI given in tenths.
    public init(tenths: Int64) {
        switch tenths {
        case ..<185: self = .underweight
        case ..<250: self = .normal
        case ..<300: self = .overweight
        case ..<350: self = .obesityClass1
        case ..<400: self = .obesityClass2
        default: self = .obesityClass3
        }
    }

    public var phrase: StaticString {
        switch self {
        case .underweight: "underweight"
        case .normal: "a healthy weight"
        case .overweight: "overweight"
        case .obesityClass1: "obesity class I"
        case .obesityClass2: "obesity class II"
        case .obesityClass3: "obesity class III"
        }
    }

    public var band: StaticString {
        switch self {
        case .underweight: "below 18.5"
        case .normal: "18.5 to 24.9"
        case .overweight: "25.0 to 29.9"
        case .obesityClass1: "30.0 to 34.9"
        case .obesityClass2: "35.0 to 39.9"
        case .obesityClass3: "40.0 or more"
        }
    }
}
