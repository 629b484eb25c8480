import HealthMetrics

/// A token key (the HS256 secret or the public key) that cannot be used, one case per failure with the message
/// that says why, never the key. A configuration error: its codes are those of ``ConfigurationError``'s cases for
/// the same failures.
public enum TokenKeyError: CodedError, Sendable {
    /// Neither a secret nor a public key is configured.
    case noKey(String)
    /// libcrypto would not key HMAC-SHA-256 with the secret (it could not allocate, or has no HMAC).
    case unusableSecret(String)
    /// The public key file holds a private key, or a key of a kind or size metricsd does not verify with.
    case unusablePublicKey(String)

    public var errorCode: String {
        switch self {
        case .noKey: "config.no_jwt_key"
        case .unusableSecret: "config.jwt_secret_unusable"
        case .unusablePublicKey: "config.jwt_public_key_invalid"
        }
    }

    public var message: String {
        switch self {
        case .noKey(let message), .unusableSecret(let message), .unusablePublicKey(let message): message
        }
    }

    public var description: String { self.message }
}
