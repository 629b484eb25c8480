/// The statements of a migration that runs outside a transaction (``Migration/runsOutsideTransaction``), in the
/// order the file has them, each sent to the server alone.
///
/// A statement ends at a `;` or at psql's `\gexec`, outside comments (`--`, nested `/* */`), quoted strings
/// (`'…'`, `E'…'` with backslash escapes), quoted identifiers (`"…"`) and dollar-quoted bodies (`$$…$$`,
/// `$tag$…$tag$`). A statement that ends at `\gexec` is a query whose result holds statements: each non-null value,
/// row by row and column by column, is run in its turn, as psql does. So the file runs as it is with
/// `psql -f` (outside a transaction, psql's default), which helps when writing one.
enum MigrationScript {
    struct Step: Equatable, Sendable {
        let sql: String
        /// The step is a query; run each value of its result as a statement.
        let generatesStatements: Bool
    }

    static func steps(of text: String) -> [Step] {
        var scanner = Scanner(Array(text.unicodeScalars))
        return scanner.scan()
    }

    private struct Scanner {
        let text: [Unicode.Scalar]
        var position = 0
        /// Where the statement being read began, and whether it holds anything but comments and spaces.
        var start = 0
        var hasCode = false
        var found: [Step] = []

        init(_ text: [Unicode.Scalar]) {
            self.text = text
        }

        mutating func scan() -> [Step] {
            while self.position < self.text.count {
                let character = self.text[self.position]
                if character == "-" && self.next == "-" {
                    self.skipLine()
                } else if character == "/" && self.next == "*" {
                    self.skipBlockComment()
                } else if character == "'" {
                    self.hasCode = true
                    self.skipQuoted("'", backslashEscapes: self.isEscapeStringPrefix())
                } else if character == "\"" {
                    self.hasCode = true
                    self.skipQuoted("\"", backslashEscapes: false)
                } else if character == "$", let tag = self.dollarTag() {
                    self.hasCode = true
                    self.skipDollarQuoted(tag)
                } else if character == ";" {
                    self.finish(at: self.position, generates: false)
                    self.position += 1
                    self.start = self.position
                } else if character == "\\" && self.startsWithGexec() {
                    self.finish(at: self.position, generates: true)
                    self.position += 6
                    self.start = self.position
                } else {
                    if !character.properties.isWhitespace { self.hasCode = true }
                    self.position += 1
                }
            }
            self.finish(at: self.text.count, generates: false)
            return self.found
        }

        private var next: Unicode.Scalar? {
            self.position + 1 < self.text.count ? self.text[self.position + 1] : nil
        }

        private mutating func finish(at end: Int, generates: Bool) {
            defer { self.hasCode = false }
            guard self.hasCode else { return }
            var sql = String(String.UnicodeScalarView(self.text[self.start..<end]))
            while let first = sql.unicodeScalars.first, first.properties.isWhitespace {
                sql.unicodeScalars.removeFirst()
            }
            while let last = sql.unicodeScalars.last, last.properties.isWhitespace { sql.unicodeScalars.removeLast() }
            self.found.append(Step(sql: sql, generatesStatements: generates))
        }

        private mutating func skipLine() {
            while self.position < self.text.count && self.text[self.position] != "\n" { self.position += 1 }
        }

        /// PostgreSQL's block comments nest.
        private mutating func skipBlockComment() {
            var depth = 0
            while self.position < self.text.count {
                if self.text[self.position] == "/" && self.next == "*" {
                    depth += 1
                    self.position += 2
                } else if self.text[self.position] == "*" && self.next == "/" {
                    depth -= 1
                    self.position += 2
                    if depth == 0 { return }
                } else {
                    self.position += 1
                }
            }
        }

        /// From the opening quote to after the closing one; a doubled quote is one quote character.
        private mutating func skipQuoted(_ quote: Unicode.Scalar, backslashEscapes: Bool) {
            self.position += 1
            while self.position < self.text.count {
                let character = self.text[self.position]
                if backslashEscapes && character == "\\" {
                    self.position += 2
                } else if character == quote {
                    self.position += 1
                    guard self.position < self.text.count, self.text[self.position] == quote else { return }
                    self.position += 1
                } else {
                    self.position += 1
                }
            }
        }

        /// `E'…'` (or `e'…'`) standing alone, not the end of a longer name such as `some'`.
        private func isEscapeStringPrefix() -> Bool {
            guard self.position >= 1, self.text[self.position - 1] == "E" || self.text[self.position - 1] == "e" else {
                return false
            }
            return self.position < 2 || !Self.isIdentifierCharacter(self.text[self.position - 2])
        }

        /// The tag of a dollar quote starting here (`$$` or `$name$`), nil for anything else (`$1`, `a$b`).
        private func dollarTag() -> [Unicode.Scalar]? {
            if self.position > 0 && Self.isIdentifierCharacter(self.text[self.position - 1]) { return nil }
            var end = self.position + 1
            while end < self.text.count && self.text[end] != "$" {
                let character = self.text[end]
                let allowed =
                    end == self.position + 1
                    ? Self.isIdentifierStart(character) : Self.isIdentifierCharacter(character)
                guard allowed else { return nil }
                end += 1
            }
            guard end < self.text.count else { return nil }
            return Array(self.text[self.position...end])
        }

        private mutating func skipDollarQuoted(_ tag: [Unicode.Scalar]) {
            self.position += tag.count
            while self.position < self.text.count {
                if self.text[self.position] == "$" && self.text[self.position...].starts(with: tag) {
                    self.position += tag.count
                    return
                }
                self.position += 1
            }
        }

        private func startsWithGexec() -> Bool {
            let command = Array("\\gexec".unicodeScalars)
            guard self.text[self.position...].starts(with: command) else { return false }
            let after = self.position + command.count
            return after == self.text.count || self.text[after].properties.isWhitespace
        }

        private static func isIdentifierStart(_ character: Unicode.Scalar) -> Bool {
            character == "_" || character.properties.isAlphabetic || character.value >= 0x80
        }

        private static func isIdentifierCharacter(_ character: Unicode.Scalar) -> Bool {
            Self.isIdentifierStart(character) || ("0"..."9").contains(character) || character == "$"
        }
    }
}
