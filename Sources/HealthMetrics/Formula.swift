/// One user's metrics for one local date, as stored in `profile_metrics`.
public struct ComputedMetrics: Hashable, Sendable {
    /// BMI in tenths (245 = 24.5), as `NUMERIC(5,1)` stores it.
    public let bmiTenths: Int64
    /// BMR in kcal/day, rounded.
    public let bmr: Int64
    /// TDEE in kcal/day, from the unrounded BMR, rounded.
    public let tdee: Int64
    /// The formula version that produced these values.
    public let version: Int

    public init(bmiTenths: Int64, bmr: Int64, tdee: Int64, version: Int) {
        self.bmiTenths = bmiTenths
        self.bmr = bmr
        self.tdee = tdee
        self.version = version
    }

    public var bmi: FixedPoint { FixedPoint(units: self.bmiTenths, scale: 1) }
}

/// The metrics formulas, identified by a version stored with every row.
///
/// All arithmetic is on integers: weight in hundredths of a kilogram, height in tenths of a centimetre, BMR in
/// 1/40 kcal. Each rounding is therefore exact and rounds halves up, as PostgreSQL's `round(numeric)` does.
public struct MetricsFormula: Hashable, Sendable {
    /// The version written to `profile_metrics.version`.
    public let version: Int

    /// Version 1: BMI = kg / m², Mifflin-St Jeor BMR, TDEE = BMR × activity factor.
    public static let v1 = MetricsFormula(version: 1)

    /// **The** formula version of this build. Bump it (and the maths below, if they change) to ship new formulas;
    /// then run `metricsd recompute-all` (README, "Formula bump").
    public static let current = MetricsFormula.v1

    /// The same maths labelled with another version number: how tests and rehearsals exercise a version bump
    /// without shipping new formulas (`METRICSD_TEST_FORMULA_VERSION`).
    public static func rehearsal(version: Int) -> MetricsFormula {
        MetricsFormula(version: version)
    }

    private init(version: Int) {
        self.version = version
    }

    /// Every version a row or an acknowledgement can carry with this build: 1 through `version`.
    public var knownVersions: ClosedRange<Int> { 1...max(1, self.version) }

    /// Validates `settings` for the local date and computes the metrics, or returns every reason not to.
    public func evaluate(_ settings: RawSettings, on date: LocalDate, timezoneKnown: Bool = true, timezone: String = "")
        -> Outcome
    {
        switch settings.validate(on: date, timezoneKnown: timezoneKnown, timezone: timezone) {
        case .valid(let profile): return .computed(self.compute(profile))
        case .skipped(let reasons): return .skipped(reasons)
        }
    }

    public enum Outcome: Hashable, Sendable {
        case computed(ComputedMetrics)
        case skipped([SkipReason])
    }

    /// BMI, BMR and TDEE of a validated profile.
    ///
    /// - BMI = kg / m², rounded to one decimal: `round(10 · kg·10⁴ / cm²)` = `round(w · 10⁵ / h²)` with
    ///   `w` in hundredths of a kilogram and `h` in tenths of a centimetre.
    /// - BMR (Mifflin–St Jeor) = 10·kg + 6.25·cm − 5·age + s, with s = +5 male, −161 female, −78 other:
    ///   in 1/40 kcal that is `4w + 25h − 200·age + 40s`, an integer.
    /// - TDEE = unrounded BMR × factor: `BMR₄₀ · f / 40 000` with the factor `f` in thousandths.
    public func compute(_ profile: UserProfile) -> ComputedMetrics {
        let w = profile.weight.units  // hundredths of kg
        let h = profile.height.units  // tenths of cm
        let bmiTenths = Self.roundHalfUp(w * 100_000, h * h)
        let genderConstant: Int64 =
            switch profile.gender {
            case .male: 5
            case .female: -161
            case .other: -78
            }
        let bmrFortieths = 4 * w + 25 * h - 200 * Int64(profile.age) + 40 * genderConstant
        let bmr = Self.roundHalfUp(bmrFortieths, 40)
        let tdee = Self.roundHalfUp(bmrFortieths * profile.activityLevel.factorThousandths, 40_000)
        return ComputedMetrics(bmiTenths: bmiTenths, bmr: bmr, tdee: tdee, version: self.version)
    }

    /// `numerator / denominator` rounded to the nearest integer, halves away from zero (denominator > 0).
    static func roundHalfUp(_ numerator: Int64, _ denominator: Int64) -> Int64 {
        let magnitude = (2 * numerator.magnitude + denominator.magnitude) / (2 * denominator.magnitude)
        return numerator < 0 ? -Int64(magnitude) : Int64(magnitude)
    }
}
