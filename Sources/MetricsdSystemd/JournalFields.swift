import Logging

/// The mapping from a log record to systemd journal fields: a pure function, tested without a journal.
///
/// A record becomes `MESSAGE=`, `PRIORITY=` (syslog numbers), `SYSLOG_IDENTIFIER=metricsd`, `CODE_FILE=`,
/// `CODE_LINE=`, `CODE_FUNC=`, `CODE_MODULE=` (swift-log's source, when known) and one field per metadata key,
/// named by ``fieldName(forMetadataKey:)``. Message and values are redacted by ``LogRedaction``.
public enum JournalFields {
    /// The `SYSLOG_IDENTIFIER=` of every record.
    public static let syslogIdentifier = "metricsd"

    /// Field names that metadata must not overwrite: ours, and those journald interprets.
    public static let reservedNames: Set<String> = [
        "MESSAGE", "MESSAGE_ID", "PRIORITY", "CODE_FILE", "CODE_LINE", "CODE_FUNC", "CODE_MODULE", "ERRNO",
        "SYSLOG_FACILITY", "SYSLOG_IDENTIFIER", "SYSLOG_PID", "SYSLOG_TIMESTAMP", "SYSLOG_RAW", "DOCUMENTATION",
        "TID", "OBJECT_PID", "INVOCATION_ID", "USER_INVOCATION_ID", "UNIT", "USER_UNIT",
    ]

    /// Journal field names are at most 64 characters.
    public static let maximumNameLength = 64

    /// The journal fields for one record, in order: message, priority, identifier, code location, then metadata
    /// sorted by key.
    public static func make(
        level: Logger.Level,
        message: String,
        metadata: Logger.Metadata,
        source: String,
        file: String,
        function: String,
        line: UInt
    ) -> [(name: String, value: String)] {
        self.make(
            LogRecord(
                millisecondsSinceEpoch: 0,
                level: level,
                label: Self.syslogIdentifier,
                message: message,
                metadata: metadata,
                source: source,
                file: file,
                function: function,
                line: line
            )
        )
    }

    /// The journal fields for an already redacted record (see ``make(level:message:metadata:source:file:function:line:)``).
    public static func make(_ record: LogRecord) -> [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = [
            ("MESSAGE", record.message),
            ("PRIORITY", String(self.priority(for: record.level))),
            ("SYSLOG_IDENTIFIER", Self.syslogIdentifier),
            ("CODE_FILE", record.file),
            ("CODE_LINE", String(record.line)),
            ("CODE_FUNC", record.function),
        ]
        if !record.source.isEmpty {
            fields.append(("CODE_MODULE", record.source))
        }
        for field in record.metadata {
            fields.append((self.fieldName(forMetadataKey: field.key), field.value))
        }
        return fields
    }

    /// The syslog priority of a level: trace and debug 7, info 6, notice 5, warning 4, error 3, critical 2.
    public static func priority(for level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    /// The journal field name for a metadata key: `metricsd.user.id` → `USER_ID`, `hb.request.id` → `HB_REQUEST_ID`.
    ///
    /// A leading `metricsd.` is removed, letters are upper-cased, every character outside `[A-Z0-9_]` becomes `_`
    /// and leading underscores are removed (journald keeps `_…` for trusted fields). A name that is then empty or
    /// starts with a digit gets the prefix `F_`; a name in ``reservedNames`` gets the prefix `METRICSD_`. The result
    /// is cut to 64 characters.
    public static func fieldName(forMetadataKey key: String) -> String {
        var name = Substring(key)
        if name.lowercased().hasPrefix("metricsd.") {
            name = name.dropFirst("metricsd.".count)
        }
        var mapped = ""
        for scalar in name.unicodeScalars {
            switch scalar {
            case "a"..."z": mapped.unicodeScalars.append(Unicode.Scalar(scalar.value - 32)!)
            case "A"..."Z", "0"..."9", "_": mapped.unicodeScalars.append(scalar)
            default: mapped += "_"
            }
        }
        mapped = String(mapped.drop { $0 == "_" })
        if mapped.isEmpty || mapped.first!.isNumber {
            mapped = "F_" + mapped
        } else if Self.reservedNames.contains(mapped) {
            mapped = "METRICSD_" + mapped
        }
        return String(mapped.prefix(Self.maximumNameLength))
    }
}
