import HTTPTypes
import HealthMetrics
import Logging
import MetricsdHTTP
import MetricsdPostgres
import NIOCore

/// `GET /v1/profile/metrics/export`: everything metricsd holds about the token's user — every metrics row of every
/// formula version, the settings as they are now, the verdict on them, the acknowledgement — as JSON (default),
/// CSV or a FHIR R4 Bundle, streamed a page of rows at a time.
struct ProfileExportController {
    let store: any MetricsExportStore
    let gate: ExportGate

    /// Rows read and written per page: what one export holds in memory at a time.
    static let pageSize = 250

    var endpoints: [Endpoint] {
        [Endpoint(.get, "/v1/profile/metrics/export", access: .user, caching: .noStore, .async(self.export))]
    }

    @Sendable func export(_ request: EndpointRequest) async throws -> Reply {
        let userID = try request.user()
        let format = try ExportFormat(accept: request.header("Accept"))
        let ticket = try self.gate.enter(userID: userID)
        guard let profile = try await self.store.exportProfile(userID: userID) else {
            throw ProfileMetricsController.noMetrics(userID: userID, .unknownUser)
        }
        let store = self.store
        let logger = request.logger
        return Reply.streamed(
            contentType: format.contentType,
            headers: [.contentDisposition: "attachment; filename=\"metrics-\(userID).\(format.fileExtension)\""],
            BodyStream { writer in
                withExtendedLifetime(ticket) {}
                let rows = Counter()
                do {
                    try await Self.stream(format: format, profile: profile, store: store, rows: rows, to: writer)
                } catch let error as PostgresError {
                    logger.error(
                        "Export failed part-way",
                        metadata: [
                            "metricsd.export.rows": "\(rows.value)", "metricsd.export.format": "\(format)",
                            "metricsd.error.code": "\(error.code)",
                        ])
                    throw error
                } catch {
                    // A write failed: the client went away, or took nothing for the write timeout (the connection's
                    // write deadline closed it). What was read is dropped with the task; no connection is held.
                    logger.notice(
                        "Export cut off: the client stopped taking it",
                        metadata: ["metricsd.export.rows": "\(rows.value)", "metricsd.export.format": "\(format)"])
                    throw error
                }
                logger.info(
                    "Export sent",
                    metadata: ["metricsd.export.rows": "\(rows.value)", "metricsd.export.format": "\(format)"])
                withExtendedLifetime(ticket) {}
            })
    }

    /// Rows written so far, for the log line whatever way the export ends.
    private final class Counter: @unchecked Sendable {  // used by one task at a time
        var value = 0
    }

    /// The body: the opening, a page of rows at a time (each read with its own pooled connection, given back
    /// before the page is written, and written before the next is read), the closing.
    private static func stream(
        format: ExportFormat, profile: ExportProfile, store: any MetricsExportStore, rows: Counter,
        to writer: BodyWriter
    ) async throws {
        try await writer.write(ByteBuffer(string: format.opening(profile)))
        var after: (version: Int, date: LocalDate)?
        var first = true
        while true {
            let page = try await store.exportRows(userID: profile.userID, after: after, limit: Self.pageSize)
            var buffer = ByteBufferAllocator().buffer(capacity: 512 * page.count)
            for entry in page {
                buffer.writeString(format.row(entry, profile: profile, first: first))
                first = false
            }
            try await writer.write(buffer)
            rows.value += page.count
            guard page.count == Self.pageSize, let last = page.last else { break }
            after = (last.metrics.version, last.date)
        }
        try await writer.write(ByteBuffer(string: format.closing))
    }
}

/// The export's formats, chosen by `Accept`.
enum ExportFormat: CustomStringConvertible {
    case json, csv, fhir

    /// The first media type of `Accept` the export can send; JSON without one. A 406 naming the three when none
    /// fits (`q` values are not weighed: the types are taken in the order given, as clients list their choice).
    init(accept: String?) throws(AppError) {
        guard let accept, !accept.allSatisfy({ $0 == " " }) else {
            self = .json
            return
        }
        for item in accept.split(separator: ",") {
            let type = String(item.split(separator: ";", maxSplits: 1).first ?? "").filter { $0 != " " && $0 != "\t" }
                .lowercased()
            switch type {
            case "application/fhir+json":
                self = .fhir
                return
            case "text/csv":
                self = .csv
                return
            case "application/json", "application/*", "*/*":
                self = .json
                return
            default: continue
            }
        }
        throw AppError(
            .notAcceptable, .notAcceptable,
            "Accept must name application/json, text/csv or application/fhir+json (or */*)")
    }

    var description: String {
        switch self {
        case .json: "json"
        case .csv: "csv"
        case .fhir: "fhir"
        }
    }

    var contentType: String {
        switch self {
        case .json: "application/json"
        case .csv: "text/csv; charset=utf-8; header=present"
        case .fhir: "application/fhir+json"
        }
    }

    var fileExtension: String {
        switch self {
        case .json: "json"
        case .csv: "csv"
        case .fhir: "fhir.json"
        }
    }

    func opening(_ profile: ExportProfile) -> String {
        switch self {
        case .json: ExportJSON.opening(profile)
        case .csv: "date,version,bmi,bmr,tdee,computed_at,acknowledged_at\r\n"
        case .fhir: ExportFHIR.opening(profile)
        }
    }

    func row(_ entry: HistoryEntry, profile: ExportProfile, first: Bool) -> String {
        switch self {
        case .json: (first ? "" : ",") + ExportJSON.row(entry)
        case .csv: ExportCSV.row(entry)
        case .fhir: ExportFHIR.row(entry, profile: profile)
        }
    }

    var closing: String {
        switch self {
        case .json: "]}}\n"
        case .csv: ""
        case .fhir: "]}\n"
        }
    }
}

/// Numbers as the export writes them.
enum ExportNumber {
    static func bmi(_ entry: HistoryEntry) -> String {
        var sink = StringSink()
        Explanations.writeTenths(entry.metrics.bmiTenths, into: &sink)
        return sink.text
    }

    /// A stored decimal as a JSON number, or nil when it is not a plain decimal (PostgreSQL's numeric also holds
    /// `NaN`, which JSON has no number for).
    static func decimal(_ text: String?) -> String? {
        guard let text, !text.isEmpty, text.utf8.count <= 24 else { return nil }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count <= 2, parts.allSatisfy({ !$0.isEmpty }) else { return nil }
        let integer = parts[0].hasPrefix("-") ? parts[0].dropFirst() : parts[0]
        guard !integer.isEmpty, integer.allSatisfy(\.isASCIIDigit),
            parts.dropFirst().allSatisfy({ $0.allSatisfy(\.isASCIIDigit) })
        else { return nil }
        return text
    }
}

struct StringSink: TextSink {
    var text = ""
    mutating func write(_ text: StaticString) { self.text += text.description }
    mutating func write(decimal value: Int64) { self.text += String(value) }
    mutating func write(_ text: String) { self.text += text }
}

extension Character {
    var isASCIIDigit: Bool { self >= "0" && self <= "9" }
}

enum ExportCSV {
    /// RFC 4180: comma-separated, CRLF-ended; no field needs quoting (dates, numbers and instants only).
    static func row(_ entry: HistoryEntry) -> String {
        "\(entry.date),\(entry.metrics.version),\(ExportNumber.bmi(entry)),\(entry.metrics.bmr),\(entry.metrics.tdee),"
            + "\(entry.computedAt.iso8601),\(entry.acknowledgedAt?.iso8601 ?? "")\r\n"
    }
}

enum ExportJSON {
    static func opening(_ profile: ExportProfile) -> String {
        func string(_ value: String?) -> String { value.map(JSONWriter.quoted) ?? "null" }
        let settings =
            profile.hasSettings
            ? "{\"dateOfBirth\":\(string(profile.dateOfBirth)),\"gender\":\(string(profile.gender)),"
                + "\"weightKg\":\(ExportNumber.decimal(profile.weightKilograms) ?? "null"),"
                + "\"heightCm\":\(ExportNumber.decimal(profile.heightCentimetres) ?? "null"),"
                + "\"activityLevel\":\(string(profile.activityLevel)),\"onboardingCompleted\":\(profile.onboardingCompleted),"
                + "\"updatedAt\":\(string(profile.settingsUpdatedAt?.iso8601))}"
            : "null"
        let acknowledgement =
            profile.acknowledgement.map {
                "{\"version\":\($0.version),\"metricsComputedAt\":\"\($0.computedAt.iso8601)\",\"acknowledgedAt\":\"\($0.acknowledgedAt.iso8601)\"}"
            } ?? "null"
        return
            "{\"success\":true,\"data\":{\"userId\":\(profile.userID),\"timezone\":\(JSONWriter.quoted(profile.timezone)),"
            + "\"settings\":\(settings),\"settingsProblems\":\(string(profile.invalidSettings)),"
            + "\"acknowledgement\":\(acknowledgement),\"metrics\":["
    }

    static func row(_ entry: HistoryEntry) -> String {
        "{\"date\":\"\(entry.date)\",\"version\":\(entry.metrics.version),\"bmi\":\(ExportNumber.bmi(entry)),"
            + "\"bmr\":\(entry.metrics.bmr),\"tdee\":\(entry.metrics.tdee),\"computedAt\":\"\(entry.computedAt.iso8601)\","
            + "\"acknowledgedAt\":\(entry.acknowledgedAt.map { "\"\($0.iso8601)\"" } ?? "null")}"
    }
}
