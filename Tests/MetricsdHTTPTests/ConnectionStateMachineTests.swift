import NIOCore
import NIOHTTP1
import Testing

@testable import MetricsdHTTP

/// Every transition of ``ConnectionStateMachine``, as plain values: no channel, no clock.
@Suite struct ConnectionStateMachineTests {
    typealias Machine = ConnectionStateMachine
    static let timeouts = HTTPTimeouts(request: .seconds(1), idle: .seconds(2), write: .seconds(3))
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    static func machine() -> Machine {
        Machine(timeouts: Self.timeouts, maxBodySize: 16, now: Self.start)
    }

    static func head(
        _ method: HTTPMethod = .GET, _ uri: String = "/healthz", version: HTTPVersion = .http1_1,
        _ headers: [(String, String)] = []
    ) -> HTTPRequestHead {
        HTTPRequestHead(version: version, method: method, uri: uri, headers: HTTPHeaders(headers))
    }

    /// A machine answering `head` (its end received).
    static func responding(_ head: HTTPRequestHead = Self.head()) -> Machine {
        var machine = Self.machine()
        _ = machine.head(head, now: Self.start)
        _ = machine.end()
        return machine
    }

    @Test func aNewConnectionWaitsForAHeadWithinTheRequestTimeout() {
        let machine = Self.machine()
        #expect(machine.state == .idle(deadline: Self.start + .seconds(1)))
        #expect(machine.deadline == Self.start + .seconds(1))
        #expect(machine.readsAllowed)
    }

    @Test func aHeadStartsTheBodyDeadlineAndItsEndDispatches() {
        var machine = Self.machine()
        let head = Self.head(.POST, "/x", [("Content-Length", "3")])
        let later = Self.start + .milliseconds(500)
        #expect(machine.head(head, now: later) == .none)
        #expect(machine.deadline == later + .seconds(1))
        #expect(machine.body(ByteBuffer(string: "ab")) == .none)
        #expect(machine.body(ByteBuffer(string: "c")) == .none)
        #expect(machine.end() == .dispatch(head, ByteBuffer(string: "abc")))
        #expect(machine.deadline == nil, "no deadline of the connection's while the server answers")
        guard case .responding(let exchange) = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        #expect(exchange.keepAlive && !exchange.closeAfter && exchange.requestEnded && !exchange.bodyless)
    }

    @Test func aKeepAliveReplyWrittenWhileWritableStartsTheIdleTimeout() {
        var machine = Self.responding()
        let now = Self.start + .seconds(5)
        let plan = machine.replyReady(isWritable: true, now: now)
        #expect(plan == Machine.ReplyPlan(action: .writeAndEnd, bodyless: false, announcesKeepAlive: false))
        #expect(machine.state == .idle(deadline: now + .seconds(2)))
    }

    @Test func aReplyWhileNotWritableHoldsItsEndUntilWritableWithinTheWriteTimeout() {
        var machine = Self.responding()
        let now = Self.start + .seconds(5)
        #expect(machine.replyReady(isWritable: false, now: now).action == .writeAndHold)
        #expect(machine.state == .blocked(closeAfter: false, deadline: now + .seconds(3)))
        #expect(machine.writabilityChanged(isWritable: false, now: now) == .none)
        let writable = now + .seconds(1)
        #expect(machine.writabilityChanged(isWritable: true, now: writable) == .end)
        #expect(machine.state == .idle(deadline: writable + .seconds(2)))
        #expect(machine.writabilityChanged(isWritable: true, now: writable) == .none, "nothing held any more")
    }

    @Test func aBlockedReplyThatNeverDrainsIsClosedAtTheWriteTimeout() {
        var machine = Self.responding()
        _ = machine.replyReady(isWritable: false, now: Self.start)
        #expect(machine.timerFired(now: Self.start + .milliseconds(2999)) == .none)
        #expect(machine.timerFired(now: Self.start + .seconds(3)) == .close)
        #expect(machine.state == .closed)
    }

    @Test(arguments: [
        (HTTPVersion.http1_1, [("Connection", "close")]), (HTTPVersion.http1_0, []),
        (HTTPVersion.http1_1, [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c")]),
    ])
    func repliesThatEndTheConnectionCloseAfterTheirFlush(version: HTTPVersion, headers: [(String, String)]) {
        var machine = Self.responding(Self.head(.GET, "/healthz", version: version, headers))
        let plan = machine.replyReady(isWritable: true, now: Self.start)
        #expect(plan.action == .writeAndClose)
        #expect(machine.state == .closing(deadline: Self.start + .seconds(3)))
        #expect(!machine.readsAllowed, "nothing after a closing reply is read")
        #expect(machine.head(Self.head(), now: Self.start) == .none, "nothing after a closing reply is dispatched")
        #expect(machine.timerFired(now: Self.start + .seconds(3)) == .close, "the flush has a deadline too")
    }

    @Test func connectEndsTheProtocol() {
        var machine = Self.responding(Self.head(.CONNECT, "127.0.0.1:80"))
        #expect(machine.replyReady(isWritable: true, now: Self.start).action == .writeAndClose)
    }

    @Test func anHTTP10KeepAliveReplySaysSo() {
        var machine = Self.responding(Self.head(.GET, "/", version: .http1_0, [("Connection", "keep-alive")]))
        #expect(
            machine.replyReady(isWritable: true, now: Self.start)
                == .init(action: .writeAndEnd, bodyless: false, announcesKeepAlive: true))
    }

    @Test func headRepliesAreBodyless() {
        var machine = Self.responding(Self.head(.HEAD))
        #expect(machine.replyReady(isWritable: true, now: Self.start).bodyless)
    }

    @Test func aDeclaredBodyOverTheLimitIsRefusedBeforeItsBytesAndNothingAfterIsDispatched() {
        var machine = Self.machine()
        let head = Self.head(.POST, "/x", [("Content-Length", "17")])
        #expect(machine.head(head, now: Self.start) == .refuse(head, .bodyTooLarge))
        #expect(machine.body(ByteBuffer(string: "0123456789abcdefg")) == .none, "the body is dropped")
        #expect(machine.end() == .none)
        #expect(machine.replyReady(isWritable: true, now: Self.start).action == .writeAndClose)
        #expect(machine.head(Self.head(), now: Self.start) == .none)
        #expect(machine.end() == .none)
    }

    @Test func aBodyThatGrowsOverTheLimitIsRefusedAndTheConnectionEnds() {
        var machine = Self.machine()
        let head = Self.head(.POST, "/x", [("Transfer-Encoding", "chunked")])
        #expect(machine.head(head, now: Self.start) == .none)
        #expect(machine.body(ByteBuffer(string: "0123456789")) == .none)
        #expect(machine.body(ByteBuffer(string: "0123456")) == .refuse(head, .bodyTooLarge))
        #expect(machine.body(ByteBuffer(string: "more")) == .none)
        #expect(machine.replyReady(isWritable: true, now: Self.start).action == .writeAndClose, "its end never came")
    }

    @Test func expectations() {
        var machine = Self.machine()
        #expect(
            machine.head(
                Self.head(.POST, "/x", [("Expect", "100-Continue"), ("Content-Length", "3")]), now: Self.start)
                == .sendContinue)
        var noBody = Self.machine()
        #expect(noBody.head(Self.head(.GET, "/x", [("Expect", "100-continue")]), now: Self.start) == .none)
        var old = Self.machine()
        #expect(
            old.head(
                Self.head(.POST, "/x", version: .http1_0, [("Expect", "100-continue"), ("Content-Length", "3")]),
                now: Self.start) == .none)
        var unknown = Self.machine()
        let teapot = Self.head(.POST, "/x", [("Expect", "teapot"), ("Content-Length", "3")])
        #expect(unknown.head(teapot, now: Self.start) == .refuse(teapot, .expectationFailed))
        #expect(unknown.replyReady(isWritable: true, now: Self.start).action == .writeAndClose)
        var large = Self.machine()
        let big = Self.head(.POST, "/x", [("Expect", "100-continue"), ("Content-Length", "100")])
        #expect(
            large.head(big, now: Self.start) == .refuse(big, .bodyTooLarge), "no 100 for a body that would be refused")
    }

    @Test func halfCloseClosesAtOnceWhenNothingIsPendingElseAfterTheReply() {
        var idle = Self.machine()
        #expect(idle.inputClosed() == .close)
        var receiving = Self.machine()
        _ = receiving.head(Self.head(.POST, "/x", [("Content-Length", "3")]), now: Self.start)
        #expect(receiving.inputClosed() == .close, "the body can never complete")
        var responding = Self.responding()
        #expect(responding.inputClosed() == .none)
        #expect(responding.replyReady(isWritable: true, now: Self.start).action == .writeAndClose)
        var blocked = Self.responding()
        _ = blocked.replyReady(isWritable: false, now: Self.start)
        #expect(blocked.inputClosed() == .none)
        #expect(blocked.writabilityChanged(isWritable: true, now: Self.start) == .endAndClose)
        #expect(blocked.state == .closing(deadline: Self.start + .seconds(3)))
    }

    @Test func parseErrorsAre400ThenCloseUnlessTheConnectionIsAlreadyClosing() {
        var machine = Self.machine()
        #expect(machine.parseError(now: Self.start) == .refuseUnparsable)
        #expect(machine.state == .closing(deadline: Self.start + .seconds(3)))
        #expect(machine.parseError(now: Self.start) == .none)

        var answering = Self.responding()
        #expect(answering.parseError(now: Self.start) == .none)
        #expect(answering.replyReady(isWritable: true, now: Self.start).action == .writeAndClose)
    }

    @Test func everyWaitingStateHasADeadline() {
        var machine = Self.machine()
        #expect(machine.timerFired(now: Self.start + .milliseconds(999)) == .none)
        #expect(machine.timerFired(now: Self.start + .seconds(1)) == .close, "no first head")
        var body = Self.machine()
        _ = body.head(Self.head(.POST, "/x", [("Content-Length", "3")]), now: Self.start + .milliseconds(900))
        #expect(body.timerFired(now: Self.start + .seconds(1)) == .none, "the body has its own request timeout")
        #expect(body.timerFired(now: Self.start + .milliseconds(1900)) == .close)
        var idle = Self.responding()
        _ = idle.replyReady(isWritable: true, now: Self.start)
        #expect(idle.timerFired(now: Self.start + .seconds(2)) == .close, "idle after a reply")
        var responding = Self.responding()
        #expect(responding.timerFired(now: Self.start + .seconds(3600)) == .none, "the handler's own bounds apply")
    }

    @Test func aReplyForAConnectionThatIsGoneIsDiscarded() {
        var machine = Self.responding()
        machine.channelInactive()
        #expect(machine.replyReady(isWritable: true, now: Self.start) == .discard)
        #expect(machine.head(Self.head(), now: Self.start) == .none)
    }
}
