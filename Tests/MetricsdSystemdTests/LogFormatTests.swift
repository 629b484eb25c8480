import Foundation
import Logging
import MetricsdSystemd
import Testing

@Suite struct LogFormatTests {
    /// 2025-10-29T14:30:45.123Z.
    static let time: Int64 = 1_761_748_245_123

    static let record = LogRecord(
        millisecondsSinceEpoch: Self.time,
        level: .warning,
        label: "metricsd",
        message: "Daily unit done",
        metadata: ["metricsd.zone": "Asia/Kathmandu", "metricsd.users.computed": "412"]
    )

    @Test func textLine() {
        #expect(
            TextLines.format(Self.record)
                == "2025-10-29T14:30:45.123Z warning metricsd: Daily unit done metricsd.users.computed=412 metricsd.zone=Asia/Kathmandu"
        )
    }

    @Test func textQuotesValuesWithBlanksQuotesOrNothing() {
        let record = LogRecord(
            millisecondsSinceEpoch: 0,
            level: .info,
            label: "metricsd",
            message: "two\nlines",
            metadata: [
                "a": "two words", "b": "say \"hi\"", "c": "", "d": "k=v", "e": "tab\there", "f": "back\\slash",
                "g": "ünïcode", "h": ["x", "y"],
            ]
        )
        #expect(
            TextLines.format(record)
                == #"1970-01-01T00:00:00.000Z info metricsd: two\nlines a="two words" b="say \"hi\"" c="" d="k=v" e="tab\there" f=back\slash g=ünïcode h="[\"x\", \"y\"]""#
        )
    }

    @Test func jsonLine() {
        #expect(
            JSONLines.format(Self.record)
                == #"{"time":"2025-10-29T14:30:45.123Z","level":"warning","label":"metricsd","message":"Daily unit done","metricsd.users.computed":"412","metricsd.zone":"Asia/Kathmandu"}"#
        )
    }

    @Test func jsonEscapesEverythingAndStaysValid() throws {
        let nasty = "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} del \u{7F} ünï 日本 🙂 \u{2028}"
        let record = LogRecord(
            millisecondsSinceEpoch: Self.time,
            level: .critical,
            label: "metricsd \"x\"",
            message: nasty,
            metadata: [nasty: .string(nasty), "message": "shadow", "nested": ["k": ["v"]]]
        )
        let line = JSONLines.format(record)
        #expect(!line.contains("\n"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String])
        #expect(object["time"] == "2025-10-29T14:30:45.123Z")
        #expect(object["level"] == "critical")
        #expect(object["label"] == "metricsd \"x\"")
        #expect(object["message"] == nasty)
        #expect(object[nasty] == nasty)
        #expect(object["metadata.message"] == "shadow")
        #expect(object["nested"] == #"["k": ["v"]]"#)
        #expect(object.count == 7)
    }

    @Test func jsonDecodesWithJSONDecoder() throws {
        struct Line: Decodable, Equatable {
            var time: String
            var level: String
            var label: String
            var message: String
        }
        let line = try JSONDecoder().decode(Line.self, from: Data(JSONLines.format(Self.record).utf8))
        #expect(
            line
                == Line(
                    time: "2025-10-29T14:30:45.123Z", level: "warning", label: "metricsd", message: "Daily unit done"))
    }

    @Test(arguments: [
        (Int64(0), "1970-01-01T00:00:00.000Z"),
        (1, "1970-01-01T00:00:00.001Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        (4_102_444_799_999, "2099-12-31T23:59:59.999Z"),
    ])
    func timestamps(milliseconds: Int64, expected: String) {
        #expect(LogRecord.iso8601(millisecondsSinceEpoch: milliseconds) == expected)
    }
}
