import HealthMetrics

/// Writes JSON by hand, in the order the contract documents and with `null` written out (a synthesized
/// `Encodable` would drop nil keys, and the contract wants `"acknowledgement": null`). Also cheaper than
/// `JSONEncoder` on the hot path.
package struct JSONWriter {
    private(set) var text = ""

    init(capacity: Int = 256) {
        self.text.reserveCapacity(capacity)
    }

    /// A JSON value.
    package enum Value {
        case string(String)
        case int(Int64)
        case double(Double)
        case bool(Bool)
        case null
        case timestamp(Timestamp)
        /// Already-encoded JSON.
        case raw(String)
    }

    /// Writes `{"k": v, …}` with the pairs in order.
    package static func object(_ pairs: KeyValuePairs<String, Value>) -> String {
        var writer = JSONWriter()
        writer.writeObject(pairs)
        return writer.text
    }

    static func object(_ pairs: [(String, Value)]) -> String {
        var writer = JSONWriter()
        writer.text += "{"
        for (index, (key, value)) in pairs.enumerated() {
            if index > 0 { writer.text += "," }
            writer.writeString(key)
            writer.text += ":"
            writer.write(value)
        }
        writer.text += "}"
        return writer.text
    }

    /// Writes `[v, …]`.
    package static func array(_ values: [Value]) -> String {
        var writer = JSONWriter()
        writer.text += "["
        for (index, value) in values.enumerated() {
            if index > 0 { writer.text += "," }
            writer.write(value)
        }
        writer.text += "]"
        return writer.text
    }

    mutating func writeObject(_ pairs: KeyValuePairs<String, Value>) {
        self.text += "{"
        var first = true
        for (key, value) in pairs {
            if !first { self.text += "," }
            first = false
            self.writeString(key)
            self.text += ":"
            self.write(value)
        }
        self.text += "}"
    }

    mutating func write(_ value: Value) {
        switch value {
        case .string(let string): self.writeString(string)
        case .int(let int): self.text += String(int)
        case .double(let double):
            if double.isFinite {
                self.text += double == double.rounded() && abs(double) < 1e15 ? String(Int64(double)) : String(double)
            } else {
                self.text += "null"
            }
        case .bool(let bool): self.text += bool ? "true" : "false"
        case .null: self.text += "null"
        case .timestamp(let timestamp): self.text += "\"" + timestamp.iso8601 + "\""
        case .raw(let raw): self.text += raw
        }
    }

    /// Appends already-encoded JSON.
    mutating func raw(_ json: String) {
        self.text += json
    }

    /// Whether `string` holds a byte JSON needs escaped: a control character, `"`, `\\`, or U+2028/U+2029
    /// (E2 80 A8/A9 in UTF-8), which JavaScript does not accept raw in a string literal.
    static func needsEscaping(_ string: String) -> Bool {
        var string = string
        return string.withUTF8 { bytes in
            var index = 0
            while index < bytes.count {
                let byte = bytes[index]
                if byte < 0x20 || byte == 0x22 || byte == 0x5C { return true }
                if byte == 0xE2, index + 2 < bytes.count, bytes[index + 1] == 0x80,
                    bytes[index + 2] == 0xA8 || bytes[index + 2] == 0xA9
                {
                    return true
                }
                index += 1
            }
            return false
        }
    }

    mutating func writeString(_ string: String) {
        self.text += "\""
        // Fast path: nothing to escape (no control character, quote, backslash, U+2028 or U+2029), so the string
        // goes in whole.
        if !Self.needsEscaping(string) {
            self.text += string
            self.text += "\""
            return
        }
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": self.text += "\\\""
            case "\\": self.text += "\\\\"
            case "\n": self.text += "\\n"
            case "\r": self.text += "\\r"
            case "\t": self.text += "\\t"
            default:
                if scalar.value < 0x20 || scalar.value == 0x2028 || scalar.value == 0x2029 {
                    let hex = String(scalar.value, radix: 16)
                    self.text += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    self.text.unicodeScalars.append(scalar)
                }
            }
        }
        self.text += "\""
    }
}
