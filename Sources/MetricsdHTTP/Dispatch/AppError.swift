import HTTPTypes
import HealthMetrics

/// An error the HTTP API answers with its error body: `{"error": "message", "statusCode": N, "code": "…"}`.
///
/// `code` is the failure's stable code (``CodedError``), documented in the API document per status: clients and
/// tests branch on it (and on the status), never on the message, which is for people.
public struct AppError: CodedError, Sendable {
    /// The stable code of an API error (`route.not_found`, `token.expired`, …). The HTTP layer's own are below;
    /// the endpoints add theirs where they are declared.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { self.rawValue }
    }

    public let status: HTTPResponse.Status
    public let code: Code
    public let message: String
    /// Extra response headers (`Retry-After`, `Allow`, `WWW-Authenticate`).
    public var headers: HTTPFields = [:]

    public init(_ status: HTTPResponse.Status, _ code: Code, _ message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    public var errorCode: String { self.code.rawValue }
    public var description: String { "\(self.status.code) \(self.message)" }

    static func unauthorized(_ code: Code, _ message: String) -> AppError {
        var error = AppError(.unauthorized, code, message)
        error.headers[.wwwAuthenticate] = "Bearer"
        return error
    }

    package static func badRequest(_ code: Code, _ message: String) -> AppError { AppError(.badRequest, code, message) }

    package static func unavailable(_ code: Code, _ message: String) -> AppError {
        var error = AppError(.serviceUnavailable, code, message)
        error.headers[.retryAfter] = "1"
        return error
    }

    /// The JSON body.
    var body: String {
        JSONWriter.object([
            "error": .string(self.message), "statusCode": .int(Int64(self.status.code)),
            "code": .string(self.code.rawValue),
        ])
    }
}

extension AppError.Code {
    /// 404: no route has this path (or the path is not in canonical form, or admin routes are off).
    public static let routeNotFound = Self(rawValue: "route.not_found")
    /// 405: the path exists with other methods (`Allow` names them).
    public static let methodNotAllowed = Self(rawValue: "method.not_allowed")
    /// 501: a method no route supports (CONNECT).
    public static let methodNotImplemented = Self(rawValue: "method.not_implemented")
    /// 413: the body is (or is declared) larger than 16 KiB.
    public static let bodyTooLarge = Self(rawValue: "request.body_too_large")
    /// 417: an `Expect` other than `100-continue`.
    public static let expectationFailed = Self(rawValue: "request.expectation_failed")
    /// 401: no `Authorization` header on a route that needs a token.
    public static let tokenMissing = Self(rawValue: "auth.token_missing")
    /// 401: an `Authorization` header that is not `Bearer <token>`.
    public static let authorizationMalformed = Self(rawValue: "auth.authorization_malformed")
    /// 401: an admin route with a bearer credential that is not the admin token.
    public static let adminTokenInvalid = Self(rawValue: "auth.admin_token_invalid")
    /// 503: more requests in flight than `METRICSD_MAX_IN_FLIGHT`; nothing was done.
    public static let busy = Self(rawValue: "server.busy")
    /// 503: more open connections than `METRICSD_MAX_CONNECTIONS`; the connection is closed after the reply.
    public static let tooManyConnections = Self(rawValue: "server.too_many_connections")
    /// The client closed the connection before its request could run (logged and counted, never sent).
    public static let connectionClosed = Self(rawValue: "server.connection_closed")
    /// 500: a fault in metricsd; the message names the request id, the log has the detail.
    public static let internalError = Self(rawValue: "server.internal")

    /// A refused token's code (401).
    public static func token(_ reason: TokenError.Reason) -> Self { Self(rawValue: reason.rawValue) }

    /// The HTTP layer's codes, those of refused tokens included.
    public static let httpCodes: [Self] =
        [
            .routeNotFound, .methodNotAllowed, .methodNotImplemented, .bodyTooLarge, .expectationFailed, .tokenMissing,
            .authorizationMalformed, .adminTokenInvalid, .busy, .tooManyConnections, .connectionClosed, .internalError,
            .invalidParameter,
        ] + TokenError.Reason.allCases.map(Self.token)
}
