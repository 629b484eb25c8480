import Foundation
import Glibc
import Logging
import Synchronization
import Testing

@testable import MetricsdSystemd

@Suite struct LogSetupTests {
    /// The device and inode of this process's stderr, as systemd would write them into `JOURNAL_STREAM`.
    static func stderrIdentity() -> String {
        var status = stat()
        precondition(fstat(2, &status) == 0)
        return "\(status.st_dev):\(status.st_ino)"
    }

    @Test func journalStreamMatchingStderrMeansJournal() {
        let environment = ["JOURNAL_STREAM": Self.stderrIdentity()]
        #expect(LogSetup.stderrIsJournal(environment: environment))
        #expect(LogSetup.resolvedFormat(nil, environment: environment) == .journal)
        #expect(
            LogSetup.makeHandler(label: "x", format: nil, level: LogLevelBox(.info), environment: environment)
                is JournalLogHandler)
    }

    @Test(arguments: ["8:12345", "0:0", "", "garbage", "8:", ":12", "8:12:13", "-1:-1"])
    func otherJournalStreamsAreNotStderr(value: String) {
        let environment = ["JOURNAL_STREAM": value]
        #expect(!LogSetup.stderrIsJournal(environment: environment))
        #expect(LogSetup.resolvedFormat(nil, environment: environment) == .text)
    }

    @Test func noJournalStreamMeansText() {
        #expect(!LogSetup.stderrIsJournal(environment: [:]))
        #expect(
            LogSetup.makeHandler(label: "x", format: nil, level: LogLevelBox(.info), environment: [:]) is TextLogHandler
        )
    }

    @Test func journalStreamParsing() {
        #expect(LogSetup.journalStream("8:12345", matchesDevice: 8, inode: 12345))
        #expect(!LogSetup.journalStream("8:12345", matchesDevice: 8, inode: 12346))
        #expect(!LogSetup.journalStream("9:12345", matchesDevice: 8, inode: 12345))
    }

    @Test func explicitFormatWins() {
        let journal = ["JOURNAL_STREAM": Self.stderrIdentity()]
        let level = LogLevelBox(.info)
        #expect(LogSetup.makeHandler(label: "x", format: .text, level: level, environment: journal) is TextLogHandler)
        #expect(LogSetup.makeHandler(label: "x", format: .json, level: level, environment: journal) is JSONLogHandler)
        #expect(LogSetup.makeHandler(label: "x", format: .journal, level: level, environment: [:]) is JournalLogHandler)
        #expect(LogFormat(rawValue: "json") == .json && LogFormat(rawValue: "JSON") == nil)
    }

    @Test func oneBoxChangesEveryLoggersLevel() {
        let box = LogLevelBox(.info)
        let text = Logger(label: "a") { LogSetup.makeHandler(label: $0, format: .text, level: box, environment: [:]) }
        var json = Logger(label: "b") { LogSetup.makeHandler(label: $0, format: .json, level: box, environment: [:]) }
        let journal = Logger(label: "c") {
            LogSetup.makeHandler(label: $0, format: .journal, level: box, environment: [:])
        }
        box.level = .debug  // what SIGHUP does
        #expect([text.logLevel, json.logLevel, journal.logLevel] == [.debug, .debug, .debug])
        json.logLevel = .error  // a global override, documented on LogLevelBox
        #expect(box.level == .error && text.logLevel == .error)
    }

    @Test func metadataMergesHandlerThenProviderThenCallThenError() {
        struct Failure: Error, CustomStringConvertible {
            var description: String { "boom" }
        }
        let provider = Logger.MetadataProvider { ["from": "provider", "provider.only": "p"] }
        let sink = RecordingSink()
        var handler = MetricsdLogHandler(
            label: "metricsd", level: LogLevelBox(.info), sink: sink, metadataProvider: provider)
        handler.metadata = ["from": "handler", "handler.only": "h"]
        handler.log(
            event: LogEvent(
                level: .info, message: "m", error: Failure(),
                metadata: ["call.only": "c", "metricsd.token": "t0ps3cret"],
                source: "Tests", file: "f.swift", function: "g()", line: 7))
        let records = sink.records.withLock { $0 }
        #expect(records.count == 1)
        guard let record = records.first else { return }
        #expect(
            record.metadata.map(\.key) == [
                "call.only", "error.message", "error.type", "from", "handler.only", "metricsd.token", "provider.only",
            ])
        #expect(record.metadata.first { $0.key == "from" }?.value == "provider")
        #expect(record.metadata.first { $0.key == "error.message" }?.value == "boom")
        #expect(record.metadata.first { $0.key == "metricsd.token" }?.value == "[redacted]")
        #expect(record.source == "Tests" && record.file == "f.swift" && record.function == "g()" && record.line == 7)
    }

    @Test func handlerMetadataIsAValue() {
        let box = LogLevelBox(.info)
        var first = Logger(label: "a") { TextLogHandler(label: $0, level: box, sink: TextLines()) }
        first[metadataKey: "only-on"] = "first"
        var second = first
        second[metadataKey: "only-on"] = "second"
        #expect(first[metadataKey: "only-on"] == "first")
        #expect(second[metadataKey: "only-on"] == "second")
    }
}

extension ProcessStateTests {
    /// The handlers' real output on file descriptor 2 (redirected into a pipe while each test runs).
    @Suite struct StandardErrorOutputTests {
        @Test func textHandlerWritesOneRedactedLine() {
            let marker = uniqueName("marker")
            let logger = Logger(label: "metricsd") {
                TextLogHandler(label: $0, level: LogLevelBox(.info), sink: TextLines())
            }
            let output = captureStandardError {
                logger.debug("below the level \(marker)")
                logger.info(
                    "Rejected \(LogRedactionTests.jwt) \(marker)", metadata: ["metricsd.admin.token": "t0ps3cret"])
            }
            let lines = output.split(separator: "\n").filter { $0.contains(marker) }
            #expect(lines.count == 1)
            #expect(
                lines.first?.hasSuffix(
                    " info metricsd: Rejected [redacted-jwt] \(marker) metricsd.admin.token=[redacted]") == true)
            #expect(!output.contains("t0ps3cret") && !output.contains(LogRedactionTests.jwt))
        }

        @Test func jsonHandlerWritesOneValidObjectPerLine() throws {
            let marker = uniqueName("marker")
            let box = LogLevelBox(.info)
            let logger = Logger(label: "metricsd") { JSONLogHandler(label: $0, level: box, sink: JSONLines()) }
            let output = captureStandardError {
                logger.info("first \(marker)", metadata: ["metricsd.zone": "UTC"])
                logger.warning("second\nline \(marker)")
            }
            let lines = output.split(separator: "\n").filter { $0.contains(marker) }
            #expect(lines.count == 2)
            for line in lines {
                let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String]
                #expect(object?["label"] == "metricsd")
            }
        }

        @Test func journalHandlerFallsBackToStderrOnlyWithoutAJournal() {
            let marker = uniqueName("marker")
            let logger = Logger(label: "metricsd") {
                JournalLogHandler(label: $0, level: LogLevelBox(.info), sink: JournalEntries())
            }
            let output = captureStandardError {
                logger.notice("journal test \(marker)", metadata: ["metricsd.user.id": "42"])
            }
            let fellBack = output.contains("notice metricsd: journal test \(marker) metricsd.user.id=42")
            let journalRunning = access(JournalEntries.journalSocket, F_OK) == 0
            #expect(fellBack == !journalRunning)
        }
    }
}

/// Keeps what a handler writes.
final class RecordingSink: LogSink {
    let records = Mutex<[LogRecord]>([])
    func write(_ record: LogRecord) { self.records.withLock { $0.append(record) } }
}
