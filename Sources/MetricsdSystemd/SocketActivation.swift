internal import CSystemd
import Glibc

/// The listening sockets systemd passes to the service (socket activation: `metricsd.socket`, and
/// `metricsd-internal.socket` when enabled), told apart by their `FileDescriptorName=`.
///
/// systemd keeps its own copy of each socket: connections that arrive while the service restarts or after it
/// crashed wait in the socket's backlog instead of being refused, and the next process accepts them. A unit with
/// several `ListenStream=` (IPv4 and IPv6, say) passes several sockets of one name: all of them are that listener's.
public struct SocketActivation: Sendable, Equatable {
    /// The name of the public listener's socket (`FileDescriptorName=public`); a socket unit without that setting
    /// is named after the unit, `metricsd.socket`, and is the public one too.
    public static let publicNames: Set<String> = ["public", "metricsd.socket"]
    /// The name of the internal listener's socket (`FileDescriptorName=internal`).
    public static let internalName = "internal"

    /// The public listener's descriptors, in the order systemd passed them; empty when it passed none.
    public var publicSockets: [Int32]
    /// The internal listener's descriptors; empty when systemd passed none.
    public var internalSockets: [Int32]

    public init(publicSockets: [Int32] = [], internalSockets: [Int32] = []) {
        self.publicSockets = publicSockets
        self.internalSockets = internalSockets
    }

    /// Whether systemd passed any socket.
    public var isActive: Bool { !self.publicSockets.isEmpty || !self.internalSockets.isEmpty }

    /// The sockets systemd passed to this process (`sd_listen_fds_with_names(3)`; `LISTEN_PID` must name this
    /// process), removing `LISTEN_FDS`, `LISTEN_PID` and `LISTEN_FDNAMES` from the environment. None when started
    /// without socket activation.
    /// - Throws: a ``SocketActivationError`` naming the socket: not a listening stream socket, or a name that is
    ///   neither public nor internal.
    public static func fromEnvironment() throws(SocketActivationError) -> SocketActivation {
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        let count = sd_listen_fds_with_names(1, &names)
        guard count > 0 else {
            if count < 0 {
                throw SocketActivationError(
                    "cannot read the sockets systemd passed: \(String(cString: strerror(-count)))")
            }
            return SocketActivation()
        }
        var passed: [(descriptor: Int32, name: String)] = []
        for index in 0..<Int(count) {
            let name = names?[index].map { String(cString: $0) } ?? "unknown"
            passed.append((SD_LISTEN_FDS_START + Int32(index), name))
            free(names?[index])
        }
        free(names)
        return try Self.classify(passed) { descriptor in
            sd_is_socket(descriptor, AF_UNSPEC, Int32(SOCK_STREAM.rawValue), 1) > 0
        }
    }

    /// Sorts passed descriptors into the public and internal listener; `isListeningStream` checks one.
    public static func classify(
        _ passed: [(descriptor: Int32, name: String)], isListeningStream: (Int32) -> Bool
    ) throws(SocketActivationError) -> SocketActivation {
        var activation = SocketActivation()
        for (descriptor, name) in passed {
            guard isListeningStream(descriptor) else {
                throw SocketActivationError(
                    "the socket \(name) from systemd is not a listening stream socket: use ListenStream=")
            }
            if name == Self.internalName {
                activation.internalSockets.append(descriptor)
            } else if Self.publicNames.contains(name) {
                activation.publicSockets.append(descriptor)
            } else {
                throw SocketActivationError(
                    "systemd passed a socket named \(name): name it FileDescriptorName=public or FileDescriptorName=internal"
                )
            }
        }
        return activation
    }
}

/// The sockets systemd passed cannot be used; the message says which and why.
public struct SocketActivationError: Error, CustomStringConvertible, Sendable {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { self.message }
}
