import MetricsdHTTP
import Testing

@testable import MetricsdCLI

/// What `check-config` takes from `systemctl show` about the socket units (the query itself needs systemd as
/// PID 1: the package's tests, debian/tests/frontdoor, run it beside the real service).
@Suite struct SystemdSocketsTests {
    /// Output as systemd 252 prints it for the three units (one `Listen=` line per `ListenStream=`).
    static let dualStackWithInternal = """
        Id=metricsd.socket
        LoadState=loaded
        ActiveState=active
        UnitFileState=enabled
        Listen=127.0.0.1:8080 (Stream)
        Listen=[::1]:8080 (Stream)

        Id=metricsd-internal.socket
        LoadState=loaded
        ActiveState=inactive
        UnitFileState=enabled
        Listen=127.0.0.1:8090 (Stream)
        Listen=/run/metricsd-internal.sock (Stream)
        Listen=127.0.0.1:5000 (Datagram)

        Id=metricsd.service
        LoadState=loaded
        ActiveState=active
        UnitFileState=enabled

        """

    @Test func theSocketsSystemdPasses() throws {
        let sockets = SystemdSockets.parse(Self.dualStackWithInternal)
        let publicSocket = try #require(sockets.publicSocket)
        #expect(publicSocket.isUsed && publicSocket.listen == ["127.0.0.1:8080", "[::1]:8080"])
        #expect(
            publicSocket.addresses.map(\.address) == [
                ListenAddress(host: "127.0.0.1", port: 8080), ListenAddress(host: "::1", port: 8080),
            ])
        // Enabled, not started: passed from the next boot (check-config says so).
        let internalSocket = try #require(sockets.internalSocket)
        #expect(internalSocket.isUsed && internalSocket.listen == ["127.0.0.1:8090", "/run/metricsd-internal.sock"])
        #expect(internalSocket.addresses.last?.address == ListenAddress(unixPath: "/run/metricsd-internal.sock"))
        #expect(sockets.serviceActive)
        #expect(sockets.passedSockets.public == 2 && sockets.passedSockets.internal == 2)
    }

    @Test func whatSystemdDoesNotPass() throws {
        let text = """
            Id=metricsd.socket
            LoadState=masked
            ActiveState=inactive
            UnitFileState=masked
            Listen=127.0.0.1:8080 (Stream)

            Id=metricsd-internal.socket
            LoadState=loaded
            ActiveState=inactive
            UnitFileState=disabled
            Listen=8090 (Stream)

            Id=metricsd.service
            LoadState=loaded
            ActiveState=inactive
            UnitFileState=enabled
            """
        let sockets = SystemdSockets.parse(text)
        #expect(sockets.publicSocket?.isUsed == false, "a masked socket is not passed")
        #expect(sockets.internalSocket?.isUsed == false, "a disabled, stopped socket is not passed")
        // A port alone: systemd listens on every address.
        #expect(sockets.internalSocket?.addresses.first?.address == ListenAddress(host: "::", port: 8090))
        #expect(!sockets.serviceActive)
        #expect(sockets.passedSockets.public == 0 && sockets.passedSockets.internal == 0)
        // Not installed at all.
        #expect(
            SystemdSockets.parse("Id=metricsd-internal.socket\nLoadState=not-found\nActiveState=inactive\n")
                .internalSocket?.isUsed == false)
    }
}
