import Logging
import MetricsdSystemd
import Testing

@Suite struct JournalFieldsTests {
    @Test(arguments: [
        ("metricsd.user.id", "USER_ID"),
        ("metricsd.zone", "ZONE"),
        ("metricsd.job.id", "JOB_ID"),
        ("metricsd.users.computed", "USERS_COMPUTED"),
        ("hb.request.id", "HB_REQUEST_ID"),
        ("error.message", "ERROR_MESSAGE"),
        ("Metricsd.Skip-Reason", "SKIP_REASON"),
        ("_private", "PRIVATE"),
        ("metricsd._x", "X"),
        ("2fa.state", "F_2FA_STATE"),
        ("...", "F_"),
        ("", "F_"),
        ("zöne", "Z_NE"),
        ("metricsd.message", "METRICSD_MESSAGE"),
        ("priority", "METRICSD_PRIORITY"),
        ("code.file", "METRICSD_CODE_FILE"),
        ("syslog.identifier", "METRICSD_SYSLOG_IDENTIFIER"),
    ])
    func fieldName(key: String, expected: String) {
        #expect(JournalFields.fieldName(forMetadataKey: key) == expected)
    }

    @Test func fieldNamesAreCappedAtSixtyFourCharacters() {
        let name = JournalFields.fieldName(forMetadataKey: String(repeating: "abc.", count: 40))
        #expect(name.count == 64)
        #expect(name.hasPrefix("ABC_ABC_"))
    }

    @Test(arguments: [
        (Logger.Level.trace, 7), (.debug, 7), (.info, 6), (.notice, 5), (.warning, 4), (.error, 3), (.critical, 2),
    ])
    func priority(level: Logger.Level, expected: Int) {
        #expect(JournalFields.priority(for: level) == expected)
    }

    @Test func recordBecomesTheseFields() {
        let fields = JournalFields.make(
            level: .warning,
            message: "Daily unit done",
            metadata: ["metricsd.zone": "Asia/Kathmandu", "metricsd.users.computed": "412", "hb.request.id": "7f"],
            source: "MetricsdApp",
            file: "MetricsdApp/DailyScheduler.swift",
            function: "run()",
            line: 42
        )
        #expect(
            fields.map { $0.name } == [
                "MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "CODE_FILE", "CODE_LINE", "CODE_FUNC", "CODE_MODULE",
                "HB_REQUEST_ID", "USERS_COMPUTED", "ZONE",
            ])
        #expect(
            fields.map { $0.value } == [
                "Daily unit done", "4", "metricsd", "MetricsdApp/DailyScheduler.swift", "42", "run()", "MetricsdApp",
                "7f", "412", "Asia/Kathmandu",
            ])
    }

    @Test func everyFieldNameIsValidForTheJournal() {
        let fields = JournalFields.make(
            level: .info, message: "m", metadata: ["a-b": "1", "ä": "2", "9": "3", "x.y.z": ["k": "v"]],
            source: "", file: "f", function: "g", line: 1
        )
        for field in fields {
            #expect(!field.name.isEmpty && field.name.count <= 64)
            #expect(
                field.name.unicodeScalars.allSatisfy {
                    ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "_"
                })
            #expect(!field.name.hasPrefix("_") && !field.name.first!.isNumber)
        }
        #expect(!fields.contains { $0.name == "CODE_MODULE" })
    }

    @Test func journalFieldsAreRedacted() {
        let jwt = LogRedactionTests.jwt
        let fields = JournalFields.make(
            level: .error,
            message: "Rejected token \(jwt) from client",
            metadata: [
                "metricsd.admin.token": "s3cr3t-admin", "hb.request.header": "Bearer abc.def", "metricsd.user.id": "7",
            ],
            source: "App", file: "f", function: "g", line: 1
        )
        let text = fields.map { "\($0.name)=\($0.value)" }.joined(separator: "\n")
        #expect(!text.contains(jwt) && !text.contains("s3cr3t-admin") && !text.contains("abc.def"))
        #expect(fields.first { $0.name == "MESSAGE" }?.value == "Rejected token [redacted-jwt] from client")
        #expect(fields.first { $0.name == "ADMIN_TOKEN" }?.value == "[redacted]")
        #expect(fields.first { $0.name == "HB_REQUEST_HEADER" }?.value == "Bearer [redacted]")
        #expect(fields.first { $0.name == "USER_ID" }?.value == "7")
    }
}
