internal import CLibPQ
import Glibc
import Synchronization

/// Sends the cancel requests of abandoned statements, each from a thread of its own, with nobody waiting for it.
///
/// libpq 15's `PQcancel` opens a new connection to the server, sends the request and waits for the server to close
/// that connection, with no time limit: against a server that accepts TCP but does not answer (stopped processes, a
/// frozen VM behind a live TCP stack) it waits until the server comes back. So the statement that gave up never
/// waits for it: it closes its own socket and hands the request here. A cancel still matters where the server does
/// answer it: a COMMIT waiting for a synchronous standby that is not connected ends only by a cancel (closing the
/// socket does not wake that backend), leaving the transaction committed locally.
///
/// At most ``limit`` requests are outstanding at once: against a frozen server each holds a thread until the server
/// answers; past the limit a request is dropped (counted in ``dropped``), as the earlier ones to that server have
/// not been answered either.
enum CancelRequests {
    static let limit = 4

    private static let outstanding = Atomic<Int>(0)
    private static let droppedCount = Atomic<Int>(0)

    /// Requests dropped because ``limit`` were outstanding, since the process started.
    static var dropped: Int { Self.droppedCount.load(ordering: .relaxed) }

    /// Requests sent and not yet answered.
    static var inFlight: Int { Self.outstanding.load(ordering: .relaxed) }

    /// Sends `cancel` (from `PQgetCancel`) from a detached thread and frees it there; frees it at once when
    /// ``limit`` requests are outstanding or no thread can be started.
    static func send(_ cancel: OpaquePointer) {
        let taken = Self.outstanding.add(1, ordering: .relaxed).newValue
        guard taken <= Self.limit else {
            Self.outstanding.subtract(1, ordering: .relaxed)
            Self.droppedCount.add(1, ordering: .relaxed)
            PQfreeCancel(cancel)
            return
        }
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        var thread = pthread_t()
        let started = pthread_create(
            &thread, &attributes,
            { argument in
                let cancel = OpaquePointer(argument!)
                var buffer = [CChar](repeating: 0, count: 256)
                _ = PQcancel(cancel, &buffer, Int32(buffer.count))
                PQfreeCancel(cancel)
                CancelRequests.outstanding.subtract(1, ordering: .relaxed)
                return nil
            }, UnsafeMutableRawPointer(cancel))
        if started != 0 {
            Self.outstanding.subtract(1, ordering: .relaxed)
            Self.droppedCount.add(1, ordering: .relaxed)
            PQfreeCancel(cancel)
        }
    }
}
