/// Why a user gets no metrics.
///
/// `code` is stable (stored, counted and used as a Prometheus label); `description` is the sentence an operator
/// lists with `metricsd skipped` and the 404 body says, e.g. "height 72 cm is outside 100–250 cm".
public struct SkipReason: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, CaseIterable, Sendable {
        case settingsMissing = "settings_missing"
        case onboardingIncomplete = "onboarding_incomplete"
        case missingField = "missing_field"
        case malformedValue = "malformed_value"
        case outOfRange = "out_of_range"
        case unknownGender = "unknown_gender"
        case unknownActivityLevel = "unknown_activity_level"
        case unknownTimezone = "unknown_timezone"
    }

    public let code: Code
    public let description: String

    public init(_ code: Code, _ description: String) {
        self.code = code
        self.description = description
    }
}

/// The outcome of validating one user's settings for one local date.
public enum Validation: Hashable, Sendable {
    case valid(UserProfile)
    /// Every reason found, in field order; never empty.
    case skipped([SkipReason])
}

/// The valid input ranges: weight 30–300 kg, height 100–250 cm, age 13–120.
public enum ValidRange {
    public static let weightKilograms: ClosedRange<Int64> = 30...300
    public static let heightCentimetres: ClosedRange<Int64> = 100...250
    public static let age: ClosedRange<Int> = 13...120
}

extension RawSettings {
    /// Checks every input the formulas need, for the user's local date `date`, and returns all that is wrong.
    ///
    /// - Parameters:
    ///   - date: the user's local date; age is counted on it.
    ///   - timezoneKnown: false when the user's time zone is not one the database knows.
    ///   - timezone: the stored time zone name, for the reason's sentence.
    public func validate(on date: LocalDate, timezoneKnown: Bool = true, timezone: String = "") -> Validation {
        var reasons: [SkipReason] = []
        if !timezoneKnown {
            reasons.append(
                .init(.unknownTimezone, "timezone \(quoted(timezone)) is not a time zone the database knows"))
        }
        guard self.exists else {
            reasons.append(.init(.settingsMissing, "no settings: onboarding has not stored any"))
            return .skipped(reasons)
        }
        if !self.onboardingCompleted {
            reasons.append(.init(.onboardingIncomplete, "onboarding is not completed"))
        }

        var dateOfBirth: LocalDate?
        var age: Int?
        switch self.dateOfBirth {
        case nil:
            reasons.append(.init(.missingField, "date of birth is missing"))
        case let text?:
            if let parsed = LocalDate(iso: text) {
                let years = date.years(since: parsed)
                if ValidRange.age.contains(years) {
                    dateOfBirth = parsed
                    age = years
                } else {
                    reasons.append(
                        .init(.outOfRange, "age \(years) on \(date) (born \(parsed)) is outside 13–120 years"))
                }
            } else {
                reasons.append(.init(.malformedValue, "date of birth \(quoted(text)) is not a date"))
            }
        }

        var gender: Gender?
        switch self.gender {
        case nil:
            reasons.append(.init(.missingField, "gender is missing"))
        case let text?:
            gender = Gender(rawValue: text)
            if gender == nil {
                reasons.append(.init(.unknownGender, "gender \(quoted(text)) is not one of male, female, other"))
            }
        }

        let weight = Self.check(
            self.weightKilograms, name: "weight", unit: "kg", scale: 2, range: ValidRange.weightKilograms,
            into: &reasons)
        let height = Self.check(
            self.heightCentimetres, name: "height", unit: "cm", scale: 1, range: ValidRange.heightCentimetres,
            into: &reasons)

        var activity: ActivityLevel?
        switch self.activityLevel {
        case nil:
            reasons.append(.init(.missingField, "activity level is missing"))
        case let text?:
            activity = ActivityLevel(rawValue: text)
            if activity == nil {
                let known = ActivityLevel.allCases.map(\.rawValue).joined(separator: ", ")
                reasons.append(.init(.unknownActivityLevel, "activity level \(quoted(text)) is not one of \(known)"))
            }
        }

        guard reasons.isEmpty, let dateOfBirth, let age, let gender, let weight, let height, let activity else {
            return .skipped(reasons)
        }
        return .valid(
            UserProfile(
                dateOfBirth: dateOfBirth, gender: gender, weight: weight, height: height, activityLevel: activity,
                age: age, localDate: date))
    }

    private static func check(
        _ text: String?, name: String, unit: String, scale: Int, range: ClosedRange<Int64>,
        into reasons: inout [SkipReason]
    ) -> FixedPoint? {
        guard let text else {
            reasons.append(.init(.missingField, "\(name) is missing"))
            return nil
        }
        guard let value = FixedPoint(parsing: text, scale: scale) else {
            reasons.append(.init(.malformedValue, "\(name) \(quoted(text)) is not a number"))
            return nil
        }
        let lower = FixedPoint(units: range.lowerBound * Self.power(scale), scale: scale)
        let upper = FixedPoint(units: range.upperBound * Self.power(scale), scale: scale)
        guard value >= lower, value <= upper else {
            reasons.append(
                .init(
                    .outOfRange,
                    "\(name) \(value.trimmedDescription) \(unit) is outside \(range.lowerBound)–\(range.upperBound) \(unit)"
                ))
            return nil
        }
        return value
    }

    private static func power(_ scale: Int) -> Int64 {
        var power: Int64 = 1
        for _ in 0..<scale { power *= 10 }
        return power
    }
}

/// A stored value inside a reason: quoted, at most 40 characters, control characters escaped, so that whatever
/// onboarding wrote cannot break a log line, a table or a JSON body.
func quoted(_ text: String) -> String {
    var result = "'"
    for (index, scalar) in text.unicodeScalars.enumerated() {
        if index == 40 {
            result += "…"
            break
        }
        switch scalar.value {
        case 0..<0x20, 0x7F, 0x80..<0xA0: result += "\\u{\(String(scalar.value, radix: 16))}"
        case UInt32(UInt8(ascii: "'")): result += "\\'"
        default: result.unicodeScalars.append(scalar)
        }
    }
    return result + "'"
}
