import Synchronization

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

    private let state: Mutex<Credentials>

    public init(_ credentials: Credentials) {
        self.state = Mutex(credentials)
    }

    public var current: Credentials { self.state.withLock { $0 } }
    public func replace(_ credentials: Credentials) { self.state.withLock { $0 = credentials } }
}
