import Logging
import MetricsdMasking

/// Keeps secrets out of every log format: the one redaction step all of metricsd's log handlers apply.
///
/// - A metadata key that names a secret gets the value `[redacted]`, at any nesting depth. A key names a secret
///   when its name contains (case-insensitively) `token`, `secret`, `password`, `authorization`, `credential`,
///   `jwt` or `cookie` — unless only an earlier part of a dotted key does and its last part names a property that
///   is never secret (``describingKeyParts``: `metricsd.jwt.algorithms` is the list of accepted algorithms, not a
///   JWT).
/// - In the message and in every other value, `Bearer <x>` becomes `Bearer [redacted]`, anything that looks like
///   a JWT (three base64url segments separated by dots, the first starting with `eyJ`) becomes `[redacted-jwt]`,
///   and the connection-string rules of ``SecretPatterns`` apply (the password of `scheme://user:password@host`,
///   the value of `password=…`, `…SECRET=…`, `…TOKEN=…` become `***`): the same rule that masks libpq's messages
///   where they are made, here as a backstop.
public enum LogRedaction {
    /// The value that replaces a sensitive metadata value or a bearer credential.
    public static let redacted = "[redacted]"

    /// The text that replaces a JWT found in free text.
    public static let redactedJWT = "[redacted-jwt]"

    /// Parts of a metadata key that make its value secret.
    public static let sensitiveKeyParts = [
        "token", "secret", "password", "authorization", "credential", "jwt", "cookie",
    ]

    /// Last parts of a dotted key that describe a secret without holding it (`metricsd.jwt.algorithms`,
    /// `metricsd.admin_token.source`): such a key is sensitive only when its last part itself names a secret.
    public static let describingKeyParts = [
        "algorithm", "algorithms", "source", "sources", "kind", "count", "length", "file", "path", "issuer", "audience",
    ]

    /// A record's message and metadata with secrets removed.
    public static func redact(message: String, metadata: Logger.Metadata) -> (
        message: String, metadata: Logger.Metadata
    ) {
        (self.scrub(message), self.redact(metadata))
    }

    /// `metadata` with sensitive keys' values replaced and every remaining value scrubbed.
    public static func redact(_ metadata: Logger.Metadata) -> Logger.Metadata {
        var result = Logger.Metadata(minimumCapacity: metadata.count)
        for (key, value) in metadata {
            result[key] = self.isSensitiveKey(key) ? .string(self.redacted) : self.redact(value)
        }
        return result
    }

    /// Whether values under `key` must never be logged. (ASCII case folding over the key's bytes: this runs for
    /// every metadata key of every record, so it allocates nothing.)
    public static func isSensitiveKey(_ key: String) -> Bool {
        var key = key
        return key.withUTF8 { bytes in
            guard Self.containsSensitivePart(bytes[...]) else { return false }
            guard let dot = bytes.lastIndex(of: UInt8(ascii: ".")) else { return true }
            let last = bytes[(dot + 1)...]
            if Self.containsSensitivePart(last) { return true }
            return !Self.describingKeyBytes.contains { part in
                part.count == last.count && zip(part, last).allSatisfy { $0 == $1 | 0x20 }
            }
        }
    }

    private static func containsSensitivePart(_ bytes: Slice<UnsafeBufferPointer<UInt8>>) -> Bool {
        Self.sensitiveKeyBytes.contains { part in
            guard bytes.count >= part.count else { return false }
            return (bytes.startIndex...(bytes.endIndex - part.count)).contains { start in
                part.indices.allSatisfy { bytes[start + $0] | 0x20 == part[$0] }
            }
        }
    }

    private static let sensitiveKeyBytes = sensitiveKeyParts.map { Array($0.utf8) }
    private static let describingKeyBytes = describingKeyParts.map { Array($0.utf8) }

    /// `text` with bearer credentials, JWTs and connection-string secrets replaced.
    public static func scrub(_ text: String) -> String {
        var text = text
        // Most values hold no secret: looked at in place, copied only when one may be there.
        let (credential, pattern) = text.withUTF8 { (Self.mayContainSecret($0), SecretPatterns.mayContainSecret($0)) }
        if pattern { text = SecretPatterns.apply(text) }
        guard credential else { return text }
        let bytes = Array(text.utf8)
        var output = [UInt8]()
        output.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            if let end = Self.bearerCredentialEnd(bytes, at: index) {
                let credentialStart = Self.bearerCredentialStart(bytes, at: index)
                output.append(contentsOf: bytes[index..<credentialStart])
                output.append(contentsOf: self.redacted.utf8)
                index = end
            } else if let end = Self.jwtEnd(bytes, at: index) {
                output.append(contentsOf: self.redactedJWT.utf8)
                index = end
            } else {
                output.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: output, as: UTF8.self)
    }

    // MARK: - Values

    private static func redact(_ value: Logger.MetadataValue) -> Logger.MetadataValue {
        switch value {
        case .string(let string):
            return .string(self.scrub(string))
        case .stringConvertible(let convertible):
            return .string(self.scrub(convertible.description))
        case .array(let values):
            return .array(values.map { self.redact($0) })
        case .dictionary(let dictionary):
            return .dictionary(self.redact(dictionary))
        }
    }

    // MARK: - Scanning

    /// A cheap pre-check: a JWT contains `eyJ`, a bearer credential the letters of "bearer".
    private static func mayContainSecret(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        for index in bytes.indices where bytes[index] | 0x20 == UInt8(ascii: "b") || bytes[index] == UInt8(ascii: "e") {
            if Self.matches(bytes, at: index, "bearer", caseInsensitive: true) || Self.matches(bytes, at: index, "eyJ")
            {
                return true
            }
        }
        return false
    }

    /// Where the credential after `Bearer` + blanks starts (the caller checked that there is one).
    private static func bearerCredentialStart(_ bytes: [UInt8], at index: Int) -> Int {
        var position = index + 6
        while position < bytes.count, Self.isBlank(bytes[position]) {
            position += 1
        }
        return position
    }

    /// The end of `Bearer <credential>` starting at `index`, or `nil` when there is none there.
    private static func bearerCredentialEnd(_ bytes: [UInt8], at index: Int) -> Int? {
        guard index == 0 || !Self.isAlphanumeric(bytes[index - 1]),
            Self.matches(bytes, at: index, "bearer", caseInsensitive: true)
        else { return nil }
        var position = index + 6
        guard position < bytes.count, Self.isBlank(bytes[position]) else { return nil }
        position = Self.bearerCredentialStart(bytes, at: index)
        let start = position
        while position < bytes.count, !Self.endsCredential(bytes[position]) {
            position += 1
        }
        return position > start ? position : nil
    }

    /// The end of a JWT starting at `index`, or `nil` when there is none there.
    private static func jwtEnd(_ bytes: [UInt8], at index: Int) -> Int? {
        guard index == 0 || !Self.isBase64URL(bytes[index - 1]), Self.matches(bytes, at: index, "eyJ") else {
            return nil
        }
        let header = Self.base64URLRun(bytes, from: index)
        guard header - index >= 4, header < bytes.count, bytes[header] == UInt8(ascii: ".") else { return nil }
        let payload = Self.base64URLRun(bytes, from: header + 1)
        guard payload > header + 1, payload < bytes.count, bytes[payload] == UInt8(ascii: ".") else { return nil }
        return Self.base64URLRun(bytes, from: payload + 1)  // the signature may be empty (alg "none")
    }

    private static func base64URLRun(_ bytes: [UInt8], from start: Int) -> Int {
        var position = start
        while position < bytes.count, Self.isBase64URL(bytes[position]) {
            position += 1
        }
        return position
    }

    private static func matches<Bytes: RandomAccessCollection<UInt8>>(
        _ bytes: Bytes, at index: Int, _ word: StaticString, caseInsensitive: Bool = false
    ) -> Bool where Bytes.Index == Int {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { return false }
        return word.withUTF8Buffer { expected in
            for offset in 0..<count {
                let actual = bytes[index + offset]
                let wanted = expected[offset]
                if caseInsensitive ? (actual | 0x20) != (wanted | 0x20) : actual != wanted {
                    return false
                }
            }
            return true
        }
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
    }

    private static func isBase64URL(_ byte: UInt8) -> Bool {
        Self.isAlphanumeric(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
    }

    private static func isBlank(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t")
    }

    /// Characters that end a bearer credential: whitespace and the delimiters around it in headers, JSON or text.
    private static func endsCredential(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\""),
            UInt8(ascii: "'"), UInt8(ascii: ","), UInt8(ascii: ";"), UInt8(ascii: ")"), UInt8(ascii: "]"),
            UInt8(ascii: "}"), UInt8(ascii: ">"):
            return true
        default:
            return false
        }
    }
}
