import Glibc

/// Writes whole lines to file descriptor 2.
enum StandardError {
    /// Writes `line` with one `write(2)` call, so lines from different threads or processes never interleave
    /// (a pipe guarantees this up to `PIPE_BUF` bytes). Only an interrupted or partial write is continued.
    static func write(_ line: String) {
        var line = line
        line.withUTF8 { buffer in
            guard var pointer = buffer.baseAddress else { return }
            var remaining = buffer.count
            while remaining > 0 {
                let written = Glibc.write(2, pointer, remaining)
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
