internal import CSystemd
import Glibc
import Logging

/// Sends each record to the systemd journal with `sd_journal_sendv(3)`, as the fields ``JournalFields`` makes.
///
/// Values may contain newlines or any bytes (sendv uses the journal's binary-safe encoding). When there is no
/// journal (no `/run/systemd/journal/socket` when the handler was made, where libsystemd would drop records
/// silently) or a send fails, the record is written to stderr as a text line instead of being lost.
public struct JournalEntries: LogSink {
    /// The socket `sd_journal_sendv` writes to.
    static let journalSocket = "/run/systemd/journal/socket"

    private let journalAvailable: Bool

    public init() {
        self.journalAvailable = access(Self.journalSocket, F_OK) == 0
    }

    /// Sends the record to the journal (or, failing that, writes a text line on stderr).
    public func write(_ record: LogRecord) {
        if !self.journalAvailable || !Self.send(JournalFields.make(record)) {
            StandardError.write(TextLines.format(record) + "\n")
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
