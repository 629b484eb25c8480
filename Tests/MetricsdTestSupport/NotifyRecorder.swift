import Foundation
import Glibc
import MetricsdSystemd
import NotifyTestSupport
import Synchronization

/// The service manager's side of a daemon's life: a ``NotifySocket`` read by a background thread that records
/// every datagram with its sender's pid and the `CLOCK_MONOTONIC` time it arrived, so a test can wait for a
/// message and later look at the whole sequence.
///
/// ```swift
/// let manager = try NotifyRecorder(abstract: true)
/// defer { manager.stop() }
/// let daemon = try DaemonProcess(environment: [... "NOTIFY_SOCKET": manager.address])
/// let ready = try #require(await manager.first(timeout: .seconds(30)) { $0.has("READY=1") })
/// ```
package final class NotifyRecorder: Sendable {
    /// One datagram as the manager saw it.
    package struct Datagram: Sendable, CustomStringConvertible {
        package let message: String
        /// The sender's pid from `SCM_CREDENTIALS` (-1 when none came).
        package let pid: pid_t
        /// `CLOCK_MONOTONIC` in µs when the datagram was read.
        package let receivedAt: UInt64
        /// The `KEY=value` lines.
        package var lines: [String] { self.message.split(separator: "\n").map(String.init) }

        /// Whether a line is exactly `line` (e.g. `READY=1`).
        package func has(_ line: String) -> Bool { self.lines.contains(line) }

        /// The value of `KEY=`, if the datagram has that key.
        package func value(_ key: String) -> String? {
            self.lines.first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
        }

        package var description: String { "[pid \(self.pid) at \(self.receivedAt)] \(self.message.debugDescription)" }
    }

    /// The value for `NOTIFY_SOCKET`.
    package let address: String
    private let shared: Shared

    /// Binds a fresh socket (abstract `@metricsd-test-<uuid>`, or a socket file under `METRICSD_TEST_TMP` or the
    /// temporary directory) and starts reading. `onReceive` runs on the reading thread before the datagram is
    /// recorded, so it sees the world at the moment the datagram arrived.
    package init(abstract: Bool = true, onReceive: (@Sendable (Datagram) -> Void)? = nil) throws {
        let name = "metricsd-test-" + UUID().uuidString.prefix(13).lowercased()
        let socket: NotifySocket
        if abstract {
            socket = try NotifySocket(abstractName: name)
        } else {
            let directory =
                ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
                ?? NSTemporaryDirectory()
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            socket = try NotifySocket(path: URL(fileURLWithPath: directory).appendingPathComponent(name + ".sock").path)
        }
        self.address = socket.address
        let shared = Shared()
        let reader = SocketReader(socket: socket)
        let thread = Thread {
            while shared.running.load(ordering: .relaxed) {
                guard let (message, pid) = reader.socket.receive(timeoutMilliseconds: 50) else { continue }
                let datagram = Datagram(message: message, pid: pid, receivedAt: SystemdNotifier.monotonicMicroseconds())
                onReceive?(datagram)
                shared.storage.withLock { $0.append(datagram) }
            }
            // The socket closes (and its file is removed) when `reader` goes away with this closure.
        }
        thread.name = "notify-manager"
        self.shared = shared
        thread.start()
    }

    /// Stops reading; the thread closes the socket within 50 ms. Call at the end of the test (never blocks).
    package func stop() {
        self.shared.running.store(false, ordering: .relaxed)
    }

    /// Every datagram so far, in arrival order.
    package var datagrams: [Datagram] { self.shared.storage.withLock { $0 } }

    /// Datagrams received after the first `index` ones.
    package func datagrams(from index: Int) -> [Datagram] {
        self.shared.storage.withLock { Array($0.dropFirst(index)) }
    }

    /// How many datagrams arrived so far.
    package var count: Int { self.shared.storage.withLock { $0.count } }

    /// The first datagram (at or after `index`) that matches, waiting up to `timeout`; nil if none came.
    package func first(
        from index: Int = 0, timeout: Duration, where matches: (Datagram) -> Bool
    ) async -> Datagram? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let found = self.datagrams(from: index).first(where: matches) { return found }
            if ContinuousClock.now >= deadline { return nil }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// All datagrams as text, for failure messages.
    package var transcript: String { self.datagrams.map(\.description).joined(separator: "\n") }
}

/// What the reading thread and the test share.
private final class Shared: Sendable {
    package let storage = Mutex<[NotifyRecorder.Datagram]>([])
    package let running = Atomic<Bool>(true)
}

/// Hands the (non-Sendable) socket to the one thread that reads it.
private final class SocketReader: @unchecked Sendable {
    package let socket: NotifySocket
    package init(socket: NotifySocket) { self.socket = socket }
}
