/// The passwords written in a libpq connection string, found without libpq: its parser may just have refused the
/// string, and its message then quotes the very fragment that holds the password.
///
/// - URI (`postgresql://` or `postgres://`): the userinfo's password, up to the *last* `@` before the query (an
///   unescaped `@` in a password is the operator's likeliest mistake, and libpq then takes the rest for a host
///   name), and every `password=` query parameter.
/// - keyword/value string: every `password = value` (quoted with `'…'` and `\'`, or up to a blank).
///
/// Each password as written (percent escapes and all); ``SecretMask`` adds the decoded form and the pieces.
public enum ConnectionStringPasswords {
    public static func find(in conninfo: String) -> [String] {
        let text = conninfo.trimmingBlanks()
        for scheme in ["postgresql://", "postgres://"] where text.lowercased().hasPrefix(scheme) {
            return Self.uriPasswords(String(text.dropFirst(scheme.count)))
        }
        return Self.keywordPasswords(text)
    }

    private static func uriPasswords(_ rest: String) -> [String] {
        var passwords: [String] = []
        let beforeQuery = rest.prefix { $0 != "?" }
        if let at = beforeQuery.lastIndex(of: "@") {
            let userinfo = beforeQuery[..<at]
            if let colon = userinfo.firstIndex(of: ":") {
                passwords.append(String(userinfo[userinfo.index(after: colon)...]))
            }
        }
        if let question = rest.firstIndex(of: "?") {
            let query = rest[rest.index(after: question)...].prefix { $0 != "#" }
            for parameter in query.split(separator: "&") {
                let parts = parameter.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                if parts.count == 2, SecretMask.percentDecoded(String(parts[0]))?.lowercased() == "password" {
                    passwords.append(String(parts[1]))
                }
            }
        }
        return passwords.filter { !$0.isEmpty }
    }

    private static func keywordPasswords(_ text: String) -> [String] {
        var passwords: [String] = []
        let characters = Array(text)
        var index = 0
        while index < characters.count {
            while index < characters.count, characters[index].isWhitespace { index += 1 }
            var keyword = ""
            while index < characters.count, characters[index] != "=", !characters[index].isWhitespace {
                keyword.append(characters[index])
                index += 1
            }
            while index < characters.count, characters[index].isWhitespace { index += 1 }
            guard index < characters.count, characters[index] == "=" else { continue }
            index += 1
            while index < characters.count, characters[index].isWhitespace { index += 1 }
            var value = ""
            if index < characters.count, characters[index] == "'" {
                index += 1
                while index < characters.count, characters[index] != "'" {
                    if characters[index] == "\\", index + 1 < characters.count { index += 1 }
                    value.append(characters[index])
                    index += 1
                }
                index += 1
            } else {
                while index < characters.count, !characters[index].isWhitespace {
                    if characters[index] == "\\", index + 1 < characters.count { index += 1 }
                    value.append(characters[index])
                    index += 1
                }
            }
            if keyword.lowercased() == "password", !value.isEmpty { passwords.append(value) }
        }
        return passwords
    }
}

extension String {
    fileprivate func trimmingBlanks() -> String {
        String(self.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }
}
