import Glibc

/// The service manager's side of the notify protocol, for tests: an `AF_UNIX` `SOCK_DGRAM` socket with
/// `SO_PASSCRED`, so each datagram arrives with its sender's pid (the kernel fills it in; senders cannot forge it).
///
/// Set `NOTIFY_SOCKET` to ``address`` in the environment of the code under test (a child process, or this
/// process inside a serialized suite), then read datagrams with ``receive(timeoutMilliseconds:)``.
/// Shared by the test targets (`NotifyTestSupport`); Glibc only.
public final class NotifySocket {
    /// The socket's file descriptor.
    public let fd: Int32
    /// The value for `NOTIFY_SOCKET`: `@name` (abstract namespace) or an absolute path.
    public let address: String
    /// The file to remove on deinit (path form only).
    private let path: String?

    /// Binds `@abstractName` in the abstract namespace: no file, nothing to clean up.
    public convenience init(abstractName: String) throws {
        try self.init(name: Array(abstractName.utf8), abstract: true, address: "@" + abstractName, path: nil)
    }

    /// Binds a socket file at `path` (absolute, at most 107 bytes); an existing file there is replaced.
    public convenience init(path: String) throws {
        unlink(path)
        try self.init(name: Array(path.utf8), abstract: false, address: path, path: path)
    }

    private init(name: [UInt8], abstract: Bool, address: String, path: String?) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw NotifySocketError(errno: errno) }
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let offset = abstract ? 1 : 0  // abstract: a NUL byte, then the name, no trailing NUL
        guard offset + name.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            close(fd)
            throw NotifySocketError(errno: ENAMETOOLONG)
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { sunPath in
            sunPath[0] = 0
            sunPath.baseAddress!.advanced(by: offset).copyMemory(from: name, byteCount: name.count)
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + offset + name.count + (abstract ? 0 : 1))
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard rc == 0 else {
            let error = errno
            close(fd)
            throw NotifySocketError(errno: error)
        }
        (self.fd, self.address, self.path) = (fd, address, path)
    }

    deinit {
        close(self.fd)
        if let path = self.path {
            unlink(path)
        }
    }

    /// The next datagram and its sender's pid (-1 if no credentials came with it), or nil after the timeout.
    public func receive(timeoutMilliseconds: Int32) -> (message: String, pid: pid_t)? {
        var poller = pollfd(fd: self.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, timeoutMilliseconds) == 1 else { return nil }
        var data = [UInt8](repeating: 0, count: 4096)
        var control = [UInt8](repeating: 0, count: 64)
        return data.withUnsafeMutableBytes { dataBytes in
            control.withUnsafeMutableBytes { controlBytes in
                var iov = iovec(iov_base: dataBytes.baseAddress, iov_len: dataBytes.count)
                return withUnsafeMutablePointer(to: &iov) { iovPointer in
                    var header = msghdr()
                    (header.msg_iov, header.msg_iovlen) = (iovPointer, 1)
                    (header.msg_control, header.msg_controllen) = (controlBytes.baseAddress, controlBytes.count)
                    let count = recvmsg(self.fd, &header, 0)
                    guard count >= 0 else { return nil }
                    // 64-bit cmsghdr: len (8 bytes), level (4), type (4); then struct ucred { pid, uid, gid }.
                    // SCM_CREDENTIALS (2) is not imported into Swift.
                    let hasControl = header.msg_controllen >= 16 + MemoryLayout<pid_t>.size
                    let isCredentials =
                        hasControl
                        && controlBytes.load(fromByteOffset: 8, as: Int32.self) == SOL_SOCKET
                        && controlBytes.load(fromByteOffset: 12, as: Int32.self) == 2
                    let pid = isCredentials ? controlBytes.load(fromByteOffset: 16, as: pid_t.self) : -1
                    return (String(decoding: dataBytes.prefix(count), as: UTF8.self), pid)
                }
            }
        }
    }

    /// Every datagram that arrives until none has come for `quietMilliseconds`.
    public func receiveAll(quietMilliseconds: Int32) -> [(message: String, pid: pid_t)] {
        var datagrams: [(message: String, pid: pid_t)] = []
        while let datagram = self.receive(timeoutMilliseconds: quietMilliseconds) {
            datagrams.append(datagram)
        }
        return datagrams
    }
}

/// A socket call failed while setting up a ``NotifySocket``.
public struct NotifySocketError: Error {
    public let errno: Int32
    public init(errno: Int32) { self.errno = errno }
}
