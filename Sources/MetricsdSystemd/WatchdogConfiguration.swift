internal import CSystemd

/// The service watchdog systemd expects this process to feed (`WatchdogSec=` → `WATCHDOG_USEC`).
public struct WatchdogConfiguration: Sendable, Equatable {
    /// The full watchdog timeout (`WATCHDOG_USEC`): systemd kills the service after this long without a ping.
    public let interval: Duration

    /// How often to ping: half of ``interval``, as sd_watchdog_enabled(3) recommends.
    public var pingInterval: Duration

    /// A configuration for a watchdog timeout of `interval`, pinged every `interval / 2`.
    public init(interval: Duration) {
        self.interval = interval
        self.pingInterval = interval / 2
    }

    /// The watchdog for this process according to `sd_watchdog_enabled(0, …)`, or `nil` when it is off.
    ///
    /// libsystemd reads `WATCHDOG_USEC` and honours `WATCHDOG_PID`: a watchdog meant for another process (one
    /// that inherited the variables) is reported as off. The environment is left unchanged.
    public static func fromEnvironment() -> WatchdogConfiguration? {
        var microseconds: UInt64 = 0
        guard sd_watchdog_enabled(0, &microseconds) > 0 else { return nil }
        return Self(microseconds: microseconds)
    }

    /// The same rules as ``fromEnvironment()`` applied to a given environment and pid, without libsystemd.
    ///
    /// `WATCHDOG_USEC` must be a positive decimal integer (not `UInt64.max`, systemd's "infinity");
    /// `WATCHDOG_PID`, when present, must be a valid pid equal to `pid`.
    public static func parse(environment: [String: String], pid: Int32) -> WatchdogConfiguration? {
        guard let text = environment["WATCHDOG_USEC"], let microseconds = Self.decimal(text) else { return nil }
        if let pidText = environment["WATCHDOG_PID"] {
            guard let target = Self.decimal(pidText), target > 0, target == UInt64(clamping: pid) else { return nil }
        }
        return Self(microseconds: microseconds)
    }

    private init?(microseconds: UInt64) {
        guard microseconds > 0, microseconds != UInt64.max, microseconds <= UInt64(Int64.max) else { return nil }
        self.init(interval: .microseconds(Int64(microseconds)))
    }

    /// Digits only: no sign, no spaces, no overflow.
    private static func decimal(_ text: String) -> UInt64? {
        guard !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else {
            return nil
        }
        return UInt64(text)
    }
}
