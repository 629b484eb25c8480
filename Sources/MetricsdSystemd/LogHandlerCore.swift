import Glibc
import Logging

/// The state every metricsd log handler carries: label, shared level, own metadata and metadata provider.
struct LogHandlerCore: Sendable {
    let label: String
    let levelBox: LogLevelBox
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, levelBox: LogLevelBox, metadataProvider: Logger.MetadataProvider?) {
        self.label = label
        self.levelBox = levelBox
        self.metadataProvider = metadataProvider
    }

    /// The event as a redacted record, with the handler's, the provider's and the event's metadata merged.
    func record(for event: LogEvent) -> LogRecord {
        LogRecord(
            millisecondsSinceEpoch: LogRecord.now(),
            level: event.level,
            label: self.label,
            message: event.message.description,
            metadata: LogRecord.merged(
                base: self.metadata,
                provider: self.metadataProvider,
                explicit: event.metadata,
                error: event.error
            ),
            source: event.source,
            file: event.file,
            function: event.function,
            line: event.line
        )
    }
}

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
