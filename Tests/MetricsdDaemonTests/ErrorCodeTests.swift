import Foundation
import HealthMetrics
import Logging
import MetricsdCLI
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdSystemd
import Testing

/// The error codes are one vocabulary: well formed, each failure's code unique to it, every one listed for operators
/// in the Operations article (and nothing listed there that does not exist), every one an API reply can carry
/// listed in the API document under its status, and the journal field the article names is the one the log writes.
@Suite struct ErrorCodeTests {
    /// Every code, from each failure type's cases.
    static let all: [String] =
        PostgresError.Code.all.map(\.errorCode) + MigrationError.Kind.allCases.map(\.rawValue)
        + StartupError.Kind.allCases.map(\.rawValue) + ConfigurationError.Kind.allCases.map(\.rawValue)
        + [TokenKeyError.noKey(""), .unusablePublicKey("")].map(\.errorCode)
        + TokenError.Reason.allCases.map(\.rawValue)
        + (AppError.Code.httpCodes + AppError.Code.endpointCodes).map(\.rawValue) + OperatorSession.Failure.commandCodes

    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func everyCodeIsDottedSnakeCase() {
        for code in Set(Self.all) {
            #expect(code.wholeMatch(of: /[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+/) != nil, "\(code)")
        }
    }

    /// A code names one failure: within one type no two cases share a code (types may share a code for the same
    /// failure, e.g. `migration.changed` at start-up and from `metricsd migrate`).
    @Test func noTwoCasesOfOneTypeShareACode() {
        for codes in [
            MigrationError.Kind.allCases.map(\.rawValue), StartupError.Kind.allCases.map(\.rawValue),
            ConfigurationError.Kind.allCases.map(\.rawValue), TokenError.Reason.allCases.map(\.rawValue),
            PostgresError.Code.all.map(\.errorCode),
            (AppError.Code.httpCodes + AppError.Code.endpointCodes).map(\.rawValue),
        ] {
            #expect(Set(codes).count == codes.count, "\(codes)")
        }
    }

    /// The API's codes are `static let`s of `AppError.Code`, gathered by hand into `httpCodes` and `endpointCodes`
    /// (which the checks here and the API document's check read): every code declared in the sources is in one of
    /// those lists, so a new code cannot escape them.
    @Test func everyDeclaredAPICodeIsInItsList() throws {
        var declared: [String] = []
        let sources = Self.repository.appending(path: "Sources")
        let files = try #require(FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil))
        for case let file as URL in files where file.pathExtension == "swift" {
            let text = try String(contentsOf: file, encoding: .utf8)
            declared += text.matches(of: /static let [A-Za-z0-9_]+ = Self\(rawValue: "([a-z0-9_.]+)"\)/).map {
                String($0.1)
            }
        }
        #expect(declared.count >= 20, "found only \(declared)")
        let listed = Set((AppError.Code.httpCodes + AppError.Code.endpointCodes).map(\.rawValue))
        #expect(
            Set(declared).subtracting(listed).isEmpty,
            "declared but in no list: \(Set(declared).subtracting(listed).sorted())")
    }

    /// The Operations article's table of error codes lists exactly the codes there are.
    @Test func theOperationsArticleListsEveryCode() throws {
        let article = try String(
            contentsOf: Self.repository.appending(path: "Sources/MetricsdDaemon/Documentation.docc/Operations.md"),
            encoding: .utf8)
        let start = try #require(article.range(of: "### Error codes\n"))
        let section = article[start.upperBound...]
        let end = section.range(of: "\n### ")?.lowerBound ?? section.endIndex
        let listed = section[..<end].split(separator: "\n").compactMap { line in
            line.firstMatch(of: /^\| `([a-z0-9_.]+)` \|/).map { String($0.1) }
        }
        #expect(Set(listed).count == listed.count, "a code is listed twice")
        #expect(
            Set(listed) == Set(Self.all),
            "missing: \(Set(Self.all).subtracting(listed)), unknown: \(Set(listed).subtracting(Self.all))")
    }

    /// The API document's error schemas (the `code` enums and consts of `ErrorBody400` … `ErrorBody503`) name exactly
    /// the codes a reply can carry: every API code except `server.connection_closed`, which is never sent.
    @Test func theAPIDocumentListsEveryCodeTheAPISends() throws {
        let document = try String(
            contentsOf: Self.repository.appending(path: "Sources/MetricsdDaemon/Resources/openapi.yaml"),
            encoding: .utf8)
        let start = try #require(document.range(of: "    ErrorBody400:\n"))
        let end = try #require(document.range(of: "\n    Metrics:\n"))
        var documented: [String] = []
        var inEnum = false
        for line in document[start.lowerBound..<end.lowerBound].split(separator: "\n") {
            if let const = line.firstMatch(of: /code: \{const: ([a-z0-9_.]+)\}/) {
                documented.append(String(const.1))
                continue
            }
            if line.contains("enum: [") { inEnum = true }
            guard inEnum else { continue }
            // `code: {enum: [a.b, c.d]}` or `enum: [a.b,` followed by lines of codes up to `]`.
            let values = (line.split(separator: "[", maxSplits: 1).last ?? line).split(whereSeparator: {
                ", ]}".contains($0)
            })
            documented += values.map(String.init).filter {
                $0.wholeMatch(of: /[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+/) != nil
            }
            if line.contains("]") { inEnum = false }
        }
        let sent = Set((AppError.Code.httpCodes + AppError.Code.endpointCodes).map(\.rawValue))
            .subtracting([AppError.Code.connectionClosed.rawValue])
        // 501 and 417 are not part of the contract's operations (no documented operation answers them).
        let undocumentedStatuses: Set<String> = [
            AppError.Code.methodNotImplemented.rawValue, AppError.Code.expectationFailed.rawValue,
        ]
        #expect(
            Set(documented) == sent.subtracting(undocumentedStatuses),
            "missing: \(sent.subtracting(undocumentedStatuses).subtracting(documented)), unknown: \(Set(documented).subtracting(sent))"
        )
    }

    /// The journal field the documentation tells operators to filter on.
    @Test func theLogCarriesTheCodeAsTheJournalFieldERROR_CODE() {
        #expect(JournalFields.fieldName(forMetadataKey: "metricsd.error.code") == "ERROR_CODE")
        let coded: [String: String] = .errorFields(MigrationError(.failed, "boom"))
        #expect(coded == ["metricsd.error": "boom", "metricsd.error.code": "migration.failed"])
        struct Uncoded: Error {}
        let uncoded: [String: String] = .errorFields(Uncoded())
        #expect(uncoded.keys.sorted() == ["metricsd.error"])
        let record = JournalFields.make(
            level: .warning, message: "Request failed",
            metadata: .errorFields("database unavailable", code: "database.pool_timeout"),
            source: "", file: "", function: "", line: 0)
        #expect(record.contains { $0.name == "ERROR_CODE" && $0.value == "database.pool_timeout" }, "\(record)")
    }
}
