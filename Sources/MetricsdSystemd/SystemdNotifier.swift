internal import CSystemd
import Glibc
import Logging
import Synchronization

/// Sends state changes to the service manager through `sd_notify(3)`.
///
/// Every message goes through `sd_notify(0, …)`: never `1`, because `unset_environment` removes `NOTIFY_SOCKET`
/// and every later message (watchdog pings, `STOPPING=1`) would silently go nowhere. `MAINPID=` is never sent:
/// metricsd is the process systemd started. Without `NOTIFY_SOCKET` every method is a no-op.
///
/// A failed send is logged once per notifier (copies share the flag); after that, failures are ignored.
public struct SystemdNotifier: Sendable {
    /// Whether `NOTIFY_SOCKET` was set (and not empty) in the process environment when the notifier was created.
    public let isEnabled: Bool

    private let logger: Logger?
    private let failureLogged: FailureLatch

    /// Creates a notifier for the service manager named by `NOTIFY_SOCKET`.
    ///
    /// - Parameter logger: Where the first failed send is reported; `nil` reports nothing.
    public init(logger: Logger? = nil) {
        if let socket = getenv("NOTIFY_SOCKET") {
            self.isEnabled = socket.pointee != 0
        } else {
            self.isEnabled = false
        }
        self.logger = logger
        self.failureLogged = FailureLatch()
    }

    /// Sends raw `KEY=value` lines in one datagram.
    ///
    /// Lines starting with `MAINPID=` are dropped and NUL bytes removed; the caller is responsible for the
    /// rest of the protocol. Prefer the typed methods below.
    public func notify(_ state: String) {
        guard self.isEnabled else { return }
        let lines = state.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !$0.hasPrefix("MAINPID=") }
        let message = lines.joined(separator: "\n").replacingNUL()
        guard !message.isEmpty else { return }
        let result = sd_notify(0, message)
        if result <= 0 {
            self.reportFailure(result: result, message: message)
        }
    }

    /// Readiness: `READY=1` with a status line, sent once start-up is really complete.
    public func ready(status: String) {
        self.notify("READY=1\nSTATUS=\(Self.sanitize(status))")
    }

    /// A new `STATUS=` line, shown by `systemctl status`.
    public func status(_ status: String) {
        self.notify("STATUS=\(Self.sanitize(status))")
    }

    /// Graceful stop has begun: `STOPPING=1` with a status line.
    public func stopping(status: String) {
        self.notify("STOPPING=1\nSTATUS=\(Self.sanitize(status))")
    }

    /// A reload has begun: `RELOADING=1` and `MONOTONIC_USEC=` (the current `CLOCK_MONOTONIC` time) in one
    /// datagram, as `Type=notify-reload` requires. Send it at once on SIGHUP and follow with ``ready(status:)``.
    ///
    /// - Parameter status: An optional status line sent in the same datagram.
    public func reloading(status: String? = nil) {
        var message = "RELOADING=1\n"
        if let status {
            message += "STATUS=\(Self.sanitize(status))\n"
        }
        message += "MONOTONIC_USEC=\(Self.monotonicMicroseconds())"
        self.notify(message)
    }

    /// Extends the current start-up, reload or stop timeout to `microseconds` from now (`EXTEND_TIMEOUT_USEC=`).
    public func extendTimeout(microseconds: UInt64) {
        self.notify("EXTEND_TIMEOUT_USEC=\(microseconds)")
    }

    /// Extends the current start-up, reload or stop timeout to `duration` from now (`EXTEND_TIMEOUT_USEC=`).
    public func extendTimeout(by duration: Duration) {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0 else { return }
        self.extendTimeout(microseconds: UInt64(seconds) * 1_000_000 + UInt64(attoseconds / 1_000_000_000_000))
    }

    /// A watchdog keep-alive ping (`WATCHDOG=1`). Send it only while the service is genuinely working.
    public func watchdogPing() {
        self.notify("WATCHDOG=1")
    }

    /// Asks systemd to treat the watchdog as expired now (`WATCHDOG=trigger`): a self-detected fatal state.
    public func watchdogTrigger() {
        self.notify("WATCHDOG=trigger")
    }

    /// A fatal start-up error: `STATUS=<status>` and `ERRNO=<errno>` in one datagram. Exit non-zero afterwards.
    public func fatal(status: String, errno: Int32) {
        self.notify("STATUS=\(Self.sanitize(status))\nERRNO=\(errno)")
    }

    /// Makes `text` one line: carriage returns and newlines become spaces, NUL bytes are removed.
    public static func sanitize(_ text: String) -> String {
        var result = ""
        result.unicodeScalars.reserveCapacity(text.unicodeScalars.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n", "\r", "\t": result.unicodeScalars.append(" ")
            case "\0": continue
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    /// The current `CLOCK_MONOTONIC` time in microseconds, as systemd reads it.
    public static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    private func reportFailure(result: Int32, message: String) {
        guard self.failureLogged.fireOnce(), let logger = self.logger else { return }
        let reason = result < 0 ? String(cString: strerror(-result)) : "NOTIFY_SOCKET is no longer set"
        logger.warning(
            "sd_notify failed; further failures are not logged",
            metadata: [
                "metricsd.notify.result": "\(result)",
                "metricsd.notify.reason": "\(reason)",
                "metricsd.notify.first": "\(message.prefix(while: { $0 != "\n" && $0 != "=" }))",
            ]
        )
    }
}

/// A flag that is set once and shared by every copy of a notifier.
private final class FailureLatch: Sendable {
    private let fired = Atomic<Bool>(false)

    /// Returns `true` the first time only.
    func fireOnce() -> Bool {
        !self.fired.exchange(true, ordering: .relaxed)
    }
}

extension String {
    fileprivate func replacingNUL() -> String {
        guard self.utf8.contains(0) else { return self }
        return String(String.UnicodeScalarView(self.unicodeScalars.filter { $0 != "\0" }))
    }
}
