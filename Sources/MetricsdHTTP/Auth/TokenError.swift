import Crypto
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import JWTKit

/// Why a bearer token was refused. Every case is a 401; the message is safe to return (it never echoes the token).
public struct TokenError: Error, Equatable, Sendable, CustomStringConvertible {
    public let message: String
    init(_ message: String) { self.message = message }
    public var description: String { self.message }
}
