#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// How user tokens are verified (README, "Tokens").
///
/// - HS256 with a shared secret: `$CREDENTIALS_DIRECTORY/jwt-secret`, else `METRICSD_JWT_SECRET_FILE`, else
///   `METRICSD_JWT_SECRET`.
/// - and/or an asymmetric public key (EdDSA, ES256 or RS256), so metricsd can verify tokens without being able to
///   mint them: `$CREDENTIALS_DIRECTORY/jwt-public-key`, else `METRICSD_JWT_PUBLIC_KEY_FILE` (PEM).
/// - `METRICSD_JWT_ISSUER` / `METRICSD_JWT_AUDIENCE`: when set, `iss` must equal it / `aud` must contain it.
/// - `METRICSD_JWT_LEEWAY_SECONDS`: clock leeway for `exp` and `nbf`, default 30.
public struct TokenConfiguration: Sendable {
    public var hmacSecret: String?
    public var publicKeyPEM: String?
    public var issuer: String?
    public var audience: String?
    public var leewaySeconds: Int

    public init(
        hmacSecret: String?, publicKeyPEM: String? = nil, issuer: String? = nil, audience: String? = nil,
        leewaySeconds: Int = 30
    ) {
        self.hmacSecret = hmacSecret
        self.publicKeyPEM = publicKeyPEM
        self.issuer = issuer
        self.audience = audience
        self.leewaySeconds = leewaySeconds
    }
}
