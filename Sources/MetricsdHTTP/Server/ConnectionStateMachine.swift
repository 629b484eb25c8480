import NIOCore
import NIOHTTP1

/// The life of one HTTP/1.1 connection as ``HTTPConnectionHandler`` sees it, behind NIO's server pipeline.
///
/// NIO's `HTTPServerPipelineHandler` hands over one request at a time and holds back pipelined requests (and
/// stops reading) until the reply before them has ended; it also orders a half-close behind them and closes an
/// idle connection on graceful shutdown. This machine adds what an API server needs on top: a body limit, a
/// deadline in every state that waits for the client, back-pressure on replies, and the decisions to close.
///
/// Every event is a method that moves the state and returns what the handler must do; the handler performs the
/// actions and nothing else. There are no flags beside ``state``.
struct ConnectionStateMachine {
    /// What the machine keeps of the request being answered.
    struct Exchange: Equatable {
        /// The client may send another request after this one (HTTP/1.1 without `Connection: close`, or an
        /// HTTP/1.0 keep-alive).
        var keepAlive: Bool
        /// The connection ends after this reply whatever the client asked: an Upgrade or CONNECT (NIO's decoder
        /// parses nothing after them), a refused request whose body was not read, or a client that half-closed.
        var closeAfter: Bool
        /// The request's end arrived (false while the body of a refused request is still coming).
        var requestEnded: Bool
        /// HEAD (or CONNECT): the reply carries the headers of a GET and no body.
        var bodyless: Bool
        /// An HTTP/1.0 client asked to keep the connection: the reply says `Connection: keep-alive`.
        var announcesKeepAlive: Bool

        init(_ head: HTTPRequestHead) {
            self.keepAlive = head.isKeepAlive
            self.closeAfter = ConnectionStateMachine.endsTheProtocol(head)
            self.requestEnded = false
            self.bodyless = head.method == .HEAD || head.method == .CONNECT
            self.announcesKeepAlive = head.version.major == 1 && head.version.minor == 0 && head.isKeepAlive
        }
    }

    enum State: Equatable {
        /// Waiting for a request head; the connection is closed at `deadline`.
        case idle(deadline: NIODeadline)
        /// A head arrived; its body is being read until `deadline`.
        case receiving(HTTPRequestHead, body: ByteBuffer?, Exchange, deadline: NIODeadline)
        /// The dispatcher is answering. No deadline of the connection's: every handler is bounded (the database
        /// statement deadline), and shutdown cancels them.
        case responding(Exchange)
        /// A reply's head and body are written and the channel is not writable: its end (which lets the next
        /// request in) waits until it is, or until `deadline`.
        case blocked(closeAfter: Bool, deadline: NIODeadline)
        /// A reply that closes the connection is being written; nothing more is read or dispatched. Closed when
        /// it is flushed, or at `deadline`.
        case closing(deadline: NIODeadline)
        case closed
    }

    /// Why a request is answered by the connection before (or instead of) its body being read.
    enum Refusal: Equatable {
        /// The body is, or is declared to be, over the limit (413).
        case bodyTooLarge
        /// An `Expect` other than `100-continue` (417).
        case expectationFailed
    }

    /// What the handler does after an inbound event.
    enum Action: Equatable {
        case none
        /// Answer this whole request.
        case dispatch(HTTPRequestHead, ByteBuffer)
        /// Answer this request with a refusal; the connection closes after it.
        case refuse(HTTPRequestHead, Refusal)
        /// Send `100 Continue`: the client waits for it before sending the body.
        case sendContinue
        /// Close the connection now.
        case close
        /// Answer `400 Bad Request`, then close once it is flushed (the closing state's deadline applies).
        case refuseUnparsable
    }

    /// How the handler writes a reply that is ready, and what the request asked of its form.
    struct ReplyPlan: Equatable {
        var action: ReplyAction
        /// No body (HEAD): the head still says GET's `Content-Length`.
        var bodyless: Bool
        /// Say `Connection: keep-alive` (an HTTP/1.0 client that asked for it).
        var announcesKeepAlive: Bool

        static let discard = ReplyPlan(action: .discard, bodyless: false, announcesKeepAlive: false)
    }

    enum ReplyAction: Equatable {
        /// Head, body and end: the next request may come in.
        case writeAndEnd
        /// Head and body; the end waits for writability (``writabilityChanged(isWritable:now:)``).
        case writeAndHold
        /// Head, body and end, saying `Connection: close`; then close after the flush.
        case writeAndClose
        /// The connection is gone or closing: drop the reply.
        case discard
    }

    /// What the handler does when the channel's writability changes.
    enum WritabilityAction: Equatable {
        case none
        /// Write the held reply's end; the next request may come in.
        case end
        /// Write the held reply's end, then close after the flush.
        case endAndClose
    }

    /// Bodies above this are refused with 413.
    let maxBodySize: Int
    let timeouts: HTTPTimeouts
    private(set) var state: State

    /// A new connection: its first head must arrive within the request timeout.
    init(timeouts: HTTPTimeouts, maxBodySize: Int, now: NIODeadline) {
        self.timeouts = timeouts
        self.maxBodySize = maxBodySize
        self.state = .idle(deadline: now + timeouts.request)
    }

    /// When the connection is closed unless something happens first; nil while the server works on a request.
    var deadline: NIODeadline? {
        switch self.state {
        case .idle(let deadline), .receiving(_, _, _, let deadline), .blocked(_, let deadline), .closing(let deadline):
            deadline
        case .responding, .closed:
            nil
        }
    }

    /// Whether reads should reach the socket: not while closing (what follows a closing reply is never read;
    /// NIO's pipeline handler already holds reads while a reply is pending).
    var readsAllowed: Bool {
        switch self.state {
        case .closing, .closed: false
        default: true
        }
    }

    // MARK: Inbound

    mutating func head(_ head: HTTPRequestHead, now: NIODeadline) -> Action {
        guard case .idle = self.state else { return .none }  // closing: dropped; a refused request's tail: dropped
        var exchange = Exchange(head)
        let declared = head.headers.first(name: "content-length").flatMap { Int($0) }
        if let declared, declared > self.maxBodySize {
            exchange.closeAfter = true
            self.state = .responding(exchange)
            return .refuse(head, .bodyTooLarge)
        }
        self.state = .receiving(head, body: nil, exchange, deadline: now + self.timeouts.request)
        if let expectation = head.headers.first(name: "expect") {
            guard expectation.lowercased() == "100-continue" else {
                exchange.closeAfter = true
                self.state = .responding(exchange)
                return .refuse(head, .expectationFailed)
            }
            // RFC 9110 §10.1.1: an HTTP/1.0 client cannot expect 100; nor is it needed without a body.
            let hasBody = (declared ?? 0) > 0 || head.headers.contains(name: "transfer-encoding")
            if head.version.major > 1 || head.version.minor >= 1, hasBody { return .sendContinue }
        }
        return .none
    }

    mutating func body(_ chunk: ByteBuffer) -> Action {
        guard case .receiving(let head, var body, var exchange, let deadline) = self.state else { return .none }
        self.state = .closed  // (not observable: replaced below; avoids a copy of the body while appending)
        if body == nil {
            body = chunk
        } else {
            var chunk = chunk
            body!.writeBuffer(&chunk)
        }
        if body!.readableBytes > self.maxBodySize {
            exchange.closeAfter = true
            self.state = .responding(exchange)
            return .refuse(head, .bodyTooLarge)
        }
        self.state = .receiving(head, body: body, exchange, deadline: deadline)
        return .none
    }

    mutating func end() -> Action {
        switch self.state {
        case .receiving(let head, let body, var exchange, _):
            exchange.requestEnded = true
            self.state = .responding(exchange)
            return .dispatch(head, body ?? ByteBuffer())
        case .responding(var exchange) where !exchange.requestEnded:
            exchange.requestEnded = true  // a refused request's end: nothing more to drop
            self.state = .responding(exchange)
            return .none
        default:
            return .none
        }
    }

    /// The client closed its side (NIO's pipeline handler delivers this after the requests before it).
    mutating func inputClosed() -> Action {
        switch self.state {
        case .idle, .receiving:
            self.state = .closed
            return .close
        case .responding, .blocked, .closing, .closed:
            return self.closeAfterTheExchange()
        }
    }

    /// A request could not be parsed: nothing after it can be framed. NIO's pipeline handler delivers the error
    /// after the replies to the requests before it, so it is answered 400 unless the connection is already
    /// closing (bytes after a `Connection: close` request or a 413 are not answered).
    mutating func parseError(now: NIODeadline) -> Action {
        switch self.state {
        case .idle, .receiving:
            self.state = .closing(deadline: now + self.timeouts.write)
            return .refuseUnparsable
        case .responding, .blocked, .closing, .closed:
            return self.closeAfterTheExchange()
        }
    }

    /// The exchange in progress (a reply being produced, or one held back) is the connection's last: it closes
    /// once that reply is written. Nothing to do when it is closing already.
    private mutating func closeAfterTheExchange() -> Action {
        switch self.state {
        case .responding(var exchange):
            exchange.closeAfter = true
            self.state = .responding(exchange)
        case .blocked(_, let deadline):
            self.state = .blocked(closeAfter: true, deadline: deadline)
        case .idle, .receiving, .closing, .closed:
            break
        }
        return .none
    }

    /// The timer fired: close if the state's deadline has passed.
    mutating func timerFired(now: NIODeadline) -> Action {
        guard let deadline = self.deadline, deadline <= now else { return .none }
        self.state = .closed
        return .close
    }

    mutating func channelInactive() {
        self.state = .closed
    }

    // MARK: Outbound

    /// The dispatcher's reply to the current request is ready.
    mutating func replyReady(isWritable: Bool, now: NIODeadline) -> ReplyPlan {
        guard case .responding(let exchange) = self.state else { return .discard }
        var plan = ReplyPlan(
            action: .writeAndEnd, bodyless: exchange.bodyless, announcesKeepAlive: exchange.announcesKeepAlive)
        if exchange.closeAfter || !exchange.keepAlive || !exchange.requestEnded {
            self.state = .closing(deadline: now + self.timeouts.write)
            plan.action = .writeAndClose
            plan.announcesKeepAlive = false
        } else if isWritable {
            self.state = .idle(deadline: now + self.timeouts.idle)
        } else {
            self.state = .blocked(closeAfter: false, deadline: now + self.timeouts.write)
            plan.action = .writeAndHold
        }
        return plan
    }

    /// The dispatcher's reply is a streamed body (``BodyStream``): the connection ends after it, and its write
    /// deadline runs from each part written (``streamed(now:)``).
    mutating func streamReady(now: NIODeadline) -> ReplyPlan {
        guard case .responding(let exchange) = self.state else { return .discard }
        self.state = .closing(deadline: now + self.timeouts.write)
        return ReplyPlan(action: .writeAndClose, bodyless: exchange.bodyless, announcesKeepAlive: false)
    }

    /// A part of a streamed body was written: the client took the last one, so its write deadline starts again.
    mutating func streamed(now: NIODeadline) {
        guard case .closing = self.state else { return }
        self.state = .closing(deadline: now + self.timeouts.write)
    }

    mutating func writabilityChanged(isWritable: Bool, now: NIODeadline) -> WritabilityAction {
        guard isWritable, case .blocked(let closeAfter, _) = self.state else { return .none }
        if closeAfter {
            self.state = .closing(deadline: now + self.timeouts.write)
            return .endAndClose
        }
        self.state = .idle(deadline: now + self.timeouts.idle)
        return .end
    }

    /// Whether NIO's decoder stops parsing after this request (it leaves the connection to an upgrade handler,
    /// which this server has none of): CONNECT, or `Connection: upgrade` with an `Upgrade` header (RFC 9110
    /// §7.8 lets a server ignore the upgrade and answer in HTTP/1.1; the connection then ends after the reply).
    static func endsTheProtocol(_ head: HTTPRequestHead) -> Bool {
        if head.method == .CONNECT { return true }
        guard head.headers.contains(name: "upgrade") else { return false }
        return head.headers[canonicalForm: "connection"].contains { $0.lowercased() == "upgrade" }
    }
}
