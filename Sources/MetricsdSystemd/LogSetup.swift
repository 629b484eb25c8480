import Glibc
import Logging

/// Chooses and makes metricsd's log handler, for `LoggingSystem.bootstrap`.
///
/// ```swift
/// let level = LogLevelBox(.info)
/// let format = environment["METRICSD_LOG_FORMAT"].flatMap(LogFormat.init(rawValue:))
/// LoggingSystem.bootstrap { label, provider in
///     LogSetup.makeHandler(label: label, format: format, level: level, environment: environment, metadataProvider: provider)
/// }
/// ```
public enum LogSetup {
    /// A handler for `label` in `format`, or, when `format` is `nil`, in ``resolvedFormat(_:environment:)``.
    ///
    /// - Parameters:
    ///   - label: The logger's label.
    ///   - format: `METRICSD_LOG_FORMAT` when set; `nil` chooses automatically.
    ///   - level: The shared level every handler reads (changed on reload).
    ///   - environment: The process environment (for `JOURNAL_STREAM`).
    ///   - metadataProvider: The metadata provider the handler consults for every record.
    public static func makeHandler(
        label: String,
        format: LogFormat?,
        level: LogLevelBox,
        environment: [String: String],
        metadataProvider: Logger.MetadataProvider? = nil
    ) -> any LogHandler {
        switch self.resolvedFormat(format, environment: environment) {
        case .text: TextLogHandler(label: label, level: level, sink: TextLines(), metadataProvider: metadataProvider)
        case .json: JSONLogHandler(label: label, level: level, sink: JSONLines(), metadataProvider: metadataProvider)
        case .journal:
            JournalLogHandler(label: label, level: level, sink: JournalEntries(), metadataProvider: metadataProvider)
        }
    }

    /// `format` when given; otherwise ``LogFormat/journal`` when stderr is connected to the journal, else
    /// ``LogFormat/text``.
    public static func resolvedFormat(_ format: LogFormat?, environment: [String: String]) -> LogFormat {
        if let format {
            return format
        }
        return self.stderrIsJournal(environment: environment) ? .journal : .text
    }

    /// Whether stderr is the journal stream systemd connected: `JOURNAL_STREAM` (`<device>:<inode>`) names the
    /// device and inode of file descriptor 2. False when the variable is absent or malformed, or stderr was
    /// redirected (to a file, a pipe, another process's stream).
    public static func stderrIsJournal(environment: [String: String]) -> Bool {
        guard let value = environment["JOURNAL_STREAM"] else { return false }
        var status = stat()
        guard fstat(2, &status) == 0 else { return false }
        return self.journalStream(value, matchesDevice: UInt64(status.st_dev), inode: UInt64(status.st_ino))
    }

    /// Whether a `JOURNAL_STREAM` value (`<device>:<inode>`, both decimal) names `device` and `inode`.
    public static func journalStream(_ value: String, matchesDevice device: UInt64, inode: UInt64) -> Bool {
        let parts = value.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let streamDevice = UInt64(parts[0]), let streamInode = UInt64(parts[1]) else {
            return false
        }
        return streamDevice == device && streamInode == inode
    }
}
