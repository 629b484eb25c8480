import Metrics
import Synchronization

/// Whether the daemon hears notifications (settings changes, recompute wake-ups) or polls for them, for `/readyz`'s
/// detail and the `metricsd_notifications_usable` series. Set by the ``SettingsListener``.
public final class NotificationStatus: Sendable {
    private let state = Mutex<String?>(nil)
    private let gauge = Gauge(label: "metricsd_notifications_usable")

    public init() {}

    /// `listening`, `polling every N s: why`, or nil before the listener has found out.
    public var detail: String? { self.state.withLock { $0 } }

    func listening() {
        self.state.withLock { $0 = "listening" }
        self.gauge.record(1)
    }

    func polling(every seconds: Double, because reason: String) {
        self.state.withLock { $0 = "polling every \(Self.format(seconds)) s: \(reason)" }
        self.gauge.record(0)
    }

    private static func format(_ seconds: Double) -> String {
        seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds)
    }
}
