/// Everything metricsd holds about a user besides their metrics rows, as an export shows it: the settings as they
/// are now (as stored, each value as text, nil when absent), the latest verdict on them, the acknowledgement.
public struct ExportProfile: Hashable, Sendable {
    public let userID: Int64
    public let timezone: String
    /// Whether the user has a settings row at all.
    public let hasSettings: Bool
    public let dateOfBirth: String?
    public let gender: String?
    /// Kilograms and centimetres, as stored (decimal text).
    public let weightKilograms: String?
    public let heightCentimetres: String?
    public let activityLevel: String?
    public let onboardingCompleted: Bool
    /// When a value the formulas read last changed (nil without settings).
    public let settingsUpdatedAt: Timestamp?
    /// The reasons of the user's skip record: the settings give no metrics now. Nil when they do.
    public let invalidSettings: String?
    /// The user's one acknowledgement: version, the `computed_at` it names, when.
    public let acknowledgement: (version: Int, computedAt: Timestamp, acknowledgedAt: Timestamp)?

    public init(
        userID: Int64, timezone: String, hasSettings: Bool, dateOfBirth: String?, gender: String?,
        weightKilograms: String?,
        heightCentimetres: String?, activityLevel: String?, onboardingCompleted: Bool, settingsUpdatedAt: Timestamp?,
        invalidSettings: String?, acknowledgement: (version: Int, computedAt: Timestamp, acknowledgedAt: Timestamp)?
    ) {
        self.userID = userID
        self.timezone = timezone
        self.hasSettings = hasSettings
        self.dateOfBirth = dateOfBirth
        self.gender = gender
        self.weightKilograms = weightKilograms
        self.heightCentimetres = heightCentimetres
        self.activityLevel = activityLevel
        self.onboardingCompleted = onboardingCompleted
        self.settingsUpdatedAt = settingsUpdatedAt
        self.invalidSettings = invalidSettings
        self.acknowledgement = acknowledgement
    }

    public static func == (lhs: ExportProfile, rhs: ExportProfile) -> Bool {
        lhs.userID == rhs.userID && lhs.timezone == rhs.timezone && lhs.hasSettings == rhs.hasSettings
            && lhs.dateOfBirth == rhs.dateOfBirth && lhs.gender == rhs.gender
            && lhs.weightKilograms == rhs.weightKilograms
            && lhs.heightCentimetres == rhs.heightCentimetres && lhs.activityLevel == rhs.activityLevel
            && lhs.onboardingCompleted == rhs.onboardingCompleted && lhs.settingsUpdatedAt == rhs.settingsUpdatedAt
            && lhs.invalidSettings == rhs.invalidSettings
            && lhs.acknowledgement?.version == rhs.acknowledgement?.version
            && lhs.acknowledgement?.computedAt == rhs.acknowledgement?.computedAt
            && lhs.acknowledgement?.acknowledgedAt == rhs.acknowledgement?.acknowledgedAt
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(self.userID)
    }
}

/// The storage port of the export (`GET /v1/profile/metrics/export`): read in pages, so that no export is held
/// whole in memory.
public protocol MetricsExportStore: Sendable {
    /// The user's profile, or nil for no such user.
    func exportProfile(userID: Int64) async throws -> ExportProfile?
    /// The user's rows of every version after (`version`, `date`), in that order, at most `limit`.
    func exportRows(userID: Int64, after: (version: Int, date: LocalDate)?, limit: Int) async throws -> [HistoryEntry]
}
