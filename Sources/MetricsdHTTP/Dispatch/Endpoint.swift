import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1

/// One endpoint of the API, defined once: its method and path, who may call it, and what it does.
///
/// Everything every endpoint shares — the request id, the body limit, the in-flight limit, routing (404/405),
/// authentication, error bodies, the `Date`/`Content-Length` headers, the request log line and the
/// `metricsd_http_*` metrics — is done around the handler by ``APIDispatcher``, the one path every request
/// takes. A handler only does the endpoint's own work.
package struct Endpoint: Sendable {
    /// Who may call an endpoint.
    package enum Access: Sendable {
        /// Anyone (health, metrics, the API document).
        case open
        /// An end user with a valid bearer JWT; the handler gets the token's user id.
        case user
        /// An operator with the admin token.
        case admin
    }

    /// How a handler answers: both end the same way (``APIDispatcher`` writes the reply on the connection's event
    /// loop); they differ only in where the work runs.
    package enum Handler: Sendable {
        /// Runs in the connection's own task (``ConnectionWorker``): the default, for everything that waits or
        /// takes longer than a few microseconds (database writes, history and export, admin operations, `/readyz`,
        /// rendering `/metrics`).
        case async(@Sendable (EndpointRequest) async throws -> Reply)
        /// Starts on the event loop and answers exactly once, from any thread, with no task: only for the answers
        /// whose cost per request the bench shows — the batched latest read (its read runs elsewhere and answers
        /// from there) and the fixed answers (``immediate(_:)``). ``Answer/later(_:)`` hands the rest of the work
        /// to the connection's task when it turns out to need one.
        case callback(@Sendable (EndpointRequest, @escaping @Sendable (Answer) -> Void) -> Void)

        /// A callback that answers at once on the event loop (it must not block, and should take microseconds):
        /// `/healthz`, the API document.
        package static func immediate(_ answer: @escaping @Sendable (EndpointRequest) throws -> Reply) -> Handler {
            .callback { request, done in
                do {
                    done(.reply(try answer(request)))
                } catch {
                    done(.failure(error))
                }
            }
        }
    }

    /// How a callback handler answers.
    package enum Answer: Sendable {
        case reply(Reply)
        case failure(any Error)
        /// The rest of the work needs a task: it runs in the connection's own task (``ConnectionWorker``).
        case later(@Sendable () async throws -> Reply)
    }

    let method: HTTPRequest.Method
    /// The path template, `{name}` for a parameter segment. Also the `route` of the request log and metrics.
    let route: String
    let access: Access
    /// How its successful replies may be cached (errors are never stored), and whether they carry an `ETag`
    /// and answer `If-None-Match` with `304`.
    let caching: CachePolicy
    let handler: Handler

    package init(
        _ method: HTTPRequest.Method, _ route: String, access: Access, caching: CachePolicy, _ handler: Handler
    ) {
        self.method = method
        self.route = route
        self.access = access
        self.caching = caching
        self.handler = handler
    }
}

/// What a handler sees of a request.
package struct EndpointRequest: Sendable {
    let head: HTTPRequestHead
    /// The body (at most 16 KiB; empty when there is none).
    package let body: ByteBuffer
    /// The value of the template's `{name}` segment, when it has one.
    package let parameter: Substring?
    /// The request's `If-None-Match` tags, for its endpoint's ``CachePolicy``.
    let ifNoneMatch: [String]?
    /// The correlation id (`X-Request-Id`), in the reply and in every log line about the request.
    let requestID: String
    /// The authenticated user (`Endpoint.Access.user` only), set by the dispatcher once the token is verified.
    var userID: Int64? = nil
    /// The connection's event loop: a callback handler may hop there before building its body.
    package let eventLoop: any EventLoop
    private let baseLogger: Logger

    init(
        head: HTTPRequestHead, body: ByteBuffer, parameter: Substring?, ifNoneMatch: [String]?, requestID: String,
        eventLoop: any EventLoop, logger: Logger
    ) {
        self.head = head
        self.body = body
        self.parameter = parameter
        self.ifNoneMatch = ifNoneMatch
        self.requestID = requestID
        self.eventLoop = eventLoop
        self.baseLogger = logger
    }

    /// The request's logger: every line carries the request id (and the user id when authenticated). Made only
    /// when something is logged (copying a logger's metadata allocates).
    package var logger: Logger {
        APIDispatcher.requestLogger(self.baseLogger, requestID: self.requestID, userID: self.userID)
    }

    /// The authenticated user id; only `Endpoint.Access.user` endpoints call this.
    package func user() throws(AppError) -> Int64 {
        guard let userID = self.userID else { throw AppError.unauthorized(.tokenMissing, "missing bearer token") }
        return userID
    }
}

/// An answer: status, extra headers and body. `Content-Length`, `Date` and `X-Request-Id` are added when it is
/// written; `Content-Type` is JSON unless the reply names another.
package struct Reply: Sendable {
    package var status: HTTPResponse.Status
    var headers: HTTPFields
    var body: ByteBuffer
    /// The error's stable code for an error reply (the request log carries it), nil otherwise.
    var errorCode: String?
    /// The strong tag of a body that never changes, computed once by its endpoint (`/openapi.yaml`); nil: the
    /// tag, when the endpoint's ``CachePolicy`` has one, is computed from the body.
    var entityTag: EntityTag?
    /// A body produced while it is written (``BodyStream``), instead of `body`; nil for every other reply.
    var stream: BodyStream?

    package init(
        status: HTTPResponse.Status = .ok, headers: HTTPFields = [:], body: ByteBuffer, entityTag: EntityTag? = nil
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.entityTag = entityTag
    }

    /// A streamed body of content type `contentType` (``BodyStream``); the connection ends after it.
    package static func streamed(contentType: String, headers: HTTPFields = [:], _ stream: BodyStream) -> Reply {
        var fields = headers
        fields[.contentType] = contentType
        var reply = Reply(headers: fields, body: ByteBuffer())
        reply.stream = stream
        return reply
    }

    /// A JSON body, ended by a newline (so that two answers printed by curl do not run together).
    package static func json(_ text: String, status: HTTPResponse.Status = .ok, headers: HTTPFields = [:]) -> Reply {
        Reply(status: status, headers: headers, body: Self.line(text))
    }

    /// The error body `{"error": "message", "statusCode": N, "code": "…"}` with the error's headers.
    static func error(_ error: AppError) -> Reply {
        var reply = Reply(status: error.status, headers: error.headers, body: Self.line(error.body))
        reply.errorCode = error.code.rawValue
        return reply
    }

    /// `text` and a newline in one buffer.
    static func line(_ text: String) -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: text.utf8.count + 1)
        buffer.writeString(text)
        buffer.writeInteger(UInt8(ascii: "\n"))
        return buffer
    }
}
