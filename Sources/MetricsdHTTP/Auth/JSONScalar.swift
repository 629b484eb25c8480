#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One JSON value, told apart strictly: a boolean is never a number and a number never a string.
package enum JSONScalar: Decodable, Equatable {
    case string(String)
    case number(Double)
    case bool(Bool)
    case other

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else {
            self = .other
        }
    }

    var string: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// A NumericDate in whole seconds.
    var seconds: Int64? {
        guard case .number(let value) = self, value.isFinite, abs(value) < 1e15 else { return nil }
        return Int64(value.rounded(.down))
    }

    /// A user id: a positive integer sent as a string of digits (the usual form) or as a JSON number.
    var userID: Int64? {
        switch self {
        case .string(let text):
            guard (1...19).contains(text.utf8.count), text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
                text.utf8.first != 48
            else { return nil }
            return Int64(text)
        case .number(let value):
            guard value.isFinite, value >= 1, value <= 9_007_199_254_740_991, value.rounded() == value else {
                return nil
            }
            return Int64(value)
        case .bool, .other:
            return nil
        }
    }
}
