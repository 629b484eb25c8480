import Foundation
import NIOCore
import Synchronization

@testable import MetricsdHTTP

/// What the test endpoints of ``TestConnection`` share with the test.
final class EndpointsState: Sendable {
    /// `/later` requests waiting for ``TestConnection/answer(_:)``.
    let pending = Mutex<[@Sendable (Endpoint.Answer) -> Void]>([])
    /// Calls of `/count`.
    let counted = Mutex(0)
}

/// The first handler of the pipeline: counts the reads that reach the socket, and drops what is written after
/// the close as a socket would (an `EmbeddedChannel` keeps collecting writes after it is closed).
final class ReadCounter: ChannelOutboundHandler, @unchecked Sendable {  // used on the channel's event loop only
    typealias OutboundIn = NIOAny
    private(set) var reads = 0

    func read(context: ChannelHandlerContext) {
        self.reads += 1
        context.read()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard context.channel.isActive else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(data, promise: promise)
    }
}

/// One HTTP/1.1 response as written.
struct WireReply: CustomStringConvertible {
    let status: Int
    /// Header names lowercased.
    let headers: [String: String]
    let body: [UInt8]

    var text: String { String(decoding: self.body, as: UTF8.self) }
    var description: String { "\(self.status) \(self.headers) \(self.text.prefix(100).debugDescription)" }

    /// The reply at the start of `bytes` and its length, once whole; `bodyless` for a reply to HEAD.
    static func parse(_ bytes: ArraySlice<UInt8>, bodyless: Bool) -> (WireReply, Int)? {
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
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let bodyStart = end + 4
        let length = bodyless ? 0 : Int(headers["content-length"] ?? "0") ?? 0
        guard bytes.endIndex - bodyStart >= length else { return nil }
        return (WireReply(status: status, headers: headers, body: Array(bytes[bodyStart..<(bodyStart + length)])), bodyStart + length - start)
    }
}
