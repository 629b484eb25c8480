import Foundation
import HealthMetrics
import MetricsdPostgres

/// Test users and their settings, written with plain SQL as onboarding would.
package struct SeedUser: Sendable {
    package var id: Int64
    package var timezone: String
    package var dateOfBirth: String?
    package var gender: String?
    package var weight: String?
    package var height: String?
    package var activity: String?
    package var onboardingCompleted: Bool
    /// False: the user has no `user_settings` row at all.
    package var hasSettings: Bool

    /// A user; valid unless a value says otherwise.
    package init(
        id: Int64, timezone: String = "UTC", dateOfBirth: String? = "1990-05-17", gender: String? = "female",
        weight: String? = "70.00", height: String? = "175.0", activity: String? = "moderately_active",
        onboardingCompleted: Bool = true, hasSettings: Bool = true
    ) {
        self.id = id
        self.timezone = timezone
        self.dateOfBirth = dateOfBirth
        self.gender = gender
        self.weight = weight
        self.height = height
        self.activity = activity
        self.onboardingCompleted = onboardingCompleted
        self.hasSettings = hasSettings
    }

    package static func valid(_ id: Int64, timezone: String = "UTC") -> SeedUser {
        SeedUser(id: id, timezone: timezone)
    }
}

extension TestDatabase {
    /// Inserts users and settings in one statement each (set-based, fast enough for 100,000 users).
    package func seed(_ users: [SeedUser]) async throws {
        guard !users.isEmpty else { return }
        @Sendable func array(_ values: [String?]) -> String {
            "{"
                + values.map { value in
                    guard let value else { return "NULL" }
                    return "\""
                        + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(
                            of: "\"", with: "\\\"") + "\""
                }.joined(separator: ",") + "}"
        }
        try await self.pool.withConnection { connection in
            try connection.query(
                "INSERT INTO users (id, timezone) SELECT * FROM unnest($1::bigint[], $2::text[])",
                [array(users.map { String($0.id) }), array(users.map(\.timezone))])
            let settled = users.filter(\.hasSettings)
            try connection.query(
                """
                INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                           onboarding_completed)
                SELECT * FROM unnest($1::bigint[], $2::date[], $3::text[], $4::numeric[], $5::numeric[], $6::text[],
                                     $7::bool[])
                """,
                [
                    array(settled.map { String($0.id) }), array(settled.map(\.dateOfBirth)),
                    array(settled.map(\.gender)),
                    array(settled.map(\.weight)), array(settled.map(\.height)), array(settled.map(\.activity)),
                    array(settled.map { $0.onboardingCompleted ? "true" : "false" }),
                ])
            try connection.execute("SELECT setval(pg_get_serial_sequence('users', 'id'), (SELECT max(id) FROM users))")
        }
    }
}
