import Logging

/// Writes one JSON object per line to stderr:
/// `{"time":"2025-10-29T14:30:45.123Z","level":"info","label":"metricsd","message":"…","metricsd.zone":"UTC"}`.
///
/// `time`, `level`, `label` and `message` come first, then every metadata key (sorted) with a string value. A
/// metadata key equal to one of the first four is written as `metadata.<key>`. Secrets are redacted
/// (``LogRedaction``) and each line is written with a single `write(2)`.
public struct JSONLines: LogSink {
    public init() {}

    /// Writes the record as one JSON line on stderr.
    public func write(_ record: LogRecord) {
        StandardError.write(Self.format(record) + "\n")
    }

    /// The JSON object for `record`, on one line, without the trailing newline.
    public static func format(_ record: LogRecord) -> String {
        let reserved: Set<String> = ["time", "level", "label", "message"]
        var json = "{\"time\":\(Self.quote(record.timestamp)),\"level\":\(Self.quote(record.level.rawValue))"
        json += ",\"label\":\(Self.quote(record.label)),\"message\":\(Self.quote(record.message))"
        for field in record.metadata {
            let key = reserved.contains(field.key) ? "metadata.\(field.key)" : field.key
            json += ",\(Self.quote(key)):\(Self.quote(field.value))"
        }
        return json + "}"
    }

    /// `text` as a JSON string literal: quotes, backslashes and control characters escaped; other characters,
    /// non-ASCII included, as UTF-8. U+2028 and U+2029 are escaped too, for JavaScript consumers.
    static func quote(_ text: String) -> String {
        var quoted = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": quoted += "\\\""
            case "\\": quoted += "\\\\"
            case "\n": quoted += "\\n"
            case "\r": quoted += "\\r"
            case "\t": quoted += "\\t"
            case "\u{08}": quoted += "\\b"
            case "\u{0C}": quoted += "\\f"
            case "\u{2028}", "\u{2029}": quoted += Self.unicodeEscape(scalar.value)
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    quoted += Self.unicodeEscape(scalar.value)
                } else {
                    quoted.unicodeScalars.append(scalar)
                }
            }
        }
        return quoted + "\""
    }

    private static func unicodeEscape(_ value: UInt32) -> String {
        let hex = String(value, radix: 16)
        return "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }
}
