import Logging

/// Writes one readable line per record to stderr:
/// `2025-10-29T14:30:45.123Z warning metricsd: Daily unit done metricsd.users.computed=412 metricsd.zone=Asia/Kathmandu`.
///
/// UTC time with milliseconds, level, label, message, then the metadata sorted by key as `key=value`. Values are
/// quoted when they are empty or contain blanks, quotes, `=` or control characters. Secrets are redacted
/// (``LogRedaction``) and each line is written with a single `write(2)`.
public struct TextLines: LogSink {
    public init() {}

    /// Writes the record as one line on stderr.
    public func write(_ record: LogRecord) {
        StandardError.write(Self.format(record) + "\n")
    }

    /// The line for `record`, without the trailing newline.
    public static func format(_ record: LogRecord) -> String {
        var line =
            "\(record.timestamp) \(record.level.rawValue) \(record.label): \(Self.escapeControls(record.message))"
        for field in record.metadata {
            line += " \(field.key)=\(Self.quoteIfNeeded(field.value))"
        }
        return line
    }

    /// The value as is, or in double quotes with `"` and `\` escaped when it is empty or contains blanks,
    /// quotes, `=` or control characters.
    static func quoteIfNeeded(_ value: String) -> String {
        if Self.isPlainASCII(value, allowingBlanks: false) { return value }
        let needsQuotes =
            value.isEmpty
            || value.unicodeScalars.contains { scalar in
                scalar == " " || scalar == "\"" || scalar == "=" || scalar.properties.generalCategory == .control
                    || scalar.properties.isWhitespace
            }
        guard needsQuotes else { return value }
        var quoted = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": quoted += "\\\""
            case "\\": quoted += "\\\\"
            default: quoted += Self.escapeControls(String(scalar))
            }
        }
        return quoted + "\""
    }

    /// Control characters as `\n`, `\r`, `\t` or `\u{…}`, so a record stays on one line.
    static func escapeControls(_ text: String) -> String {
        if Self.isPlainASCII(text, allowingBlanks: true) { return text }
        guard text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else { return text }
        var escaped = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            default:
                if scalar.properties.generalCategory == .control {
                    escaped += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    escaped.unicodeScalars.append(scalar)
                }
            }
        }
        return escaped
    }

    /// Whether `text` is non-empty printable ASCII (blanks only when `allowingBlanks`), with no `"` or `=`
    /// when blanks are not allowed: the common case, told from the bytes without looking at Unicode properties.
    static func isPlainASCII(_ text: String, allowingBlanks: Bool) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            guard !bytes.isEmpty else { return false }
            for byte in bytes {
                guard byte > 0x20 || (allowingBlanks && byte == 0x20), byte < 0x7F else { return false }
                if !allowingBlanks, byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "=") { return false }
            }
            return true
        }
    }
}
