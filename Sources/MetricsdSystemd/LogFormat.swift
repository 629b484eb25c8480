/// Where and how log records are written (`METRICSD_LOG_FORMAT`).
public enum LogFormat: String, Sendable, CaseIterable {
    /// One readable line per record on stderr (``TextLines``).
    case text
    /// One JSON object per line on stderr (``JSONLines``).
    case json
    /// Structured records sent to the systemd journal (``JournalEntries``).
    case journal
}
