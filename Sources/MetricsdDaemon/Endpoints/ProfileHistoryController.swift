import HTTPTypes
import HealthMetrics
import MetricsdHTTP
import NIOCore

/// `GET /v1/profile/metrics/history`: the token's user's metrics, one entry per local date of a range.
struct ProfileHistoryController {
    let store: any MetricsHistoryStore
    let formula: MetricsFormula

    var endpoints: [Endpoint] {
        [Endpoint(.get, "/v1/profile/metrics/history", access: .user, caching: .personal, .async(self.history))]
    }

    @Sendable func history(_ request: EndpointRequest) async throws -> Reply {
        let userID = try request.user()
        let query = try self.parseQuery(request.queryParameters())
        switch try await self.store.history(userID: userID, query: query) {
        case .page(let page):
            return Reply(body: Self.body(page, version: query.version))
        case .unknownUser:
            throw ProfileMetricsController.noMetrics(userID: userID, .unknownUser)
        case .invalidSettings(let reasons):
            throw AppError(.notFound, .settingsInvalid, "no metrics: " + reasons)
        case .badRange(let from, let to):
            throw AppError.badRequest(
                .invalidParameter,
                "from (\(from)) must not be after to (\(to)), and the range may span at most \(HistoryQuery.maxSpanDays) days"
            )
        case .cursorOutsideRange:
            throw AppError.badRequest(
                .invalidParameter, "cursor does not belong to this range: send the same from, to and version with it")
        }
    }

    /// `from`, `to` (`YYYY-MM-DD`), `version`, `limit` and `cursor`, each at most once; other names are ignored.
    func parseQuery(_ parameters: [(name: String, value: String)]) throws(AppError) -> HistoryQuery {
        var values: [String: String] = [:]
        for (name, value) in parameters where ["from", "to", "version", "limit", "cursor"].contains(name) {
            guard values.updateValue(value, forKey: name) == nil else {
                throw AppError.badRequest(.invalidParameter, "\(name) is given more than once")
            }
        }
        var query = HistoryQuery(
            from: nil, to: nil, version: self.formula.version, resumeAt: nil, limit: HistoryQuery.defaultLimit)
        for name in ["from", "to"] {
            guard let text = values[name] else { continue }
            guard let date = LocalDate(iso: text) else {
                throw AppError.badRequest(.invalidParameter, "\(name) must be a date such as 2025-10-29")
            }
            if name == "from" { query.from = date } else { query.to = date }
        }
        if let text = values["version"] {
            guard let version = Int(text), self.formula.knownVersions.contains(version) else {
                throw AppError.badRequest(
                    .invalidParameter,
                    "version must be a formula version (\(self.formula.knownVersions.lowerBound)–\(self.formula.knownVersions.upperBound))"
                )
            }
            query.version = version
        }
        if let text = values["limit"] {
            guard let limit = Int(text), (1...HistoryQuery.maxLimit).contains(limit) else {
                throw AppError.badRequest(
                    .invalidParameter, "limit must be an integer from 1 to \(HistoryQuery.maxLimit)")
            }
            query.limit = limit
        }
        if let text = values["cursor"] {
            guard let date = Self.cursorDate(text) else {
                throw AppError.badRequest(.invalidParameter, "cursor must be the nextCursor of a previous page")
            }
            query.resumeAt = date
        }
        return query
    }

    /// A page's cursor: the first date of the next page, as `c` and its eight digits (opaque to clients).
    static func cursor(_ date: LocalDate) -> String {
        "c" + date.description.filter { $0 != "-" }
    }

    static func cursorDate(_ text: String) -> LocalDate? {
        let bytes = Array(text.utf8)
        guard bytes.count == 9, bytes[0] == UInt8(ascii: "c"), bytes.dropFirst().allSatisfy({ $0 >= 48 && $0 <= 57 })
        else {
            return nil
        }
        let digits = text.dropFirst()
        return LocalDate(iso: "\(digits.prefix(4))-\(digits.dropFirst(4).prefix(2))-\(digits.suffix(2))")
    }

    /// The page as JSON, written straight into the reply's bytes, oldest date first.
    static func body(_ page: HistoryPage, version: Int) -> ByteBuffer {
        var body = BodySink(ByteBufferAllocator().buffer(capacity: 160 + 150 * page.entries.count))
        body.write(#"{"success":true,"data":{"from":""#)
        body.write(page.from.description)
        body.write(#"","to":""#)
        body.write(page.to.description)
        body.write(#"","version":"#)
        body.write(decimal: Int64(version))
        body.write(#","entries":["#)
        for (index, entry) in page.entries.enumerated() {
            if index > 0 { body.write(",") }
            Self.write(entry, into: &body)
        }
        body.write("],\"nextCursor\":")
        if let next = page.next {
            body.write("\"")
            body.write(Self.cursor(next))
            body.write("\"}}\n")
        } else {
            body.write("null}}\n")
        }
        return body.buffer
    }

    static func write(_ entry: HistoryEntry, into body: inout BodySink) {
        body.write(#"{"date":""#)
        body.write(entry.date.description)
        body.write(#"","bmi":"#)
        Explanations.writeTenths(entry.metrics.bmiTenths, into: &body)
        body.write(#","bmr":"#)
        body.write(decimal: entry.metrics.bmr)
        body.write(#","tdee":"#)
        body.write(decimal: entry.metrics.tdee)
        body.write(#","computedAt":""#)
        body.write(timestamp: entry.computedAt)
        if let acknowledgedAt = entry.acknowledgedAt {
            body.write(#"","acknowledged":true,"acknowledgedAt":""#)
            body.write(timestamp: acknowledgedAt)
            body.write("\"}")
        } else {
            body.write(#"","acknowledged":false,"acknowledgedAt":null}"#)
        }
    }
}
