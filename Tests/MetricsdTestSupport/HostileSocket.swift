import Foundation
import Glibc

/// A TCP client that misbehaves on purpose: a tiny receive window, sends that stop when the peer stops reading,
/// half-closes, responses parsed off the wire exactly as sent (HEAD replies have no body). Non-blocking; waiting
/// polls with `Task.sleep`, so no thread is held.
package final class HostileSocket: @unchecked Sendable {  // used by one task at a time
    package let descriptor: Int32
    private var closed = false

    /// Connects to `127.0.0.1:port`; `receiveBuffer` (bytes) is set before connecting, so the window the client
    /// advertises stays that small.
    package init(port: Int, receiveBuffer: Int? = nil) throws {
        let descriptor = try RawHTTP.connectedSocket(port: port, receiveBuffer: receiveBuffer).get()
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        self.descriptor = descriptor
    }

    deinit { self.close() }

    package func close() {
        guard !self.closed else { return }
        self.closed = true
        Glibc.close(self.descriptor)
    }

    /// Sends as much of `bytes` as the socket takes now: the count (0 when the buffers are full), or nil when the
    /// peer closed or reset the connection.
    package func sendNow(_ bytes: [UInt8]) -> Int? {
        let sent = bytes.withUnsafeBytes { Glibc.send(self.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if sent >= 0 { return sent }
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : nil
    }

    /// Sends all of `text` within `timeout`; false when the peer closed or the buffers stayed full.
    @discardableResult
    package func send(_ text: String, timeout: Duration = .seconds(10)) async -> Bool {
        var bytes = Array(text.utf8)[...]
        let started = ContinuousClock.now
        while !bytes.isEmpty {
            guard let sent = self.sendNow(Array(bytes)) else { return false }
            bytes = bytes.dropFirst(sent)
            if sent == 0 {
                if ContinuousClock.now - started > timeout { return false }
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
        return true
    }

    /// Closes the sending side (a half-close): the server reads end of input after what was sent.
    package func shutdownWrite() { _ = shutdown(self.descriptor, Int32(SHUT_WR)) }

    package enum Read: Equatable {
        case data([UInt8])
        case nothing
        case closed
    }

    /// At most `limit` bytes that are readable now.
    package func readNow(limit: Int = 65536) -> Read {
        var buffer = [UInt8](repeating: 0, count: limit)
        let count = buffer.withUnsafeMutableBytes { recv(self.descriptor, $0.baseAddress, $0.count, 0) }
        if count > 0 { return .data(Array(buffer[0..<count])) }
        if count == 0 { return .closed }
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? .nothing : .closed
    }

    /// Reads whatever arrives until the peer closes (EOF or reset): everything read and how long it took, or nil
    /// for the time when it is still open after `timeout`. `chunk` and `pause` make a slow reader.
    package func readUntilClosed(timeout: Duration, chunk: Int = 65536, pause: Duration = .milliseconds(5)) async
        -> (bytes: [UInt8], after: Duration?)
    {
        let started = ContinuousClock.now
        var received: [UInt8] = []
        while ContinuousClock.now - started < timeout {
            switch self.readNow(limit: chunk) {
            case .closed: return (received, ContinuousClock.now - started)
            case .data(let bytes):
                received += bytes
                if chunk < 65536 { try? await Task.sleep(for: pause) }
            case .nothing: try? await Task.sleep(for: pause)
            }
        }
        return (received, nil)
    }

    /// Reads responses until `bodyless.count` of them arrived (each `true` entry answers a HEAD request, so its
    /// reply has no body whatever its `Content-Length`), the peer closed, or `timeout` passed.
    package func readResponses(bodyless: [Bool], timeout: Duration = .seconds(10)) async -> (
        responses: [WireResponse], closed: Bool
    ) {
        let started = ContinuousClock.now
        var buffer: [UInt8] = []
        var responses: [WireResponse] = []
        var closed = false
        while responses.count < bodyless.count, ContinuousClock.now - started < timeout {
            while responses.count < bodyless.count,
                let (response, used) = WireResponse.parse(buffer[...], bodyless: bodyless[responses.count])
            {
                responses.append(response)
                buffer.removeFirst(used)
            }
            if responses.count == bodyless.count || closed { break }
            switch self.readNow() {
            case .data(let bytes): buffer += bytes
            case .closed: closed = true
            case .nothing: try? await Task.sleep(for: .milliseconds(5))
            }
        }
        if !closed, responses.count == bodyless.count, case .closed = self.readNow() { closed = true }
        return (responses, closed)
    }
}

package struct HostileSocketError: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// One HTTP/1.1 response as it came off the wire.
package struct WireResponse: Sendable, CustomStringConvertible {
    package let status: Int
    /// Header names lowercased; a repeated header keeps its last value.
    package let headers: [String: String]
    package let body: [UInt8]

    package var text: String { String(decoding: self.body, as: UTF8.self) }
    package var description: String { "\(self.status) \(self.headers) \(self.text.prefix(200).debugDescription)" }

    /// The response at the start of `bytes` and how many bytes it took; nil until it is whole. A `bodyless` reply
    /// (to HEAD, or 1xx/204/304) ends with its head.
    package static func parse(_ bytes: ArraySlice<UInt8>, bodyless: Bool) -> (WireResponse, Int)? {
        let start = bytes.startIndex
        guard bytes.count >= 4,
            let end = (start...(bytes.endIndex - 4)).first(where: {
                bytes[$0] == 13 && bytes[$0 + 1] == 10 && bytes[$0 + 2] == 13 && bytes[$0 + 3] == 10
            })
        else { return nil }
        var lines = String(decoding: bytes[start..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { return nil }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        let bodyStart = end + 4
        if bodyless || (100..<200).contains(status) || status == 204 || status == 304 {
            return (WireResponse(status: status, headers: headers, body: []), bodyStart - start)
        }
        let length = headers["content-length"].flatMap { Int($0) } ?? 0
        guard bytes.endIndex - bodyStart >= length else { return nil }
        return (
            WireResponse(status: status, headers: headers, body: Array(bytes[bodyStart..<(bodyStart + length)])),
            bodyStart + length - start
        )
    }
}

/// What the kernel says about a process and its sockets.
package enum ProcessProbe {
    /// The resident set of `pid` in KiB (`VmRSS` of `/proc/PID/status`).
    package static func residentKiB(_ pid: Int32) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
        }
        return 0
    }

    /// Connections the server on `127.0.0.1:port` still holds open: its sockets in ESTABLISHED or CLOSE_WAIT (a
    /// socket the server closed is FIN_WAIT or gone, whatever the client does).
    package static func openServerConnections(port: Int) -> Int {
        guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return 0 }
        let local = ":" + String(format: "%04X", port)
        var count = 0
        for line in table.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count > 3, fields[1].hasSuffix(local) else { continue }
            if fields[3] == "01" || fields[3] == "08" { count += 1 }
        }
        return count
    }
}
