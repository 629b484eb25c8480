extension TestDatabase {
    /// `count` users in `zones`, each with a version 1 row for their current local date except every 50th, whose
    /// height (72 cm) is invalid: the recompute suites' starting point.
    /// The zones of the recompute suites: UTC, a +05:45 offset, midnight DST changes and both ends of the date line.
    package static let recomputeZones = ["UTC", "Asia/Kathmandu", "America/Havana", "Pacific/Kiritimati", "Etc/GMT+12"]

    package func seedWithVersion1(count: Int, zones: [String] = TestDatabase.recomputeZones) async throws {
        try await self.execute(
            """
            INSERT INTO users (id, timezone)
            SELECT g, (ARRAY['\(zones.joined(separator: "','"))'])[1 + g % \(zones.count)]
            FROM generate_series(1, \(count)) g;
            INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, onboarding_completed)
            SELECT id, date '1980-01-01' + (id % 9000)::int, (ARRAY['male','female','other'])[1 + id % 3], 45 + (id % 80),
                   CASE WHEN id % 50 = 0 THEN 72 ELSE 150 + (id % 60) END, 'lightly_active', true FROM users;
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
            SELECT id, 22.0, 1500, 2000, 1, (now() AT TIME ZONE timezone)::date FROM users WHERE id % 50 <> 0;
            ANALYZE;
            """)
    }
}
