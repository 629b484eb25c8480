import Glibc
import Logging
import MetricsdSystemd
import NotifyTestSupport
import Testing

extension ProcessStateTests {
    /// The real `sd_notify` path: this process sets `NOTIFY_SOCKET` to a socket it binds and acts as the manager.
    @Suite struct SystemdNotifierTests {
        /// Runs `body` with a fresh abstract notify socket in `NOTIFY_SOCKET` and a notifier created under it.
        private func withManager(
            logger: Logger? = nil,
            _ body: (SystemdNotifier, NotifySocket) throws -> Void
        ) throws {
            let socket = try NotifySocket(abstractName: uniqueName("metricsd-notify-test"))
            try withEnvironment(["NOTIFY_SOCKET": socket.address]) {
                try body(SystemdNotifier(logger: logger), socket)
            }
        }

        @Test func readyArrivesFromThisProcessWithOneLineStatus() throws {
            try self.withManager { notifier, socket in
                #expect(notifier.isEnabled)
                notifier.ready(status: "serving on 127.0.0.1:8080;\nzones: 3\r\n")
                let datagram = try #require(socket.receive(timeoutMilliseconds: 2_000))
                #expect(datagram.message == "READY=1\nSTATUS=serving on 127.0.0.1:8080; zones: 3  ")
                #expect(datagram.pid == getpid())
            }
        }

        @Test func pathFormOfNotifySocketWorks() throws {
            let path = "/tmp/\(uniqueName("metricsd-notify")).sock"
            let socket = try NotifySocket(path: path)
            try withEnvironment(["NOTIFY_SOCKET": path]) {
                SystemdNotifier().status("migrating 3/7")
                let datagram = try #require(socket.receive(timeoutMilliseconds: 2_000))
                #expect(datagram.message == "STATUS=migrating 3/7")
                #expect(datagram.pid == getpid())
            }
        }

        /// `sd_notify(1, …)` would unset `NOTIFY_SOCKET` after the first message; every message must arrive.
        @Test func laterMessagesStillArrive() throws {
            try self.withManager { notifier, socket in
                notifier.ready(status: "serving")
                notifier.watchdogPing()
                notifier.watchdogPing()
                notifier.stopping(status: "draining 2 requests")
                let messages = socket.receiveAll(quietMilliseconds: 300).map(\.message)
                #expect(
                    messages == [
                        "READY=1\nSTATUS=serving", "WATCHDOG=1", "WATCHDOG=1", "STOPPING=1\nSTATUS=draining 2 requests",
                    ])
                #expect(getenv("NOTIFY_SOCKET") != nil)
                #expect(SystemdNotifier().isEnabled)
            }
        }

        @Test func reloadingSendsMonotonicTimeInTheSameDatagram() throws {
            try self.withManager { notifier, socket in
                let before = SystemdNotifier.monotonicMicroseconds()
                notifier.reloading()
                let after = SystemdNotifier.monotonicMicroseconds()
                let datagrams = socket.receiveAll(quietMilliseconds: 300)
                try #require(datagrams.count == 1)
                let lines = datagrams[0].message.split(separator: "\n").map(String.init)
                #expect(lines.count == 2)
                #expect(lines.first == "RELOADING=1")
                let stamp = try #require(lines.last?.split(separator: "=", maxSplits: 1))
                #expect(stamp.first == "MONOTONIC_USEC")
                let microseconds = try #require(UInt64(String(stamp.last ?? "")))
                #expect(microseconds >= before && microseconds <= after)
            }
        }

        @Test func reloadingWithStatusIsStillOneDatagram() throws {
            try self.withManager { notifier, socket in
                notifier.reloading(status: "reloading\nconfiguration")
                let datagrams = socket.receiveAll(quietMilliseconds: 300)
                try #require(datagrams.count == 1)
                #expect(datagrams[0].message.hasPrefix("RELOADING=1\nSTATUS=reloading configuration\nMONOTONIC_USEC="))
            }
        }

        @Test func typedMessagesHaveTheProtocolsWording() throws {
            try self.withManager { notifier, socket in
                notifier.extendTimeout(microseconds: 9_000_000)
                notifier.extendTimeout(by: .milliseconds(2_500))
                notifier.watchdogTrigger()
                notifier.fatal(status: "Failed: address already in use\n127.0.0.1:8080", errno: 98)
                let messages = socket.receiveAll(quietMilliseconds: 300).map(\.message)
                #expect(
                    messages == [
                        "EXTEND_TIMEOUT_USEC=9000000",
                        "EXTEND_TIMEOUT_USEC=2500000",
                        "WATCHDOG=trigger",
                        "STATUS=Failed: address already in use 127.0.0.1:8080\nERRNO=98",
                    ]
                )
            }
        }

        @Test func mainPIDIsNeverSent() throws {
            try self.withManager { notifier, socket in
                notifier.notify("MAINPID=1")
                notifier.notify("STATUS=x\nMAINPID=42\nREADY=1")
                let messages = socket.receiveAll(quietMilliseconds: 300).map(\.message)
                #expect(messages == ["STATUS=x\nREADY=1"])
            }
        }

        @Test func withoutNotifySocketNothingIsSentOrLogged() {
            let capture = LogCapture()
            withEnvironment(["NOTIFY_SOCKET": nil]) {
                let notifier = SystemdNotifier(logger: capture.logger())
                #expect(!notifier.isEnabled)
                notifier.ready(status: "serving")
                notifier.watchdogPing()
            }
            #expect(capture.entries.isEmpty)
        }

        @Test func aFailedSendIsLoggedOnce() {
            let capture = LogCapture()
            withEnvironment(["NOTIFY_SOCKET": "/nonexistent/\(uniqueName("metricsd")).sock"]) {
                let notifier = SystemdNotifier(logger: capture.logger())
                #expect(notifier.isEnabled)
                notifier.ready(status: "serving")
                notifier.watchdogPing()
                let copy = notifier
                copy.watchdogPing()
            }
            let entries = capture.entries
            #expect(entries.count == 1)
            #expect(entries.first?.level == .warning)
            #expect(entries.first?.metadata["metricsd.notify.result"] == "\(-ENOENT)")
        }

        @Test func statusIsSanitizedToOneLine() {
            #expect(SystemdNotifier.sanitize("a\nb\r\nc\0d") == "a b  cd")
            #expect(SystemdNotifier.sanitize("serving on [::1]:8080") == "serving on [::1]:8080")
        }
    }
}
