import MetricsdSystemd
import Testing

/// The sockets systemd passes, told apart by `FileDescriptorName=`. (Taking them from a real systemd is the
/// package's test, and from systemd's own `systemd-socket-activate` the daemon's: FrontDoorTests.)
@Suite struct SocketActivationTests {
    @Test func namesPickTheListener() throws {
        let both = try SocketActivation.classify([(3, "public"), (4, "internal")]) { _ in true }
        #expect(both == SocketActivation(publicSockets: [3], internalSockets: [4]))
        // A socket unit without FileDescriptorName= is named after the unit.
        #expect(
            try SocketActivation.classify([(3, "metricsd.socket")]) { _ in true }
                == SocketActivation(publicSockets: [3]))
        #expect(
            try SocketActivation.classify([(3, "internal")]) { _ in true } == SocketActivation(internalSockets: [3]))
        #expect(try !SocketActivation.classify([]) { _ in true }.isActive)
    }

    /// A unit with several ListenStream= (IPv4 and IPv6, one port) passes several sockets of one name: each is
    /// served by that listener.
    @Test func severalSocketsOfOneNameAreAllThatListeners() throws {
        let dualStack = try SocketActivation.classify([(3, "public"), (4, "public"), (5, "internal"), (6, "internal")])
        { _ in true }
        #expect(dualStack == SocketActivation(publicSockets: [3, 4], internalSockets: [5, 6]))
        let unnamed = try SocketActivation.classify([(3, "metricsd.socket"), (4, "metricsd.socket")]) { _ in true }
        #expect(unnamed == SocketActivation(publicSockets: [3, 4]))
    }

    @Test func whatCannotBeUsedIsOneClearError() {
        let cases: [([(descriptor: Int32, name: String)], String)] = [
            (
                [(3, "admin")],
                "systemd passed a socket named admin: name it FileDescriptorName=public or FileDescriptorName=internal"
            )
        ]
        for (passed, message) in cases {
            let error = #expect(throws: SocketActivationError.self) {
                try SocketActivation.classify(passed) { _ in true }
            }
            #expect(error?.message == message)
        }
        let error = #expect(throws: SocketActivationError.self) {
            try SocketActivation.classify([(3, "public")]) { _ in false }
        }
        #expect(error?.message == "the socket public from systemd is not a listening stream socket: use ListenStream=")
    }
}
