/// Plain-language explanations shown next to the numbers (SPEC.md: a sentence or two per metric).
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
        let bmi = metrics.bmi.description
        let category = BMICategory(tenths: metrics.bmiTenths)
        self.bmi =
            "Your BMI is \(bmi), which the World Health Organization classifies as \(category.phrase) "
            + "(\(category.band)). BMI compares weight with height and does not tell muscle from fat."
        self.bmr =
            "Your body uses about \(metrics.bmr) kcal a day at complete rest (basal metabolic rate, "
            + "Mifflin–St Jeor equation from your weight, height, age and gender)."
        let activity = activityLevel.map { " for a \($0.phrase) lifestyle" } ?? " for your activity level"
        self.tdee =
            "You burn about \(metrics.tdee) kcal a day\(activity) (total daily energy expenditure). "
            + "Eating about this much keeps your weight stable."
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

    public var phrase: String {
        switch self {
        case .underweight: "underweight"
        case .normal: "a healthy weight"
        case .overweight: "overweight"
        case .obesityClass1: "obesity class I"
        case .obesityClass2: "obesity class II"
        case .obesityClass3: "obesity class III"
        }
    }

    public var band: String {
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
