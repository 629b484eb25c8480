import HTTPTypes
import Logging
import MetricsdTestSupport
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Synchronization
import Testing

@testable import MetricsdHTTP

/// The connection's whole pipeline (NIO's HTTP server handlers and ``HTTPConnectionHandler``) on an
/// `EmbeddedChannel`: bytes in, bytes out, the event loop's clock advanced by hand. Every state of the
/// connection and every transition between them, driven from outside.
@Suite struct ConnectionHandlerTests {
    static let timeouts = HTTPTimeouts(request: .seconds(1), idle: .seconds(2), write: .seconds(3))

    @Test func oneRequestOneReplyThenIdle() async throws {
        let connection = try await TestConnection()
        try connection.send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: r1\r\n\r\n")
        let replies = try connection.replies()
        #expect(replies.count == 1)
        #expect(replies.first?.status == 200)
        #expect(replies.first?.headers["x-request-id"] == "r1")
        #expect(replies.first?.headers["content-type"] == "application/json")
        #expect(replies.first?.headers["content-length"] == String(replies.first?.body.count ?? -1))
        #expect(replies.first?.headers["date"] != nil)
        #expect(replies.first?.headers["connection"] == nil)
        #expect(connection.isActive)
        try connection.finish()
    }

    @Test func pipelinedRequestsAreAnsweredInOrderWithoutRecursion() async throws {
        let connection = try await TestConnection()
        // 2,000 requests in one read: answered in a loop (a recursion per request would exhaust the stack).
        let text = (0..<2000).map { "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: p\($0)\r\n\r\n" }.joined()
        try connection.send(text)
        let replies = try connection.replies()
        #expect(replies.count == 2000)
        #expect(replies.map { $0.headers["x-request-id"] ?? "" } == (0..<2000).map { "p\($0)" })
        try connection.finish()
    }

    @Test func theNextRequestWaitsForTheReplyBeforeIt() async throws {
        let connection = try await TestConnection()
        try connection.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(connection.pending.count == 1, "only the first request is dispatched")
        #expect(try connection.replies().isEmpty)
        connection.answer(.json(#"{"later":true}"#))
        let replies = try connection.replies()
        #expect(replies.map(\.status) == [200, 200])
        #expect(replies.first?.text.contains("later") == true)
        try connection.finish()
    }

    @Test func aReplyIsHeldWhileTheChannelIsNotWritableAndNothingMoreIsRead() async throws {
        let connection = try await TestConnection()
        connection.channel.isWritable = false
        connection.channel.pipeline.fireChannelWritabilityChanged()
        try connection.send(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: b\r\n\r\n"
        )
        // The first reply's head and body are out; its end, which lets the second request in, is held.
        #expect(try connection.replies().map { $0.headers["x-request-id"] } == ["a"])
        connection.channel.read()
        #expect(connection.readsAsked == 0, "no read while a reply is held")
        connection.channel.isWritable = true
        connection.channel.pipeline.fireChannelWritabilityChanged()
        #expect(try connection.replies().map { $0.headers["x-request-id"] } == ["b"])
        #expect(connection.readsAsked == 1, "reading resumes once the replies are out")
        try connection.finish()
    }

    @Test func aHeldReplyIsClosedAtTheWriteTimeout() async throws {
        let connection = try await TestConnection()
        connection.channel.isWritable = false
        try connection.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try connection.replies()
        connection.advance(by: .milliseconds(2900))
        #expect(connection.isActive)
        connection.advance(by: .milliseconds(200))
        #expect(!connection.isActive, "closed at the write timeout")
    }

    @Test func deadlinesForTheFirstHeadAPartialHeadABodyAndIdleness() async throws {
        let silent = try await TestConnection()
        silent.advance(by: .milliseconds(999))
        #expect(silent.isActive)
        silent.advance(by: .milliseconds(2))
        #expect(!silent.isActive, "no head within the request timeout")

        let partial = try await TestConnection()
        try partial.send("GET /healthz HTTP/1.1\r\nHo")
        partial.advance(by: .milliseconds(1001))
        #expect(!partial.isActive, "a head that never ends")

        let body = try await TestConnection()
        body.advance(by: .milliseconds(900))
        try body.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        body.advance(by: .milliseconds(500))
        #expect(body.isActive, "the body has its own request timeout from its head")
        body.advance(by: .milliseconds(501))
        #expect(!body.isActive, "a body that never ends")
        #expect(try body.replies().isEmpty)

        let idle = try await TestConnection()
        try idle.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try idle.replies().count == 1)
        idle.advance(by: .milliseconds(1999))
        #expect(idle.isActive)
        idle.advance(by: .milliseconds(2))
        #expect(!idle.isActive, "idle after a reply")
    }

    @Test func connectionCloseIsAnsweredThenClosedAndNothingAfterIsDispatched() async throws {
        let connection = try await TestConnection()
        try connection.send(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nPOST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        let replies = try connection.replies()
        #expect(replies.map(\.status) == [200])
        #expect(replies.first?.headers["connection"] == "close")
        #expect(!connection.isActive)
        #expect(connection.counted == 0)
    }

    @Test func oversizedBodiesAre413AndCloseTheConnection() async throws {
        let declared = try await TestConnection()
        try declared.send(
            "POST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 16385\r\n\r\nPOST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        #expect(try declared.replies().map(\.status) == [413])
        #expect(!declared.isActive)
        #expect(declared.counted == 0, "nothing after a 413 is dispatched")

        let chunked = try await TestConnection()
        var text = "POST /count HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        for _ in 0..<5 { text += "1000\r\n" + String(repeating: " ", count: 4096) + "\r\n" }
        try chunked.send(text + "0\r\n\r\nPOST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        let replies = try chunked.replies()
        #expect(replies.map(\.status) == [413])
        #expect(replies.first?.headers["connection"] == "close")
        #expect(!chunked.isActive)
        #expect(chunked.counted == 0)

        let exact = try await TestConnection()
        let body = String(repeating: "x", count: 16384)
        try exact.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 16384\r\n\r\n" + body)
        #expect(try exact.replies().first?.body.count == 16384 + 1, "16 KiB is allowed (echoed with a newline)")
        try exact.finish()
    }

    @Test func expectContinue() async throws {
        let connection = try await TestConnection()
        try connection.send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        #expect(try connection.output() == "HTTP/1.1 100 Continue\r\n\r\n")
        try connection.send("hi")
        #expect(try connection.replies().map(\.text) == ["hi\n"])

        let teapot = try await TestConnection()
        try teapot.send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\nhi")
        #expect(try teapot.replies().map(\.status) == [417])
        #expect(!teapot.isActive)
    }

    @Test func headHasTheHeadersOfGetAndNoBody() async throws {
        let connection = try await TestConnection()
        try connection.send("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        let replies = try connection.replies(bodyless: [true, false])
        #expect(replies.map(\.status) == [200, 200])
        #expect(replies.first?.headers["content-length"] == String(replies.last?.body.count ?? -1))
        #expect(replies.first?.body.isEmpty == true)
        try connection.finish()
    }

    @Test func halfCloseGetsEveryReplyThenTheConnectionCloses() async throws {
        let connection = try await TestConnection()
        try connection.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        connection.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(connection.isActive, "a reply is still due")
        connection.answer(.json("{}"))
        #expect(try connection.replies().count == 2)
        #expect(!connection.isActive)
    }

    @Test func upgradeIsAnsweredAsHTTP11AndTheConnectionEnds() async throws {
        let connection = try await TestConnection()
        try connection.send(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n"
        )
        let replies = try connection.replies()
        #expect(replies.map(\.status) == [200])
        #expect(replies.first?.headers["connection"] == "close")
        #expect(!connection.isActive)

        let connect = try await TestConnection()
        try connect.send("CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\n\r\n")
        #expect(try connect.replies(bodyless: [true]).map(\.status) == [501])
        #expect(!connect.isActive)
    }

    @Test func aRequestThatCannotBeParsedIs400AndTheConnectionCloses() async throws {
        let connection = try await TestConnection()
        try? connection.send("GET /healthz HTTP/1.1\r\nHost x\r\n\r\n")
        #expect(try connection.replies().map(\.status) == [400])
        #expect(!connection.isActive)
    }

    @Test func shutdownClosesAnIdleConnectionAtOnceAndABusyOneAfterItsReply() async throws {
        let idle = try await TestConnection()
        try idle.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try idle.replies()
        idle.channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(!idle.isActive)

        let busy = try await TestConnection()
        try busy.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        busy.channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(busy.isActive)
        busy.answer(.json("{}"))
        let replies = try busy.replies()
        #expect(replies.map(\.status) == [200])
        #expect(replies.first?.headers["connection"] == "close")
        #expect(!busy.isActive)
    }
}

/// One connection's pipeline on an `EmbeddedChannel`, with endpoints for the tests: `/healthz` (immediate),
/// `/later` (answered when the test calls ``answer(_:)``), `/echo` (the body back), `/count` (counts calls).
final class TestConnection {
    let channel = EmbeddedChannel()
    private let endpointsState = EndpointsState()
    private var buffer: [UInt8] = []

    var pending: [@Sendable (Endpoint.Answer) -> Void] { self.endpointsState.pending.withLock { $0 } }
    var counted: Int { self.endpointsState.counted.withLock { $0 } }
    var readsAsked: Int { self.readCounter.reads }
    var isActive: Bool { self.channel.isActive }
    private let readCounter = ReadCounter()

    init() async throws {
        let verifier = try TokenVerifier(TokenConfiguration(hmacSecret: String(repeating: "s", count: 32)))
        let state = self.endpointsState
        let endpoints = [
            Endpoint(
                .get, "/healthz", access: .open, caching: .noStore, .immediate { _ in .json(#"{"status":"ok"}"#) }),
            Endpoint(
                .get, "/later", access: .open, caching: .noStore,
                .callback { _, done in state.pending.withLock { $0.append(done) } }),
            Endpoint(
                .post, "/echo", access: .open, caching: .noStore,
                .immediate { request in Reply(body: Reply.line(String(buffer: request.body))) }),
            Endpoint(
                .post, "/count", access: .open, caching: .noStore,
                .immediate { _ in
                    state.counted.withLock { $0 += 1 }
                    return .json("{}")
                }),
        ]
        let dispatcher = APIDispatcher(
            endpoints: endpoints, credentials: CredentialBox(.init(tokens: verifier, admin: nil)),
            inFlight: InFlightCounter(),
            maxInFlight: 64,
            requestLog: RequestLog(mode: .off, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }),
            logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
        let pipeline = self.channel.pipeline.syncOperations
        try pipeline.addHandler(self.readCounter)
        try pipeline.configureHTTPServerPipeline(withPipeliningAssistance: true, withErrorHandling: false)
        try pipeline.addHandler(
            HTTPConnectionHandler(
                dispatcher: dispatcher, worker: ConnectionWorker(), timeouts: ConnectionHandlerTests.timeouts,
                now: self.channel.embeddedEventLoop.now))
        try await self.channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 8080)).get()
    }

    func send(_ text: String) throws {
        try self.channel.writeInbound(ByteBuffer(string: text))
    }

    func advance(by amount: TimeAmount) {
        self.channel.embeddedEventLoop.advanceTime(by: amount)
    }

    /// Answers the oldest `/later` request.
    func answer(_ reply: Reply) {
        let done = self.endpointsState.pending.withLock { $0.removeFirst() }
        done(.reply(reply))
        self.channel.embeddedEventLoop.run()
    }

    /// Everything written since the last call, as text.
    func output() throws -> String {
        while let chunk = try self.channel.readOutbound(as: ByteBuffer.self) { self.buffer += chunk.readableBytesView }
        defer { self.buffer = [] }
        return String(decoding: self.buffer, as: UTF8.self)
    }

    /// The whole replies written since the last call (`bodyless` marks replies to HEAD).
    func replies(bodyless: [Bool] = []) throws -> [WireResponse] {
        while let chunk = try self.channel.readOutbound(as: ByteBuffer.self) { self.buffer += chunk.readableBytesView }
        var replies: [WireResponse] = []
        while let (reply, used) = WireResponse.parse(
            self.buffer[...], bodyless: replies.count < bodyless.count && bodyless[replies.count])
        {
            replies.append(reply)
            self.buffer.removeFirst(used)
        }
        return replies
    }

    /// The connection is still usable and has nothing left over.
    func finish() throws {
        #expect(self.channel.isActive)
        _ = try self.channel.finish()
    }
}
