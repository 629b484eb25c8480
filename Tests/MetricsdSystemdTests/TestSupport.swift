import Glibc
import Logging
import Synchronization
import Testing

/// Suites that change process-wide state (environment variables such as `NOTIFY_SOCKET`, file descriptor 2) are
/// nested here, so they run one test at a time; no other suite in this target reads that state.
@Suite(.serialized) enum ProcessStateTests {}

/// Runs `body` with environment variables set (`nil`: unset), then restores their previous values.
func withEnvironment<T>(_ values: [String: String?], _ body: () throws -> T) rethrows -> T {
    var saved: [String: String?] = [:]
    for (name, value) in values {
        saved.updateValue(getenv(name).map { String(cString: $0) }, forKey: name)
        if let value {
            setenv(name, value, 1)
        } else {
            unsetenv(name)
        }
    }
    defer {
        for (name, value) in saved {
            if let value {
                setenv(name, value, 1)
            } else {
                unsetenv(name)
            }
        }
    }
    return try body()
}

/// Runs `body` with file descriptor 2 redirected into a pipe and returns what was written to it.
func captureStandardError(_ body: () throws -> Void) rethrows -> String {
    var ends: [Int32] = [0, 0]
    precondition(pipe(&ends) == 0, "pipe failed")
    let saved = dup(2)
    dup2(ends[1], 2)
    close(ends[1])
    defer {
        dup2(saved, 2)
        close(saved)
    }
    try body()
    dup2(saved, 2)  // closes the pipe's last write end, so the read below ends
    var output: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = read(ends[0], &chunk, chunk.count)
        if count <= 0 { break }
        output.append(contentsOf: chunk[0..<count])
    }
    close(ends[0])
    return String(decoding: output, as: UTF8.self)
}

/// Records what a `Logger` logs, for assertions.
final class LogCapture: Sendable {
    struct Entry: Sendable {
        var level: Logger.Level
        var message: String
        var metadata: Logger.Metadata
    }

    private let storage = Mutex<[Entry]>([])

    var entries: [Entry] {
        self.storage.withLock { $0 }
    }

    /// A logger whose records land in this capture.
    func logger(label: String = "test") -> Logger {
        Logger(label: label) { _ in CapturingLogHandler(capture: self) }
    }

    fileprivate func append(_ entry: Entry) {
        self.storage.withLock { $0.append(entry) }
    }
}

private struct CapturingLogHandler: LogHandler {
    let capture: LogCapture
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        self.capture.append(
            .init(level: event.level, message: event.message.description, metadata: event.metadata ?? [:]))
    }
}

/// A name no other test run on this machine uses (for abstract sockets and temporary files).
func uniqueName(_ prefix: String) -> String {
    "\(prefix)-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
}
