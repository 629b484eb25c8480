import MetricsdHTTP
import MetricsdMasking

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `NAME=value` lines as systemd's `EnvironmentFile=` reads them, so that the file the service gets and the file
/// the command line reads mean the same thing.
///
/// - Empty lines and lines whose first non-blank character is `#` or `;` are comments.
/// - Blanks around the name and before the value are ignored; trailing blanks of an unquoted value too.
/// - `'…'` keeps everything up to the next `'` literally; `"…"` too, except that a backslash escapes `"`, `\`,
///   `` ` `` and `$` (before any other character it stays). Both may span lines. Quoted and unquoted parts join:
///   `A=x"y z"` is `xy z`.
/// - Outside quotes a backslash takes the next character literally; a backslash at the end of a line continues the
///   value on the next line.
/// - A `#` after the `=` is part of the value (systemd has no trailing comments).
///
/// Unlike systemd, which skips a malformed line with a warning in the journal, a malformed line is an error naming
/// `file:line`: a typo in a setting should stop the command, not silently fall back to a default.
public enum EnvironmentFile {
    /// One assignment and the line it starts on.
    public struct Assignment: Equatable, Sendable {
        public let name: String
        public let value: String
        public let line: Int
    }

    /// Parses `text`; `path` only names the file in errors.
    public static func parse(_ text: String, path: String) throws(ConfigurationError) -> [Assignment] {
        var assignments: [Assignment] = []
        var cursor = Cursor(characters: Array(text.unicodeScalars), path: path)
        while cursor.skipToAssignment() {
            let startLine = cursor.line
            let name = try cursor.name()
            let value = try cursor.value(startingOn: startLine)
            assignments.append(Assignment(name: name, value: value, line: startLine))
        }
        return assignments
    }

    /// Where the parser is in the text, and the line it is on (continuations and quoted newlines counted).
    private struct Cursor {
        let characters: [Unicode.Scalar]
        let path: String
        var index = 0
        var line = 1

        init(characters: [Unicode.Scalar], path: String) {
            self.characters = characters
            self.path = path
        }

        var atEnd: Bool { self.index >= self.characters.count }

        func fail(_ message: String, at line: Int) -> ConfigurationError {
            ConfigurationError(.fileSyntax, "\(self.path):\(line): \(message)")
        }

        mutating func skipBlanks() {
            while !self.atEnd, self.characters[self.index] == " " || self.characters[self.index] == "\t" {
                self.index += 1
            }
        }

        /// Skips blanks, comments and empty lines to the start of the next assignment; false at the end.
        mutating func skipToAssignment() -> Bool {
            while true {
                self.skipBlanks()
                guard !self.atEnd else { return false }
                let first = self.characters[self.index]
                if first == "\n" || first == "\r" {
                    if first == "\n" { self.line += 1 }
                    self.index += 1
                    continue
                }
                if first == "#" || first == ";" {
                    while !self.atEnd, self.characters[self.index] != "\n" { self.index += 1 }
                    continue
                }
                return true
            }
        }

        /// The name, up to "=", checked; then past the "=" and the blanks after it.
        mutating func name() throws(ConfigurationError) -> String {
            let startLine = self.line
            var name = String.UnicodeScalarView()
            while !self.atEnd, self.characters[self.index] != "=", self.characters[self.index] != "\n" {
                name.append(self.characters[self.index])
                self.index += 1
            }
            let trimmedName = String(name).trimmingSpaces()
            guard !self.atEnd, self.characters[self.index] == "=" else {
                throw self.fail("expected NAME=value, got \(EnvironmentFile.shownLine(trimmedName))", at: startLine)
            }
            guard EnvironmentFile.isValidName(trimmedName) else {
                throw self.fail(
                    "\(EnvironmentFile.shownLine(trimmedName)) is not a variable name (letters, digits and _, not starting with a digit)",
                    at: startLine)
            }
            self.index += 1  // "="
            self.skipBlanks()
            return trimmedName
        }

        /// The value, to the end of the line (continuations and quoted newlines included).
        mutating func value(startingOn startLine: Int) throws(ConfigurationError) -> String {
            var value = String.UnicodeScalarView()
            var pendingBlanks = String.UnicodeScalarView()  // unquoted trailing blanks are dropped
            valueLoop: while !self.atEnd {
                let character = self.characters[self.index]
                switch character {
                case "\n":
                    break valueLoop
                case "\r" where self.index + 1 < self.characters.count && self.characters[self.index + 1] == "\n":
                    self.index += 1
                    continue valueLoop
                case " ", "\t":
                    pendingBlanks.append(character)
                    self.index += 1
                    continue valueLoop
                default:
                    break
                }
                value.append(contentsOf: pendingBlanks)
                pendingBlanks.removeAll()
                switch character {
                case "\\":
                    self.index += 1
                    guard !self.atEnd else { break valueLoop }
                    if self.characters[self.index] == "\n" {
                        self.line += 1
                    } else {
                        value.append(self.characters[self.index])
                    }
                    self.index += 1
                case "'":
                    try self.singleQuoted(into: &value, startingOn: startLine)
                case "\"":
                    try self.doubleQuoted(into: &value, startingOn: startLine)
                default:
                    value.append(character)
                    self.index += 1
                }
            }
            return String(value)
        }

        /// `'…'` at `index`: everything up to the next `'`, literally.
        mutating func singleQuoted(into value: inout String.UnicodeScalarView, startingOn startLine: Int)
            throws(ConfigurationError)
        {
            self.index += 1
            while !self.atEnd, self.characters[self.index] != "'" {
                if self.characters[self.index] == "\n" { self.line += 1 }
                value.append(self.characters[self.index])
                self.index += 1
            }
            guard !self.atEnd else { throw self.fail("unterminated ' quote", at: startLine) }
            self.index += 1
        }

        /// `"…"` at `index`: up to the next unescaped `"`, a backslash escaping `"`, `\`, `` ` `` and `$` (and
        /// continuing the line before a newline).
        mutating func doubleQuoted(into value: inout String.UnicodeScalarView, startingOn startLine: Int)
            throws(ConfigurationError)
        {
            self.index += 1
            while !self.atEnd, self.characters[self.index] != "\"" {
                var character = self.characters[self.index]
                if character == "\\", self.index + 1 < self.characters.count {
                    let next = self.characters[self.index + 1]
                    if next == "\n" {
                        self.line += 1
                        self.index += 2
                        continue
                    }
                    if next == "\"" || next == "\\" || next == "`" || next == "$" {
                        character = next
                        self.index += 1
                    }
                }
                if character == "\n" { self.line += 1 }
                value.append(character)
                self.index += 1
            }
            guard !self.atEnd else { throw self.fail("unterminated \" quote", at: startLine) }
            self.index += 1
        }
    }

    /// A malformed line as an error quotes it: when its first word names a secret (`METRICSD_JWT_SECRET abc…`,
    /// `PGPASSWORD abc…`) only that word, else the line with secrets masked (``EnvironmentReader/shown(_:)``).
    static func shownLine(_ line: String) -> String {
        let firstWord = line.prefix { !$0.isWhitespace }
        if SecretPatterns.namesSecret(String(firstWord)), firstWord.count < line.count {
            return "'\(firstWord) \(SecretMask.placeholder)'"
        }
        return EnvironmentReader.shown(line)
    }

    /// Letters, digits and `_`, not starting with a digit (what a shell and systemd accept as a name).
    static func isValidName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, !("0"..."9").contains(first) else { return false }
        return name.unicodeScalars.allSatisfy {
            $0.isASCII && ($0 == "_" || $0.properties.isAlphabetic || ("0"..."9").contains($0))
        }
    }

    /// Reads and parses the file at `path`.
    public static func read(_ path: String) throws(ConfigurationError) -> [Assignment] {
        let text = try Secrets.readText(path)
        return try Self.parse(text, path: path)
    }
}
