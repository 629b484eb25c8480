import HealthMetrics

/// Why a bearer token was refused: one case per reason, each with its stable code (``CodedError``). Every case is
/// a 401 whose body carries the code; the message is safe to return (it never echoes the token).
public struct TokenError: CodedError, Equatable, Sendable {
    public enum Reason: String, CaseIterable, Sendable {
        /// Not three base64url parts, too long, or a part that does not decode.
        case malformed = "token.malformed"
        /// The header is not a JSON object or names a parameter twice.
        case malformedHeader = "token.malformed_header"
        /// The header has `crit`: no critical extension is supported.
        case criticalHeader = "token.critical_header"
        /// The header's `alg` is not one of the configured keys' algorithms (`none`, HS256 without a secret, …).
        case algorithmNotAccepted = "token.algorithm_not_accepted"
        /// The signature does not verify with the configured key.
        case badSignature = "token.bad_signature"
        /// The claims name a claim twice.
        case repeatedClaim = "token.repeated_claim"
        /// The payload is not a JSON object of claims.
        case malformedPayload = "token.malformed_payload"
        /// No `exp`, or one that is not a time.
        case noExpiry = "token.no_expiry"
        /// `exp` is past (beyond the leeway).
        case expired = "token.expired"
        /// `nbf` is not a time.
        case badNotBefore = "token.bad_not_before"
        /// `nbf` is ahead (beyond the leeway).
        case notYetValid = "token.not_yet_valid"
        /// `iss` is not the configured issuer.
        case issuerNotAccepted = "token.issuer_not_accepted"
        /// `aud` does not name the configured audience.
        case audienceNotAccepted = "token.audience_not_accepted"
        /// `sub` is not a user id (a positive integer).
        case subjectNotUserID = "token.subject_not_user_id"
    }

    public let reason: Reason
    public let message: String

    init(_ reason: Reason, _ message: String) {
        self.reason = reason
        self.message = message
    }

    public var errorCode: String { self.reason.rawValue }
    public var description: String { self.message }
}
