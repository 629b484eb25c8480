import HealthMetrics
import MetricsdHTTP

/// A configuration value is missing or invalid: its case (a stable code, ``CodedError``) and a message that names
/// the variable or file and what it expects. `serve` exits 1 with it, `check-config` reports it and exits 78.
public struct ConfigurationError: CodedError, Sendable {
    public enum Kind: String, CaseIterable, Sendable {
        /// A setting that does not parse or is out of range (`NAME='…' is not valid: expected …`).
        case invalidValue = "config.invalid_value"
        /// A setting in the settings file that metricsd does not know (`check-config`).
        case unknownSetting = "config.unknown_setting"
        /// A line of a settings file that is not `NAME=value` (`file:line: …`).
        case fileSyntax = "config.file_syntax"
        /// A settings or secret file that cannot be read, or is not UTF-8 text.
        case fileUnreadable = "config.file_unreadable"
        /// A secret (credential or `*_FILE`) that cannot be read.
        case secretUnreadable = "config.secret_unreadable"
        /// A secret file that is empty.
        case secretEmpty = "config.secret_empty"
        /// No JWT secret or public key, or `METRICSD_JWT_HS256=off` without a public key: no token could be verified.
        case noJWTKey = "config.no_jwt_key"
        /// The JWT secret is shorter than 32 bytes.
        case jwtSecretTooShort = "config.jwt_secret_too_short"
        /// libcrypto would not key HMAC-SHA-256 with the JWT secret (out of memory, or a libcrypto without HMAC).
        case jwtSecretUnusable = "config.jwt_secret_unusable"
        /// The JWT public key is a private key, or not an Ed25519, P-256 or RSA (≥ 2048 bits) public key.
        case jwtPublicKeyInvalid = "config.jwt_public_key_invalid"
        /// The admin token is shorter than 16 characters.
        case adminTokenTooShort = "config.admin_token_too_short"
        /// The admin token is a JWT.
        case adminTokenIsJWT = "config.admin_token_is_jwt"
        /// The admin token is the JWT secret.
        case adminTokenIsJWTSecret = "config.admin_token_is_jwt_secret"
        /// `DATABASE_URL` (with the `PG*` environment) is not a connection string libpq accepts.
        case databaseURLInvalid = "config.database_url_invalid"
        /// `METRICSD_READ_DATABASE_URL` is not a list of read servers libpq accepts.
        case readDatabaseURLInvalid = "config.read_database_url_invalid"
        /// `METRICSD_MAX_CONNECTIONS`, the pool and a reserve need more file descriptors than `RLIMIT_NOFILE`.
        case openFiles = "config.open_files"
        /// A listener address that is in use by another program or cannot be bound (`check-config`).
        case listenUnavailable = "config.listen_unavailable"
        /// `METRICSD_TLS` is on without both a certificate and its key.
        case tlsIncomplete = "config.tls_incomplete"
        /// The TLS certificate or key cannot be used: not PEM, not a pair, or the certificate has expired.
        case tlsCertificateInvalid = "config.tls_certificate_invalid"
        /// `refresh-credentials` cannot write the refreshed copies into the service's runtime directory.
        case credentialsRefreshFailed = "config.credentials_refresh_failed"
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// A token key that cannot be used, as the configuration error it is.
    public init(_ error: TokenKeyError) {
        switch error {
        case .noKey(let message): self.init(.noJWTKey, message)
        case .unusableSecret(let message): self.init(.jwtSecretUnusable, message)
        case .unusablePublicKey(let message): self.init(.jwtPublicKeyInvalid, message)
        }
    }

    public var errorCode: String { self.kind.rawValue }
    public var description: String { self.message }
}
