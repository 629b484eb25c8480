import HTTPTypes
import Hummingbird
import NIOCore

/// An error the HTTP API answers with SPEC.md's body: `{"error": "message", "statusCode": N}`.
public struct AppError: Error, Sendable, CustomStringConvertible {
    public let status: HTTPResponse.Status
    public let message: String
    /// Extra response headers (`Retry-After`, `Allow`, `WWW-Authenticate`).
    public var headers: HTTPFields = [:]

    public init(_ status: HTTPResponse.Status, _ message: String) {
        self.status = status
        self.message = message
    }

    public var description: String { "\(self.status.code) \(self.message)" }

    static func unauthorized(_ message: String) -> AppError {
        var error = AppError(.unauthorized, message)
        error.headers[.wwwAuthenticate] = "Bearer"
        return error
    }

    static func badRequest(_ message: String) -> AppError { AppError(.badRequest, message) }

    static func unavailable(_ message: String) -> AppError {
        var error = AppError(.serviceUnavailable, message)
        error.headers[.retryAfter] = "1"
        return error
    }

    /// The response: the error body as JSON.
    func response(requestID: String) -> Response {
        var headers = self.headers
        headers[.contentType] = "application/json"
        headers[.requestID] = requestID
        return Response(status: self.status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: self.body)))
    }

    /// The JSON body.
    var body: String {
        JSONWriter.object(["error": .string(self.message), "statusCode": .int(Int64(self.status.code))])
    }
}

extension HTTPField.Name {
    /// `X-Request-Id`: the correlation id of a request, in every response and every log line about it.
    static let requestID = HTTPField.Name("X-Request-Id")!
}

/// A `200`/`202` JSON response.
struct JSONResponse: ResponseGenerator {
    var status: HTTPResponse.Status = .ok
    var headers: HTTPFields = [:]
    let body: String

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers = self.headers
        headers[.contentType] = "application/json"
        return Response(status: self.status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: self.body)))
    }
}
