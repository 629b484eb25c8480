import Logging
import Synchronization

/// The one current log level, shared by every handler ``LogSetup`` makes, so a reload (SIGHUP) changes the level
/// of every logger at once.
///
/// - Note: Setting `logLevel` on any `Logger` whose handler came from ``LogSetup`` sets this box, so it changes the
///   level of every such logger. swift-log allows this global override; it means log levels are not per-`Logger`
///   values in metricsd.
public final class LogLevelBox: Sendable {
    private let storage: Mutex<Logger.Level>

    /// A box holding `level`.
    public init(_ level: Logger.Level) {
        self.storage = Mutex(level)
    }

    /// The current level; safe to read and set from any thread.
    public var level: Logger.Level {
        get { self.storage.withLock { $0 } }
        set { self.storage.withLock { $0 = newValue } }
    }
}
