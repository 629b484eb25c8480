import Logging

/// Where and how a log record goes: the one thing in which metricsd's log handlers differ.
public protocol LogSink: Sendable {
    /// Writes one record (already redacted, metadata merged).
    func write(_ record: LogRecord)
}

/// metricsd's one log handler: the label, the shared level (``LogLevelBox``), its own metadata and the metadata
/// provider; every event becomes a redacted ``LogRecord`` with all metadata merged, which `Sink` writes — one
/// line of text (``TextLines``), one JSON object (``JSONLines``) or one journal entry (``JournalEntries``).
public struct MetricsdLogHandler<Sink: LogSink>: LogHandler {
    private let label: String
    private let levelBox: LogLevelBox
    private let sink: Sink
    /// This handler's own metadata.
    public var metadata: Logger.Metadata = [:]
    /// The metadata provider consulted for every record.
    public var metadataProvider: Logger.MetadataProvider?

    /// A handler for the logger `label` whose level is read from `level`, writing to `sink`.
    public init(label: String, level: LogLevelBox, sink: Sink, metadataProvider: Logger.MetadataProvider? = nil) {
        self.label = label
        self.levelBox = level
        self.sink = sink
        self.metadataProvider = metadataProvider
    }

    /// The shared level (see ``LogLevelBox``): setting it changes every handler sharing the box.
    public var logLevel: Logger.Level {
        get { self.levelBox.level }
        set { self.levelBox.level = newValue }
    }

    /// One item of this handler's own metadata.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        self.sink.write(
            LogRecord(
                millisecondsSinceEpoch: LogRecord.now(), level: event.level, label: self.label,
                message: event.message.description,
                metadata: LogRecord.merged(
                    base: self.metadata, provider: self.metadataProvider, explicit: event.metadata, error: event.error),
                source: event.source, file: event.file, function: event.function, line: event.line))
    }
}

/// Readable lines on stderr.
public typealias TextLogHandler = MetricsdLogHandler<TextLines>
/// JSON lines on stderr.
public typealias JSONLogHandler = MetricsdLogHandler<JSONLines>
/// Entries in the systemd journal.
public typealias JournalLogHandler = MetricsdLogHandler<JournalEntries>
