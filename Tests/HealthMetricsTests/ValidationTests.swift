import HealthMetrics
import Testing

/// Every invalid input is skipped with its reason, and every reason is found at once.
@Suite struct ValidationTests {
    static let date = LocalDate(iso: "2025-10-29")!
    static let valid = RawSettings(
        dateOfBirth: "1990-05-17", gender: "female", weightKilograms: "70.00", heightCentimetres: "175.0",
        activityLevel: "sedentary")

    static func reasons(_ settings: RawSettings, timezoneKnown: Bool = true) -> [SkipReason] {
        guard
            case .skipped(let reasons) = settings.validate(
                on: Self.date, timezoneKnown: timezoneKnown, timezone: "Mars/Olympus_Mons")
        else { return [] }
        return reasons
    }

    struct Invalid: Sendable, CustomTestStringConvertible {
        let name: String
        let change: @Sendable (inout RawSettings) -> Void
        let code: SkipReason.Code
        let description: String
        var testDescription: String { self.name }
    }

    static let invalid: [Invalid] = [
        .init(
            name: "height too small", change: { $0.heightCentimetres = "72.0" }, code: .outOfRange,
            description: "height 72 cm is outside 100–250 cm"),
        .init(
            name: "height too large", change: { $0.heightCentimetres = "250.1" }, code: .outOfRange,
            description: "height 250.1 cm is outside 100–250 cm"),
        .init(
            name: "weight too small", change: { $0.weightKilograms = "29.99" }, code: .outOfRange,
            description: "weight 29.99 kg is outside 30–300 kg"),
        .init(
            name: "weight too large", change: { $0.weightKilograms = "350.00" }, code: .outOfRange,
            description: "weight 350 kg is outside 30–300 kg"),
        .init(
            name: "negative weight", change: { $0.weightKilograms = "-70.00" }, code: .outOfRange,
            description: "weight -70 kg is outside 30–300 kg"),
        .init(
            name: "age 12 (13th birthday tomorrow)", change: { $0.dateOfBirth = "2012-10-30" }, code: .outOfRange,
            description: "age 12 on 2025-10-29 (born 2012-10-30) is outside 13–120 years"),
        .init(
            name: "age 121", change: { $0.dateOfBirth = "1904-10-29" }, code: .outOfRange,
            description: "age 121 on 2025-10-29 (born 1904-10-29) is outside 13–120 years"),
        .init(
            name: "born in the future", change: { $0.dateOfBirth = "2030-01-01" }, code: .outOfRange,
            description: "age -5 on 2025-10-29 (born 2030-01-01) is outside 13–120 years"),
        .init(
            name: "missing date of birth", change: { $0.dateOfBirth = nil }, code: .missingField,
            description: "date of birth is missing"),
        .init(
            name: "missing gender", change: { $0.gender = nil }, code: .missingField, description: "gender is missing"),
        .init(
            name: "missing weight", change: { $0.weightKilograms = nil }, code: .missingField,
            description: "weight is missing"),
        .init(
            name: "missing height", change: { $0.heightCentimetres = nil }, code: .missingField,
            description: "height is missing"),
        .init(
            name: "missing activity level", change: { $0.activityLevel = nil }, code: .missingField,
            description: "activity level is missing"),
        .init(
            name: "unknown gender", change: { $0.gender = "robot" }, code: .unknownGender,
            description: "gender 'robot' is not one of male, female, other"),
        .init(
            name: "gender in capitals", change: { $0.gender = "Female" }, code: .unknownGender,
            description: "gender 'Female' is not one of male, female, other"),
        .init(
            name: "unknown activity level", change: { $0.activityLevel = "couch" }, code: .unknownActivityLevel,
            description:
                "activity level 'couch' is not one of sedentary, lightly_active, moderately_active, very_active, extremely_active"
        ),
        .init(
            name: "malformed weight", change: { $0.weightKilograms = "NaN" }, code: .malformedValue,
            description: "weight 'NaN' is not a number"),
        .init(
            name: "malformed date", change: { $0.dateOfBirth = "17/05/1990" }, code: .malformedValue,
            description: "date of birth '17/05/1990' is not a date"),
        .init(
            name: "onboarding not completed", change: { $0.onboardingCompleted = false }, code: .onboardingIncomplete,
            description: "onboarding is not completed"),
        .init(
            name: "control characters are escaped", change: { $0.gender = "m\u{0}al\ne" }, code: .unknownGender,
            description: "gender 'm\\u{0}al\\u{a}e' is not one of male, female, other"),
    ]

    @Test(arguments: ValidationTests.invalid)
    func invalidInputHasItsReason(_ invalid: Invalid) {
        var settings = Self.valid
        invalid.change(&settings)
        let reasons = Self.reasons(settings)
        #expect(reasons == [SkipReason(invalid.code, invalid.description)])
    }

    @Test func noSettingsAtAll() {
        #expect(Self.reasons(.missing) == [SkipReason(.settingsMissing, "no settings: onboarding has not stored any")])
    }

    @Test func unknownTimezoneIsAReasonToo() {
        #expect(
            Self.reasons(Self.valid, timezoneKnown: false) == [
                SkipReason(.unknownTimezone, "timezone 'Mars/Olympus_Mons' is not a time zone the database knows")
            ])
    }

    @Test func everyReasonIsReportedAtOnce() {
        let settings = RawSettings(
            onboardingCompleted: false, dateOfBirth: nil, gender: "robot", weightKilograms: "350.00",
            heightCentimetres: "72.0", activityLevel: "couch")
        #expect(
            Self.reasons(settings, timezoneKnown: false).map(\.code) == [
                .unknownTimezone, .onboardingIncomplete, .missingField, .unknownGender, .outOfRange, .outOfRange,
                .unknownActivityLevel,
            ])
    }

    @Test(arguments: ["30.00", "300.00", "30", "300"])
    func weightBoundsAreInclusive(_ weight: String) {
        var settings = Self.valid
        settings.weightKilograms = weight
        #expect(Self.reasons(settings).isEmpty)
    }

    @Test(arguments: ["100.0", "250.0", "100", "250"])
    func heightBoundsAreInclusive(_ height: String) {
        var settings = Self.valid
        settings.heightCentimetres = height
        #expect(Self.reasons(settings).isEmpty)
    }
}
