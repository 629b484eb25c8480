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
        let characters = Array(text.unicodeScalars)
        var index = 0
        var line = 1

        func fail(_ message: String, at line: Int) -> ConfigurationError {
            ConfigurationError(.fileSyntax, "\(path):\(line): \(message)")
        }

        while index < characters.count {
            // Start of a line: skip blanks, comments and empty lines.
            while index < characters.count, characters[index] == " " || characters[index] == "\t" { index += 1 }
            guard index < characters.count else { break }
            let first = characters[index]
            if first == "\n" || first == "\r" {
                if first == "\n" { line += 1 }
                index += 1
                continue
            }
            if first == "#" || first == ";" {
                while index < characters.count, characters[index] != "\n" { index += 1 }
                continue
            }
            // The name, up to "=".
            let startLine = line
            var name = String.UnicodeScalarView()
            while index < characters.count, characters[index] != "=", characters[index] != "\n" {
                name.append(characters[index])
                index += 1
            }
            let trimmedName = String(name).trimmingSpaces()
            guard index < characters.count, characters[index] == "=" else {
                throw fail("expected NAME=value, got \(Self.shownLine(trimmedName))", at: startLine)
            }
            guard Self.isValidName(trimmedName) else {
                throw fail(
                    "\(Self.shownLine(trimmedName)) is not a variable name (letters, digits and _, not starting with a digit)",
                    at: startLine)
            }
            index += 1  // "="
            while index < characters.count, characters[index] == " " || characters[index] == "\t" { index += 1 }

            // The value, to the end of the line (continuations and quoted newlines included).
            var value = String.UnicodeScalarView()
            var pendingBlanks = String.UnicodeScalarView()  // unquoted trailing blanks are dropped
            valueLoop: while index < characters.count {
                let character = characters[index]
                switch character {
                case "\n":
                    break valueLoop
                case "\r" where index + 1 < characters.count && characters[index + 1] == "\n":
                    index += 1
                    continue valueLoop
                case " ", "\t":
                    pendingBlanks.append(character)
                    index += 1
                    continue valueLoop
                default:
                    break
                }
                value.append(contentsOf: pendingBlanks)
                pendingBlanks.removeAll()
                switch character {
                case "\\":
                    index += 1
                    guard index < characters.count else { break valueLoop }
                    if characters[index] == "\n" {
                        line += 1
                    } else {
                        value.append(characters[index])
                    }
                    index += 1
                case "'":
                    index += 1
                    while index < characters.count, characters[index] != "'" {
                        if characters[index] == "\n" { line += 1 }
                        value.append(characters[index])
                        index += 1
                    }
                    guard index < characters.count else { throw fail("unterminated ' quote", at: startLine) }
                    index += 1
                case "\"":
                    index += 1
                    while index < characters.count, characters[index] != "\"" {
                        var character = characters[index]
                        if character == "\\", index + 1 < characters.count {
                            let next = characters[index + 1]
                            if next == "\n" {
                                line += 1
                                index += 2
                                continue
                            }
                            if next == "\"" || next == "\\" || next == "`" || next == "$" {
                                character = next
                                index += 1
                            }
                        }
                        if character == "\n" { line += 1 }
                        value.append(character)
                        index += 1
                    }
                    guard index < characters.count else { throw fail("unterminated \" quote", at: startLine) }
                    index += 1
                default:
                    value.append(character)
                    index += 1
                }
            }
            assignments.append(Assignment(name: trimmedName, value: String(value), line: startLine))
        }
        return assignments
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
