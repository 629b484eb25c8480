import NIOHTTP1

/// The query string and headers of a request, for endpoints that take parameters (the history, the export).
extension EndpointRequest {
    /// The query string's parameters in order, percent-decoded (`+` is a space, as forms send it). A parameter
    /// whose name or value is not valid percent-encoded UTF-8 makes the whole query a 400 naming it: a value
    /// that cannot be read is never taken for an absent one.
    package func queryParameters() throws(AppError) -> [(name: String, value: String)] {
        let target = self.head.uri
        guard let mark = target.utf8.firstIndex(of: UInt8(ascii: "?")) else { return [] }
        let query = target[target.utf8.index(after: mark)...]
        var parameters: [(name: String, value: String)] = []
        for pair in query.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = Self.percentDecoded(parts[0]) else {
                throw AppError.badRequest(
                    .invalidParameter, "a query parameter name is not valid percent-encoded UTF-8")
            }
            guard let value = Self.percentDecoded(parts.count > 1 ? parts[1] : "") else {
                throw AppError.badRequest(
                    .invalidParameter, "\(Self.printable(name)) is not valid percent-encoded UTF-8")
            }
            parameters.append((name, value))
        }
        return parameters
    }

    /// The value of the request header `name` (the first, when repeated), or nil.
    package func header(_ name: String) -> String? {
        self.head.headers.first(name: name)
    }

    /// `%XX` and `+` decoded; nil when an escape is malformed or the bytes are not UTF-8.
    static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"):
                bytes.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(Self.hexValue),
                    let low = iterator.next().flatMap(Self.hexValue)
                else { return nil }
                bytes.append(high << 4 | low)
            default:
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// A parameter name as an error message may quote it: at most 40 printable ASCII characters.
    package static func printable(_ name: String) -> String {
        String(name.unicodeScalars.prefix(40).map { $0.value >= 0x20 && $0.value < 0x7f ? Character($0) : "?" })
    }
}

extension AppError.Code {
    /// 400: a query parameter the endpoint cannot use (malformed, out of range, repeated); the message names it.
    public static let invalidParameter = Self(rawValue: "request.invalid_parameter")
}
