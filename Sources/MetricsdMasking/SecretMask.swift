/// The one rule that keeps passwords and other secrets out of every text metricsd shows: error messages from libpq
/// and from connection strings, settings lines quoted by `check-config`, `STATUS=`, the log, `/readyz` and API
/// errors.
///
/// Two layers:
/// - **Known secrets.** The passwords metricsd was given (in a connection string's userinfo, `password=` keyword
///   or query parameter, the database password credential, `PGPASSWORD`) are replaced by `***` wherever they
///   appear, whole or in part: libpq quotes *fragments* of a URL it cannot parse (`invalid percent-encoded token:
///   "Wd3%zz…"`, or the part after an unescaped `@` as a host name), so every piece of a password between the
///   characters a URL parser splits at is masked too (pieces of two characters or more). A secret or piece
///   shorter than four characters is masked only where no letter or digit touches it.
/// - **Patterns** (``SecretPatterns``), for text that names a secret metricsd was not told about: the password of
///   `scheme://user:password@host`, and the value of `password=…`, `PGPASSWORD=…`, `…SECRET=…`, `…TOKEN=…`.
///
/// ```swift
/// let mask = SecretMask(connectionString: url, password: credential, environment: environment)
/// throw PostgresError(code: .badConnectionString, message: mask.apply(libpqMessage))
/// ```
public struct SecretMask: Sendable, Equatable {
    /// What a secret becomes.
    public static let placeholder = "***"

    /// Secrets and pieces masked wherever they appear, longest first.
    private var anywhere: [[UInt8]] = []
    /// Short secrets and pieces masked only where no letter or digit touches them.
    private var standalone: [[UInt8]] = []

    /// A mask with no known secret: the patterns only.
    public init() {}

    /// A mask for these secrets (empty ones are ignored).
    public init<Secrets: Sequence<String>>(secrets: Secrets) {
        for secret in secrets { self.add(secret) }
    }

    /// A mask for every password a libpq connection may be given: those written in `conninfo` (see
    /// ``ConnectionStringPasswords``), the password credential, and `PGPASSWORD` from `environment`.
    public init(connectionString conninfo: String, password: String? = nil, environment: [String: String] = [:]) {
        self.init(
            secrets: ConnectionStringPasswords.find(in: conninfo)
                + [password, environment["PGPASSWORD"]].compactMap { $0 })
    }

    /// Adds a secret, its percent-decoded form and their pieces.
    public mutating func add(_ secret: String) {
        guard !secret.isEmpty else { return }
        var forms = [secret]
        if let decoded = Self.percentDecoded(secret), decoded != secret { forms.append(decoded) }
        for form in forms {
            self.insert(Array(form.utf8))
            let pieces = form.utf8.split(whereSeparator: Self.splitsURL)
            if pieces.count > 1 || (pieces.first?.count ?? 0) != form.utf8.count {
                for piece in pieces where piece.count >= 2 { self.insert(Array(piece)) }
            }
        }
    }

    /// This mask with `other`'s secrets too.
    public func merging(_ other: SecretMask) -> SecretMask {
        var merged = self
        for secret in other.anywhere + other.standalone { merged.insert(secret) }
        return merged
    }

    /// Whether the mask knows any secret (besides the patterns, which always apply).
    public var isEmpty: Bool { self.anywhere.isEmpty && self.standalone.isEmpty }

    /// `text` with every known secret and every pattern's secret replaced by ``placeholder``.
    public func apply(_ text: String) -> String {
        guard !self.isEmpty else { return SecretPatterns.apply(text) }
        var bytes = Array(text.utf8)
        var changed = false
        for secret in self.anywhere {
            if Self.replace(secret, in: &bytes, standaloneOnly: false) { changed = true }
        }
        for secret in self.standalone {
            if Self.replace(secret, in: &bytes, standaloneOnly: true) { changed = true }
        }
        return SecretPatterns.apply(changed ? String(decoding: bytes, as: UTF8.self) : text)
    }

    // MARK: - Building

    private mutating func insert(_ secret: [UInt8]) {
        guard !secret.isEmpty, !self.anywhere.contains(secret), !self.standalone.contains(secret) else { return }
        // Long enough to be unmistakable: anywhere. A short whole secret or piece could be part of a word.
        if secret.count >= 4 {
            self.anywhere.append(secret)
            self.anywhere.sort { $0.count > $1.count }
        } else {
            self.standalone.append(secret)
            self.standalone.sort { $0.count > $1.count }
        }
    }

    /// The characters at which libpq (or any URL parser) cuts a connection string into the parts it quotes.
    static func splitsURL(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "@"), UInt8(ascii: ":"), UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "#"),
            UInt8(ascii: "&"), UInt8(ascii: "="), UInt8(ascii: ","), UInt8(ascii: "["), UInt8(ascii: "]"),
            UInt8(ascii: "%"), UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "'"), UInt8(ascii: "\""),
            UInt8(ascii: "\\"):
            return true
        default:
            return false
        }
    }

    /// `%XX` escapes decoded (as libpq decodes a URI); nil when an escape is malformed or the result is not UTF-8.
    static func percentDecoded(_ text: String) -> String? {
        let bytes = Array(text.utf8)
        guard bytes.contains(UInt8(ascii: "%")) else { return text }
        var output: [UInt8] = []
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%") {
                guard index + 2 < bytes.count, let high = Self.hexValue(bytes[index + 1]),
                    let low = Self.hexValue(bytes[index + 2])
                else { return nil }
                output.append(high << 4 | low)
                index += 3
            } else {
                output.append(bytes[index])
                index += 1
            }
        }
        return String(validating: output, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    // MARK: - Replacing

    /// Replaces every occurrence of `secret` in `bytes`; true when there was one.
    private static func replace(_ secret: [UInt8], in bytes: inout [UInt8], standaloneOnly: Bool) -> Bool {
        guard bytes.count >= secret.count else { return false }
        var output: [UInt8] = []
        var index = 0
        var found = false
        while index < bytes.count {
            if index + secret.count <= bytes.count, bytes[index] == secret[0],
                bytes[index..<(index + secret.count)].elementsEqual(secret),
                !standaloneOnly || (Self.isStandalone(bytes, from: index, to: index + secret.count))
            {
                if !found {
                    output.reserveCapacity(bytes.count)
                    output.append(contentsOf: bytes[0..<index])
                    found = true
                }
                output.append(contentsOf: Self.placeholder.utf8)
                index += secret.count
            } else {
                if found { output.append(bytes[index]) }
                index += 1
            }
        }
        if found { bytes = output }
        return found
    }

    private static func isStandalone(_ bytes: [UInt8], from start: Int, to end: Int) -> Bool {
        (start == 0 || !SecretPatterns.isAlphanumeric(bytes[start - 1]))
            && (end == bytes.count || !SecretPatterns.isAlphanumeric(bytes[end]))
    }
}
