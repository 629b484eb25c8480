/// A token key (the HS256 secret or the public key) that cannot be used; the message says why, never the key.
public struct TokenKeyError: Error, Sendable, CustomStringConvertible {
    public let message: String
    init(_ message: String) { self.message = message }
    public var description: String { self.message }
}
