#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Compares a presented admin token with the configured one in constant time (SHA-256 of both, then a
/// byte-wise comparison with no early exit), so response times reveal nothing about the token.
public struct AdminTokenCheck: Sendable {
    private let expected: [UInt8]

    public init(token: String) {
        self.expected = LibCrypto.sha256(Array(token.utf8))
    }

    public func matches(_ presented: Substring) -> Bool {
        let digest = LibCrypto.sha256(Array(presented.utf8))
        var difference: UInt8 = 0
        for index in 0..<self.expected.count { difference |= self.expected[index] ^ digest[index] }
        return difference == 0
    }
}
