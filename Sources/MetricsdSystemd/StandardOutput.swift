/// Writes text to file descriptor 1 (the command line's reports and progress), without Foundation's FileHandle.
public enum StandardOutput {
    /// Writes `text` with one `write(2)` call where the kernel takes it whole.
    public static func write(_ text: String) {
        StandardError.write(text, to: 1)
    }
}
