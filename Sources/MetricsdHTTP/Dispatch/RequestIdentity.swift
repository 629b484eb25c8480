import HTTPTypes
import Logging
import NIOHTTP1
import Synchronization

extension APIDispatcher {
    // MARK: Request ids and loggers

    /// A request's logger: every line carries its id, and the user id once authenticated.
    static func requestLogger(_ base: Logger, requestID: String, userID: Int64?) -> Logger {
        var logger = base
        logger[metadataKey: "metricsd.request.id"] = .string(requestID)
        if let userID { logger[metadataKey: "metricsd.user.id"] = .stringConvertible(userID) }
        return logger
    }

    /// The client's id when well-formed (1–64 characters of `[A-Za-z0-9._-]`), else a new one.
    static func requestID(from header: String?) -> String {
        if let header, (1...64).contains(header.utf8.count),
            header.utf8.allSatisfy({ byte in
                (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122)
                    || byte == 45 || byte == 46 || byte == 95
            })
        {
            return header
        }
        return Self.newRequestID()
    }

    /// A new id: 16 hex digits, unique within the process (a counter through a bijective mixer, seeded from the
    /// system's random source once, so ids do not repeat across restarts either). No system call per request.
    static func newRequestID() -> String {
        var value = Self.requestSeed &+ Self.requestCounter.add(1, ordering: .relaxed).newValue &* 0x9E37_79B9_7F4A_7C15
        value = (value ^ (value >> 30)) &* 0xBF58_476D_1CE4_E5B9
        value = (value ^ (value >> 27)) &* 0x94D0_49BB_1331_11EB
        value ^= value >> 31
        return value.hexDigits
    }

    private static let requestSeed: UInt64 = {
        var generator = SystemRandomNumberGenerator()
        return generator.next()
    }()
    private static let requestCounter = Atomic<UInt64>(0)

    /// A path as echoed in an error: printable ASCII only, at most 100 characters.
    static func shownPath(_ path: String) -> String {
        let printable = path.unicodeScalars.prefix(100).map {
            $0.value >= 0x21 && $0.value < 0x7f ? Character($0) : "?"
        }
        return String(printable) + (path.unicodeScalars.count > 100 ? "…" : "")
    }
}

/// The few request headers the dispatcher reads, found in one pass. Repeated `Authorization` or `X-Request-Id`
/// headers are joined with ", " (as HTTP joins repeated fields), so an ambiguous credential is never valid.
struct RequestFields {
    var authorization: String?
    var requestID: String?
    /// The `If-None-Match` field lines, when there are any (nil otherwise: no allocation for the usual request).
    var ifNoneMatch: [String]?

    init(_ headers: HTTPHeaders) {
        for (name, value) in headers {
            if Self.equalsIgnoringCase(name, "authorization") {
                self.authorization = self.authorization.map { $0 + ", " + value } ?? value
            } else if Self.equalsIgnoringCase(name, "x-request-id") {
                self.requestID = self.requestID.map { $0 + ", " + value } ?? value
            } else if Self.equalsIgnoringCase(name, "if-none-match") {
                self.ifNoneMatch = (self.ifNoneMatch ?? []) + [value]
            }
        }
    }

    /// ASCII case-insensitive comparison with a lowercase name (no allocation).
    static func equalsIgnoringCase(_ name: String, _ lowercase: StaticString) -> Bool {
        guard name.utf8.count == lowercase.utf8CodeUnitCount else { return false }
        return lowercase.withUTF8Buffer { expected in
            var index = 0
            for byte in name.utf8 {
                let folded = byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
                guard folded == expected[index] else { return false }
                index += 1
            }
            return true
        }
    }
}

extension HTTPRequest.Method {
    /// The method of a request NIO decoded.
    init(_ method: NIOHTTP1.HTTPMethod) {
        switch method {
        case .GET: self = .get
        case .POST: self = .post
        case .PUT: self = .put
        case .DELETE: self = .delete
        case .HEAD: self = .head
        case .OPTIONS: self = .options
        case .PATCH: self = .patch
        default: self = HTTPRequest.Method(method.rawValue) ?? HTTPRequest.Method("UNKNOWN")!
        }
    }
}

/// The bearer token of an `Authorization` header value, or a 401 saying what is wrong with it.
func bearerToken(_ header: String?) throws(AppError) -> Substring {
    guard let header else {
        throw AppError.unauthorized(.tokenMissing, "missing bearer token")
    }
    // Read as bytes (no array, no lowercased copy: this runs on every authenticated request): spaces before the
    // scheme are skipped, the scheme is `Bearer` in any case, and the token is everything after the space that
    // ends it.
    let bytes = header.utf8
    var start = bytes.startIndex
    while start < bytes.endIndex, bytes[start] == UInt8(ascii: " ") { start = bytes.index(after: start) }
    guard let space = bytes[start...].firstIndex(of: UInt8(ascii: " ")),
        bytes[start..<space].elementsEqual("bearer".utf8, by: { $0 | 0x20 == $1 }),
        bytes.index(after: space) < bytes.endIndex
    else {
        throw AppError.unauthorized(
            .authorizationMalformed, "malformed Authorization header: expected 'Bearer <token>'")
    }
    return header[bytes.index(after: space)...]
}

extension UInt64 {
    /// The value as 16 lowercase hex digits, leading zeros kept (request ids, entity tags).
    var hexDigits: String {
        String(unsafeUninitializedCapacity: 16) { buffer in
            let digits: StaticString = "0123456789abcdef"
            for index in 0..<16 {
                buffer[index] = digits.utf8Start[Int((self >> UInt64(60 - 4 * index)) & 0xF)]
            }
            return 16
        }
    }
}
