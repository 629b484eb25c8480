import HealthMetrics
import MetricsdPostgres

/// One user as the batch queries read them (`SQL.readUsers`).
package struct UserRow {
    let id: Int64
    let timezone: String
    let timezoneKnown: Bool
    let localDate: LocalDate
    let settings: RawSettings
    let hadSkip: Bool
    /// `user_settings.updated_at` as PostgreSQL prints it, nil without settings.
    let settingsUpdatedAt: String?

    package static func decode(_ result: PostgresResult) throws(PostgresError) -> [UserRow] {
        var rows: [UserRow] = []
        rows.reserveCapacity(result.rowCount)
        for row in 0..<result.rowCount {
            let dateText = try result.requiredString(row, 3)
            guard let localDate = LocalDate(iso: dateText) else {
                throw PostgresError(code: .unexpectedResult, message: "local date \(dateText) is not YYYY-MM-DD")
            }
            rows.append(
                UserRow(
                    id: try result.int(row, 0),
                    timezone: try result.requiredString(row, 1),
                    timezoneKnown: try result.bool(row, 2),
                    localDate: localDate,
                    settings: RawSettings(
                        exists: try result.bool(row, 4),
                        onboardingCompleted: try result.bool(row, 5),
                        dateOfBirth: result.string(row, 6),
                        gender: result.string(row, 7),
                        weightKilograms: result.string(row, 8),
                        heightCentimetres: result.string(row, 9),
                        activityLevel: result.string(row, 10)),
                    hadSkip: try result.bool(row, 11),
                    settingsUpdatedAt: result.string(row, 12)))
        }
        return rows
    }
}

/// A batch of users evaluated by the formulas, as the parameters of `SQL.writeBatch`.
package struct EvaluatedBatch {
    private(set) var computedIDs: [Int64] = []
    private(set) var skippedIDs: [Int64] = []
    private(set) var skipCounts: [SkipReason.Code: Int] = [:]
    /// Every skipped user's reasons.
    package private(set) var skipReasons: [Int64: [SkipReason]] = [:]
    private var ids = ArrayLiteral()
    private var bmis = ArrayLiteral()
    private var bmrs = ArrayLiteral()
    private var tdees = ArrayLiteral()
    private var dates = ArrayLiteral()
    private var updatedAts = ArrayLiteral()
    private var cleared = ArrayLiteral()
    private var skipsJSON = "["

    /// Validates and computes every user of `rows` with `formula`.
    package init(_ rows: [UserRow], formula: MetricsFormula) {
        for row in rows {
            switch formula.evaluate(
                row.settings, on: row.localDate, timezoneKnown: row.timezoneKnown, timezone: row.timezone)
            {
            case .computed(let metrics):
                self.computedIDs.append(row.id)
                self.ids.append(String(row.id))
                self.bmis.append(metrics.bmi.description)
                self.bmrs.append(String(metrics.bmr))
                self.tdees.append(String(metrics.tdee))
                self.dates.append(row.localDate.description)
                self.updatedAts.append(row.settingsUpdatedAt.map { "\"\($0)\"" } ?? "NULL")
                if row.hadSkip { self.cleared.append(String(row.id)) }
            case .skipped(let reasons):
                self.skippedIDs.append(row.id)
                self.skipReasons[row.id] = reasons
                for reason in reasons { self.skipCounts[reason.code, default: 0] += 1 }
                if self.skipsJSON.count > 1 { self.skipsJSON += "," }
                self.skipsJSON += "{\"u\":\(row.id),\"c\":"
                self.skipsJSON += JSONText.string(reasons.map(\.code.rawValue).joined(separator: ","))
                self.skipsJSON += ",\"r\":" + JSONText.string(reasons.map(\.description).joined(separator: "; "))
                self.skipsJSON += ",\"d\":\"\(row.localDate)\"}"
            }
        }
        self.skipsJSON += "]"
    }

    /// `$9`…`$14`, `$16`, `$17` of `SQL.writeBatch`.
    var metricsParameters: [String?] {
        [self.ids.text, self.bmis.text, self.bmrs.text, self.tdees.text, self.dates.text, self.updatedAts.text]
    }
    var skipsParameter: String { self.skipsJSON }
    var clearedParameter: String { self.cleared.text }
}

/// Builds a PostgreSQL array literal (`{1,2,3}`) from elements that need no escaping, or are quoted already.
struct ArrayLiteral {
    private var body = ""
    mutating func append(_ element: String) {
        if !self.body.isEmpty { self.body += "," }
        self.body += element
    }
    var text: String { "{" + self.body + "}" }
}

/// JSON string escaping for the few values metricsd writes by hand (skip reasons in a batch).
enum JSONText {
    static func string(_ value: String) -> String {
        var result = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result + "\""
    }
}
