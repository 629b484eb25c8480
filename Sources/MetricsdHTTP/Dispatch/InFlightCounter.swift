import CoreMetrics
import Synchronization

/// Requests in flight, for overload shedding; also `metricsd_http_requests_in_flight` on `/metrics`.
package final class InFlightCounter: Sendable {
    private let count = Atomic<Int>(0)
    private let gauge = Gauge(label: "metricsd_http_requests_in_flight")

    package init() {}

    /// Takes a slot if fewer than `limit` are taken.
    func enter(limit: Int) -> Bool {
        let new = self.count.add(1, ordering: .relaxed).newValue
        if new > limit {
            self.count.subtract(1, ordering: .relaxed)
            return false
        }
        self.gauge.record(new)
        return true
    }

    func leave() {
        // (Concurrent enters and leaves may record out of order; the next change corrects the gauge.)
        self.gauge.record(self.count.subtract(1, ordering: .relaxed).newValue)
    }

    var current: Int { self.count.load(ordering: .relaxed) }
}
