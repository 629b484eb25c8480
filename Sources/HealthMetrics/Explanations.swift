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
        // Appended into reserved strings rather than interpolated: these are in every response body.
        let category = BMICategory(tenths: metrics.bmiTenths)
        var bmi = String()
        bmi.reserveCapacity(160)
        bmi += "Your BMI is "
        bmi += metrics.bmi.description
        bmi += ", which the World Health Organization classifies as "
        bmi += category.phrase
        bmi += " ("
        bmi += category.band
        bmi += "). BMI compares weight with height and does not tell muscle from fat."
        var bmr = String()
        bmr.reserveCapacity(160)
        bmr += "Your body uses about "
        bmr += String(metrics.bmr)
        bmr += " kcal a day at complete rest (basal metabolic rate, Mifflin–St Jeor equation from your weight, height, age and gender)."
        var tdee = String()
        tdee.reserveCapacity(160)
        tdee += "You burn about "
        tdee += String(metrics.tdee)
        if let activityLevel {
            tdee += " kcal a day for a "
            tdee += activityLevel.phrase
            tdee += " lifestyle"
        } else {
            tdee += " kcal a day for your activity level"
        }
        tdee += " (total daily energy expenditure). Eating about this much keeps your weight stable."
        self.bmi = bmi
        self.bmr = bmr
        self.tdee = tdee
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
