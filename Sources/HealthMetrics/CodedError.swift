/// A failure with a stable code: the code says which failure it is, for programs and filters; the description
/// says it in words, for people.
///
/// A code is lower-case `snake_case` words joined by dots, the first word naming the area: `token.expired`,
/// `config.invalid_value`, `database.connection_failed`. A released code keeps its meaning (a new failure gets a
/// new code); the Operations article lists them all. The same failure has the same code wherever it is reported:
/// the log carries it as `metricsd.error.code` (journal field `ERROR_CODE`), the HTTP API as `code` in its error
/// body, `check-config` and the `Error:` line of a failed command at the end of the line, in brackets.
public protocol CodedError: Error, CustomStringConvertible {
    /// The stable code of this failure.
    var errorCode: String { get }
}

/// The log fields of a failure, for any log metadata type (swift-log's `Logger.Metadata`).
extension Dictionary where Key == String, Value: ExpressibleByStringLiteral, Value.StringLiteralType == String {
    /// `metricsd.error` (the description) and, for a ``CodedError``, `metricsd.error.code`.
    public static func errorFields(_ error: any Error) -> Self {
        var fields: Self = ["metricsd.error": Value(stringLiteral: "\(error)")]
        if let coded = error as? any CodedError {
            fields["metricsd.error.code"] = Value(stringLiteral: coded.errorCode)
        }
        return fields
    }

    /// `metricsd.error` and `metricsd.error.code` of a failure given as its parts.
    public static func errorFields(_ message: String, code: String) -> Self {
        ["metricsd.error": Value(stringLiteral: message), "metricsd.error.code": Value(stringLiteral: code)]
    }
}
