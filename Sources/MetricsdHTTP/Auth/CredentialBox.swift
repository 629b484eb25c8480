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
