import HTTPTypes
import Hummingbird
import Logging

/// Credentials that may change on `SIGHUP` (secret files are re-read): swapped atomically, read per request.
public final class CredentialBox: Sendable {
    public struct Credentials: Sendable {
        public var tokens: TokenVerifier
        public var admin: AdminTokenCheck?
        public init(tokens: TokenVerifier, admin: AdminTokenCheck?) {
            self.tokens = tokens
            self.admin = admin
        }
    }

    private let state: ReadMostly<Credentials>

    public init(_ credentials: Credentials) {
        self.state = ReadMostly(credentials)
    }

    public var current: Credentials { self.state.value }
    public func replace(_ credentials: Credentials) { self.state.value = credentials }
}

/// The bearer token of a request, or a 401 saying what is wrong with the header.
func bearerToken(_ request: Request) throws(AppError) -> Substring {
    try bearerToken(request.headers[.authorization])
}

/// The bearer token of an `Authorization` header value, or a 401 saying what is wrong with it.
func bearerToken(_ header: String?) throws(AppError) -> Substring {
    guard let header else {
        throw AppError.unauthorized("missing bearer token")
    }
    let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
    guard parts.count == 2, parts[0].lowercased() == "bearer", !parts[1].isEmpty else {
        throw AppError.unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    }
    return parts[1]
}

/// Authenticates end users by their JWT (`sub` = user id). Every failure is a 401.
struct UserAuthMiddleware: RouterMiddleware {
    typealias Context = AppRequestContext
    let credentials: CredentialBox

    func handle(
        _ request: Request, context: AppRequestContext,
        next: (Request, AppRequestContext) async throws -> Response
    ) async throws -> Response {
        let userID = try authenticatedUser(request.headers[.authorization], credentials: self.credentials, logger: context.logger)
        var context = context
        context.userID = userID
        context.logger[metadataKey: "metricsd.user.id"] = .stringConvertible(userID)
        return try await next(request, context)
    }
}

/// The user id (`sub`) of a bearer token, or the 401 to answer, its reason logged at debug level. The router's
/// `UserAuthMiddleware` and the hot path (`TodayFastPath`) both authenticate with it.
func authenticatedUser(_ authorization: String?, credentials: CredentialBox, logger: @autoclosure () -> Logger)
    throws(AppError) -> Int64
{
    let token = try bearerToken(authorization)
    do {
        return try credentials.current.tokens.verify(token)
    } catch {
        logger().debug("Token refused", metadata: ["metricsd.reason": "\(error.message)"])
        throw AppError.unauthorized(error.message)
    }
}

/// Authenticates operators by the admin token (constant-time comparison). User JWTs are never admin tokens.
struct AdminAuthMiddleware: RouterMiddleware {
    typealias Context = AppRequestContext
    let credentials: CredentialBox

    func handle(
        _ request: Request, context: AppRequestContext,
        next: (Request, AppRequestContext) async throws -> Response
    ) async throws -> Response {
        let token = try bearerToken(request)
        guard let check = self.credentials.current.admin, check.matches(token) else {
            context.logger.notice("Admin token refused")
            throw AppError.unauthorized("invalid admin token")
        }
        return try await next(request, context)
    }
}
