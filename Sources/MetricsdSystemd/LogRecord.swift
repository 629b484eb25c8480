import Glibc
import Logging

/// One log record as every metricsd handler formats it: metadata merged, redacted, flattened to strings and
/// sorted by key.
///
/// The initializer applies ``LogRedaction``, so a `LogRecord` never holds a secret the rules recognise.
public struct LogRecord: Sendable, Equatable {
    /// One metadata entry, its value flattened to a string.
    public struct Field: Sendable, Equatable {
        /// The metadata key, as logged (`metricsd.user.id`).
        public var key: String
        /// The value, redacted and flattened (`.string` as is, others through their description).
        public var value: String

        /// A field.
        public init(key: String, value: String) {
            self.key = key
            self.value = value
        }
    }

    /// When the record was made, in milliseconds since the Unix epoch.
    public var millisecondsSinceEpoch: Int64
    /// The record's level.
    public var level: Logger.Level
    /// The logger's label.
    public var label: String
    /// The message, redacted.
    public var message: String
    /// The metadata, redacted and sorted by key.
    public var metadata: [Field]
    /// The module that logged (swift-log's `source`).
    public var source: String
    /// The file that logged.
    public var file: String
    /// The function that logged.
    public var function: String
    /// The line that logged.
    public var line: UInt

    /// A record with `message` and `metadata` redacted by ``LogRedaction``.
    public init(
        millisecondsSinceEpoch: Int64,
        level: Logger.Level,
        label: String,
        message: String,
        metadata: Logger.Metadata,
        source: String = "",
        file: String = "",
        function: String = "",
        line: UInt = 0
    ) {
        let redacted = LogRedaction.redact(message: message, metadata: metadata)
        self.millisecondsSinceEpoch = millisecondsSinceEpoch
        self.level = level
        self.label = label
        self.message = redacted.message
        self.metadata = redacted.metadata
            .map { Field(key: $0.key, value: Self.flatten($0.value)) }
            .sorted { $0.key < $1.key }
        self.source = source
        self.file = file
        self.function = function
        self.line = line
    }

    /// The record's time as ISO 8601 UTC with milliseconds: `2025-10-29T14:30:45.123Z`.
    public var timestamp: String {
        Self.iso8601(millisecondsSinceEpoch: self.millisecondsSinceEpoch)
    }

    /// `milliseconds` since the epoch as ISO 8601 UTC with milliseconds: `2025-10-29T14:30:45.123Z`.
    public static func iso8601(millisecondsSinceEpoch milliseconds: Int64) -> String {
        var seconds = time_t(milliseconds.floorDivided(by: 1_000))
        let millis = Int(milliseconds - Int64(seconds) * 1_000)
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return "\(milliseconds)ms" }
        return Self.padded(Int(parts.tm_year) + 1900, 4) + "-" + Self.padded(Int(parts.tm_mon) + 1, 2) + "-"
            + Self.padded(Int(parts.tm_mday), 2) + "T" + Self.padded(Int(parts.tm_hour), 2) + ":"
            + Self.padded(Int(parts.tm_min), 2) + ":" + Self.padded(Int(parts.tm_sec), 2) + "."
            + Self.padded(millis, 3) + "Z"
    }

    /// The current wall-clock time in milliseconds since the epoch.
    static func now() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1_000 + Int64(now.tv_nsec) / 1_000_000
    }

    /// swift-log's merge order: the handler's metadata, then the provider's, then the call's; the error last.
    static func merged(
        base: Logger.Metadata,
        provider: Logger.MetadataProvider?,
        explicit: Logger.Metadata?,
        error: (any Error)?
    ) -> Logger.Metadata {
        var metadata = base
        if let provided = provider?.get(), !provided.isEmpty {
            metadata.merge(provided) { _, provided in provided }
        }
        if let explicit, !explicit.isEmpty {
            metadata.merge(explicit) { _, explicit in explicit }
        }
        if let error {
            metadata["error.message"] = "\(error)"
            metadata["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        return metadata
    }

    private static func flatten(_ value: Logger.MetadataValue) -> String {
        if case .string(let string) = value {
            return string
        }
        return value.description
    }

    private static func padded(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }
}

extension Int64 {
    fileprivate func floorDivided(by divisor: Int64) -> Int64 {
        let quotient = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? quotient - 1 : quotient
    }
}
