/// Gender as the formulas know it (`user_settings.gender`).
public enum Gender: String, CaseIterable, Sendable {
    case male, female, other
}

/// Activity level and its TDEE factor (`user_settings.activity_level`).
public enum ActivityLevel: String, CaseIterable, Sendable {
    case sedentary
    case lightlyActive = "lightly_active"
    case moderatelyActive = "moderately_active"
    case veryActive = "very_active"
    case extremelyActive = "extremely_active"

    /// The factor in thousandths: 1.2, 1.375, 1.55, 1.725, 1.9.
    public var factorThousandths: Int64 {
        switch self {
        case .sedentary: 1200
        case .lightlyActive: 1375
        case .moderatelyActive: 1550
        case .veryActive: 1725
        case .extremelyActive: 1900
        }
    }

    /// A few words for explanations: "lightly active".
    public var phrase: String { self.rawValue.replacingUnderscores() }
}

/// One user's settings exactly as stored: every value may be missing or wrong.
///
/// This is the input of validation; nothing here has been checked yet.
public struct RawSettings: Hashable, Sendable {
    /// False when the user has no `user_settings` row at all.
    public var exists: Bool
    public var onboardingCompleted: Bool
    public var dateOfBirth: String?
    public var gender: String?
    /// `NUMERIC(6,2)` as PostgreSQL prints it, kilograms.
    public var weightKilograms: String?
    /// `NUMERIC(5,1)` as PostgreSQL prints it, centimetres.
    public var heightCentimetres: String?
    public var activityLevel: String?

    public init(
        exists: Bool = true, onboardingCompleted: Bool = true, dateOfBirth: String? = nil, gender: String? = nil,
        weightKilograms: String? = nil, heightCentimetres: String? = nil, activityLevel: String? = nil
    ) {
        self.exists = exists
        self.onboardingCompleted = onboardingCompleted
        self.dateOfBirth = dateOfBirth
        self.gender = gender
        self.weightKilograms = weightKilograms
        self.heightCentimetres = heightCentimetres
        self.activityLevel = activityLevel
    }

    /// No settings row.
    public static let missing = RawSettings(exists: false, onboardingCompleted: false)
}

/// Settings that passed validation: every formula input is present and in range.
public struct UserProfile: Hashable, Sendable {
    public let dateOfBirth: LocalDate
    public let gender: Gender
    /// Hundredths of a kilogram (7050 = 70.50 kg).
    public let weight: FixedPoint
    /// Tenths of a centimetre (1755 = 175.5 cm).
    public let height: FixedPoint
    public let activityLevel: ActivityLevel
    /// Whole years on the local date the profile was validated for.
    public let age: Int
    /// The local date the profile was validated for (age depends on it).
    public let localDate: LocalDate
}

extension String {
    func replacingUnderscores() -> String {
        String(self.map { $0 == "_" ? " " : $0 })
    }
}
