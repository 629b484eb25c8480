import HealthMetrics
import Testing

/// Formulas version 1, on hand-checked cases. Expected values were worked out by hand with exact
/// decimals (e.g. case 1: BMR = 10·70 + 6.25·175 − 5·30 + 5 = 1648.75 → 1649; TDEE = 1648.75 × 1.55 =
/// 2555.5625 → 2556; BMI = 70 / 1.75² = 22.857… → 22.9) and cross-checked with Python's `decimal` module
/// (ROUND_HALF_UP). Several cases sit exactly on a rounding half.
@Suite struct FormulaTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let weight: String
        let height: String
        let dateOfBirth: String
        let on: String
        let gender: Gender
        let activity: String
        let age: Int
        let bmi: String
        let bmr: Int64
        let tdee: Int64
        var testDescription: String {
            "\(self.weight) kg \(self.height) cm \(self.gender) \(self.activity) age \(self.age)"
        }
    }

    static let cases: [Case] = [
        .init(
            weight: "70.00", height: "175.0", dateOfBirth: "1995-10-29", on: "2025-10-29", gender: .male,
            activity: "moderately_active", age: 30, bmi: "22.9", bmr: 1649, tdee: 2556),
        // The day before the 30th birthday: still 29.
        .init(
            weight: "70.00", height: "175.0", dateOfBirth: "1995-10-30", on: "2025-10-29", gender: .male,
            activity: "moderately_active", age: 29, bmi: "22.9", bmr: 1654, tdee: 2563),
        // 13th birthday on the local date: valid, age 13. Lightest and shortest allowed.
        .init(
            weight: "30.00", height: "100.0", dateOfBirth: "2012-10-29", on: "2025-10-29", gender: .female,
            activity: "sedentary", age: 13, bmi: "30.0", bmr: 699, tdee: 839),
        // Heaviest, tallest, oldest allowed; BMR exactly on a half (3884.5 → 3885).
        .init(
            weight: "300.00", height: "250.0", dateOfBirth: "1905-01-01", on: "2025-01-01", gender: .other,
            activity: "extremely_active", age: 120, bmi: "48.0", bmr: 3885, tdee: 7381),
        .init(
            weight: "30.00", height: "250.0", dateOfBirth: "1990-06-15", on: "2025-10-29", gender: .male,
            activity: "very_active", age: 35, bmi: "4.8", bmr: 1693, tdee: 2920),
        .init(
            weight: "300.00", height: "100.0", dateOfBirth: "1990-06-15", on: "2025-10-29", gender: .female,
            activity: "lightly_active", age: 35, bmi: "300.0", bmr: 3289, tdee: 4522),
        // Born on 29 February: not yet a year older on 28 February of a common year; TDEE on a half (1930.5).
        .init(
            weight: "72.25", height: "170.0", dateOfBirth: "1980-02-29", on: "2025-02-28", gender: .female,
            activity: "lightly_active", age: 44, bmi: "25.0", bmr: 1404, tdee: 1931),
        .init(
            weight: "72.25", height: "170.0", dateOfBirth: "1980-02-29", on: "2025-03-01", gender: .female,
            activity: "lightly_active", age: 45, bmi: "25.0", bmr: 1399, tdee: 1924),
        // BMI exactly 30.05 → 30.1 (binary floating point would give 30.0); BMR 722.5 → 723.
        .init(
            weight: "30.05", height: "100.0", dateOfBirth: "2000-01-01", on: "2025-06-01", gender: .other,
            activity: "sedentary", age: 25, bmi: "30.1", bmr: 723, tdee: 867),
        .init(
            weight: "55.50", height: "162.5", dateOfBirth: "1988-12-31", on: "2025-12-31", gender: .female,
            activity: "moderately_active", age: 37, bmi: "21.0", bmr: 1225, tdee: 1898),
        .init(
            weight: "88.80", height: "181.3", dateOfBirth: "1975-07-04", on: "2026-07-03", gender: .male,
            activity: "extremely_active", age: 50, bmi: "27.0", bmr: 1776, tdee: 3375),
        .init(
            weight: "64.00", height: "160.0", dateOfBirth: "1999-03-15", on: "2026-03-15", gender: .other,
            activity: "very_active", age: 27, bmi: "25.0", bmr: 1427, tdee: 2462),
        .init(
            weight: "101.30", height: "199.9", dateOfBirth: "1960-11-11", on: "2025-11-10", gender: .male,
            activity: "sedentary", age: 64, bmi: "25.4", bmr: 1947, tdee: 2337),
        .init(
            weight: "45.00", height: "150.0", dateOfBirth: "2005-05-05", on: "2025-05-05", gender: .female,
            activity: "extremely_active", age: 20, bmi: "20.0", bmr: 1127, tdee: 2140),
        .init(
            weight: "120.00", height: "185.0", dateOfBirth: "1970-01-01", on: "2025-10-29", gender: .male,
            activity: "lightly_active", age: 55, bmi: "35.1", bmr: 2086, tdee: 2869),
        .init(
            weight: "82.40", height: "178.0", dateOfBirth: "1992-08-20", on: "2025-10-29", gender: .other,
            activity: "moderately_active", age: 33, bmi: "26.0", bmr: 1694, tdee: 2625),
        .init(
            weight: "59.90", height: "165.5", dateOfBirth: "1985-04-01", on: "2025-10-29", gender: .female,
            activity: "very_active", age: 40, bmi: "21.9", bmr: 1272, tdee: 2195),
        .init(
            weight: "250.00", height: "210.0", dateOfBirth: "1950-09-09", on: "2025-10-29", gender: .male,
            activity: "sedentary", age: 75, bmi: "56.7", bmr: 3443, tdee: 4131),
        .init(
            weight: "33.33", height: "111.1", dateOfBirth: "2011-01-01", on: "2025-10-29", gender: .other,
            activity: "lightly_active", age: 14, bmi: "27.0", bmr: 880, tdee: 1210),
        .init(
            weight: "77.70", height: "177.7", dateOfBirth: "1977-07-07", on: "2025-10-29", gender: .female,
            activity: "extremely_active", age: 48, bmi: "24.6", bmr: 1487, tdee: 2825),
        // 120th birthday on the local date: still valid.
        .init(
            weight: "65.00", height: "172.0", dateOfBirth: "1906-10-29", on: "2026-10-29", gender: .female,
            activity: "sedentary", age: 120, bmi: "22.0", bmr: 964, tdee: 1157),
    ]

    @Test(arguments: FormulaTests.cases)
    func version1(_ testCase: Case) throws {
        let settings = RawSettings(
            dateOfBirth: testCase.dateOfBirth, gender: testCase.gender.rawValue, weightKilograms: testCase.weight,
            heightCentimetres: testCase.height, activityLevel: testCase.activity)
        let date = try #require(LocalDate(iso: testCase.on))
        guard case .valid(let profile) = settings.validate(on: date) else {
            Issue.record("expected valid settings")
            return
        }
        #expect(profile.age == testCase.age)
        let metrics = MetricsFormula.v1.compute(profile)
        #expect(metrics.bmi.description == testCase.bmi)
        #expect(metrics.bmr == testCase.bmr)
        #expect(metrics.tdee == testCase.tdee)
        #expect(metrics.version == 1)
    }

    @Test func everyActivityLevelAndGenderIsCovered() {
        #expect(Set(Self.cases.map(\.activity)) == Set(ActivityLevel.allCases.map(\.rawValue)))
        #expect(Set(Self.cases.map(\.gender)) == Set(Gender.allCases))
    }

    @Test(
        arguments: [
            (ActivityLevel.sedentary, 1200), (.lightlyActive, 1375), (.moderatelyActive, 1550), (.veryActive, 1725),
            (.extremelyActive, 1900),
        ] as [(ActivityLevel, Int64)])
    func activityFactors(level: ActivityLevel, thousandths: Int64) {
        #expect(level.factorThousandths == thousandths)
    }

    @Test func currentVersionIsOneAndRehearsalsRelabelOnly() throws {
        #expect(MetricsFormula.current.version == 1)
        let settings = RawSettings(
            dateOfBirth: "1995-10-29", gender: "male", weightKilograms: "70.00", heightCentimetres: "175.0",
            activityLevel: "moderately_active")
        let date = try #require(LocalDate(iso: "2025-10-29"))
        guard case .computed(let v1) = MetricsFormula.v1.evaluate(settings, on: date),
            case .computed(let v2) = MetricsFormula.rehearsal(version: 2).evaluate(settings, on: date)
        else {
            Issue.record("expected metrics")
            return
        }
        #expect(v2.version == 2)
        #expect((v1.bmiTenths, v1.bmr, v1.tdee) == (v2.bmiTenths, v2.bmr, v2.tdee))
        #expect(MetricsFormula.rehearsal(version: 2).knownVersions == 1...2)
    }
}
