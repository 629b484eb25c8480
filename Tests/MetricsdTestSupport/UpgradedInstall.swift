import Foundation
import MetricsdPostgres

extension TestDatabase {
    /// Today at UTC, as the database's clock has it (an upgraded install's history ends the day before).
    package static let today = "(now() AT TIME ZONE 'UTC')::date"

    /// An install of the release before migration 0017, not yet migrated further: its schema, `users` users (ids
    /// from 1, in UTC, with valid settings) and `days` days of history each, ending yesterday, written day by day as
    /// the daily units wrote them (so into the old partition); every other user acknowledged their newest row.
    package static func upgradedInstall(users: Int, days: Int) async throws -> TestDatabase {
        let database = try await TestDatabase.create(migrations: Migration.all.filter { $0.name < "0017" })
        try await database.seed((1...Int64(users)).map { SeedUser.valid($0) })
        try await database.execute(
            """
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            SELECT u, 20 + (d % 7), 1500 + d % 50, 2000 + u, 1, \(Self.today) - d,
                   (\(Self.today) - d)::timestamp AT TIME ZONE 'UTC' + interval '5 minutes' + u * interval '1 second'
            FROM generate_series(1, \(days)) d CROSS JOIN generate_series(1, \(users)) u ORDER BY d DESC, u;
            INSERT INTO metrics_acknowledgements (user_id, version, metrics_computed_at, acknowledged_at)
            SELECT user_id, version, computed_at, computed_at + interval '1 hour' FROM profile_metrics_latest
            WHERE user_id % 2 = 0;
            ANALYZE profile_metrics
            """)
        return database
    }
}
