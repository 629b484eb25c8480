import HTTPTypes

/// An error the HTTP API answers with its error body: `{"error": "message", "statusCode": N}`.
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

    package static func badRequest(_ message: String) -> AppError { AppError(.badRequest, message) }

    package static func unavailable(_ message: String) -> AppError {
        var error = AppError(.serviceUnavailable, message)
        error.headers[.retryAfter] = "1"
        return error
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
