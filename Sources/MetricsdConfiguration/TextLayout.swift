/// The few text operations the command line needs, written on the standard library (FoundationEssentials has no
/// CharacterSet or padding, and the rest of Foundation would bring ICU's 34 MB of locale data into the binary).
extension StringProtocol {
    /// Without leading and trailing spaces and tabs (Unicode white space other than line breaks), like
    /// Foundation's `trimmingCharacters(in: .whitespaces)`.
    package func trimmingSpaces() -> String {
        Self.trimming(self) { $0.isWhitespace && !$0.isNewline }
    }

    /// Without leading and trailing white space, line breaks included, like
    /// `trimmingCharacters(in: .whitespacesAndNewlines)`.
    package func trimmingWhitespace() -> String {
        Self.trimming(self) { $0.isWhitespace }
    }

    /// Exactly `length` characters: cut, or filled with spaces on the right, like
    /// `padding(toLength:withPad: " ", startingAt: 0)`.
    package func padded(to length: Int) -> String {
        let kept = String(self.prefix(length))
        return kept + String(repeating: " ", count: Swift.max(0, length - kept.count))
    }

    private static func trimming(_ text: Self, where drop: (Character) -> Bool) -> String {
        guard let first = text.firstIndex(where: { !drop($0) }), let last = text.lastIndex(where: { !drop($0) }) else {
            return ""
        }
        return String(text[first...last])
    }
}

/// Levenshtein distance, with an adjacent swap counting as one edit ("stauts" is one edit from "status").
package func editDistance(_ a: String, _ b: String) -> Int {
    let a = Array(a)
    let b = Array(b)
    guard !a.isEmpty, !b.isEmpty else { return max(a.count, b.count) }
    var table = Array(repeating: Array(repeating: 0, count: b.count + 1), count: a.count + 1)
    for i in 0...a.count { table[i][0] = i }
    for j in 0...b.count { table[0][j] = j }
    for i in 1...a.count {
        for j in 1...b.count {
            let cost = a[i - 1] == b[j - 1] ? 0 : 1
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + cost)
            if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                table[i][j] = min(table[i][j], table[i - 2][j - 2] + 1)
            }
        }
    }
    return table[a.count][b.count]
}
