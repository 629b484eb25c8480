/// Where and how log records are written (`METRICSD_LOG_FORMAT`).
public enum LogFormat: String, Sendable, CaseIterable {
    /// One readable line per record on stderr (``TextLogHandler``).
    case text
    /// One JSON object per line on stderr (``JSONLogHandler``).
    case json
    /// Structured records sent to the systemd journal (``JournalLogHandler``).
    case journal
}
