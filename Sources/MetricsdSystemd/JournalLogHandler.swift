import Glibc
import Logging

internal import CSystemd

/// Sends each record to the systemd journal with `sd_journal_sendv(3)`, as the fields ``JournalFields`` makes.
///
/// Values may contain newlines or any bytes (sendv uses the journal's binary-safe encoding). When there is no
/// journal (no `/run/systemd/journal/socket` when the handler was made, where libsystemd would drop records
/// silently) or a send fails, the record is written to stderr as a text line instead of being lost.
public struct JournalLogHandler: LogHandler {
    /// The socket `sd_journal_sendv` writes to.
    static let journalSocket = "/run/systemd/journal/socket"

    private var core: LogHandlerCore
    private let journalAvailable: Bool

    /// A handler for the logger `label` whose level is read from `level`.
    public init(label: String, level: LogLevelBox, metadataProvider: Logger.MetadataProvider? = nil) {
        self.core = LogHandlerCore(label: label, levelBox: level, metadataProvider: metadataProvider)
        self.journalAvailable = access(Self.journalSocket, F_OK) == 0
    }

    /// The shared level (see ``LogLevelBox``): setting it changes every handler sharing the box.
    public var logLevel: Logger.Level {
        get { self.core.levelBox.level }
        set { self.core.levelBox.level = newValue }
    }

    /// This handler's own metadata.
    public var metadata: Logger.Metadata {
        get { self.core.metadata }
        set { self.core.metadata = newValue }
    }

    /// The metadata provider consulted for every record.
    public var metadataProvider: Logger.MetadataProvider? {
        get { self.core.metadataProvider }
        set { self.core.metadataProvider = newValue }
    }

    /// One item of this handler's own metadata.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.core.metadata[key] }
        set { self.core.metadata[key] = newValue }
    }

    /// Sends the event to the journal (or, failing that, writes a text line on stderr).
    public func log(event: LogEvent) {
        let record = self.core.record(for: event)
        if !self.journalAvailable || !Self.send(JournalFields.make(record)) {
            StandardError.write(TextLogHandler.format(record) + "\n")
        }
    }

    /// Sends `NAME=value` fields as one journal entry; `true` when libsystemd accepted it.
    static func send(_ fields: [(name: String, value: String)]) -> Bool {
        var buffer: [UInt8] = []
        var ranges: [(offset: Int, length: Int)] = []
        for field in fields {
            let start = buffer.count
            buffer.append(contentsOf: field.name.utf8)
            buffer.append(UInt8(ascii: "="))
            buffer.append(contentsOf: field.value.utf8)
            ranges.append((start, buffer.count - start))
        }
        return buffer.withUnsafeMutableBytes { bytes in
            guard let base = bytes.baseAddress else { return false }
            var vectors = ranges.map { iovec(iov_base: base + $0.offset, iov_len: $0.length) }
            return sd_journal_sendv(&vectors, Int32(vectors.count)) >= 0
        }
    }
}
