import MetricsdHTTP

extension TokenConfiguration {
    /// Reads the token settings from the environment and credentials (see ``TokenConfiguration``).
    ///
    /// `METRICSD_JWT_HS256=off` leaves the secret unread, so only the public key's algorithm is accepted: with a
    /// secret configured, HS256 tokens are accepted besides the public key's, and whoever can read the secret can
    /// mint tokens (the point of a public key is to verify without being able to mint).
    public init(environment: [String: String]) throws(ConfigurationError) {
        self.init(hmacSecret: nil)
        let reader = EnvironmentReader(environment)
        let hs256 = try reader.parse("METRICSD_JWT_HS256", default: "on", expected: "on or off") {
            ["on", "off"].contains($0.lowercased()) ? $0.lowercased() : nil
        }
        if hs256 == "on" {
            self.hmacSecret = try Secrets.read(
                credential: "jwt-secret", file: "METRICSD_JWT_SECRET_FILE", variable: "METRICSD_JWT_SECRET",
                environment: environment)
        }
        self.publicKeyPEM = try Secrets.read(
            credential: "jwt-public-key", file: "METRICSD_JWT_PUBLIC_KEY_FILE", variable: nil, environment: environment)
        if hs256 == "off" && self.publicKeyPEM == nil {
            throw ConfigurationError(
                .noJWTKey,
                "METRICSD_JWT_HS256=off needs a public key (METRICSD_JWT_PUBLIC_KEY_FILE): no token could be verified")
        }
        self.issuer = reader["METRICSD_JWT_ISSUER"]
        self.audience = reader["METRICSD_JWT_AUDIENCE"]
        self.leewaySeconds = try reader.integer("METRICSD_JWT_LEEWAY_SECONDS")
        if let secret = self.hmacSecret, secret.utf8.count < 32 {
            throw ConfigurationError(
                .jwtSecretTooShort, "the JWT secret must be at least 32 bytes (HS256 needs a 256-bit key)")
        }
        // Checked here, with the rest of the configuration and before logging starts, so that a wrong key file
        // fails start-up (and SIGHUP reloads) with one clear line.
        if let pem = self.publicKeyPEM {
            do { try TokenVerifier.checkPublicKey(pem) } catch { throw ConfigurationError(error) }
        }
    }
}
