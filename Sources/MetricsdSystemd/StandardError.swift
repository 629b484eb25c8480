import Glibc

/// Writes whole lines to file descriptor 2.
public enum StandardError {
    /// Writes `line` with one `write(2)` call, so lines from different threads or processes never interleave
    /// (a pipe guarantees this up to `PIPE_BUF` bytes). Only an interrupted or partial write is continued.
    public static func write(_ line: String) {
        Self.write(line, to: 2)
    }

    /// Writes all of `text` to `descriptor`, continuing after an interrupted or partial write; gives up on an error.
    static func write(_ text: String, to descriptor: Int32) {
        var text = text
        text.withUTF8 { buffer in
            guard var pointer = buffer.baseAddress else { return }
            var remaining = buffer.count
            while remaining > 0 {
                let written = Glibc.write(descriptor, pointer, remaining)
                if written < 0 {
                    if errno == EINTR { continue }
                    return
                }
                pointer += written
                remaining -= written
            }
        }
    }
}
