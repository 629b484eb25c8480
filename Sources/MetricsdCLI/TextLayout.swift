/// The few text operations the command line needs, written on the standard library (FoundationEssentials has no
/// CharacterSet or padding, and the rest of Foundation would bring ICU's 34 MB of locale data into the binary).
extension StringProtocol {
    /// Without leading and trailing spaces and tabs (Unicode white space other than line breaks), like
    /// Foundation's `trimmingCharacters(in: .whitespaces)`.
    func trimmingSpaces() -> String {
        Self.trimming(self) { $0.isWhitespace && !$0.isNewline }
    }

    /// Without leading and trailing white space, line breaks included, like
    /// `trimmingCharacters(in: .whitespacesAndNewlines)`.
    func trimmingWhitespace() -> String {
        Self.trimming(self) { $0.isWhitespace }
    }

    /// Exactly `length` characters: cut, or filled with spaces on the right, like
    /// `padding(toLength:withPad: " ", startingAt: 0)`.
    func padded(to length: Int) -> String {
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
