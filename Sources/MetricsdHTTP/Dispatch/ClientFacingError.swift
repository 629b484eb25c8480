/// An error from below the HTTP layer that knows how a client should be answered: a database that is
/// unreachable is a 503 with `Retry-After`, not a 500. The dispatcher logs it as a warning and answers with
/// `clientError`; an error that returns nil is the server's fault (a 500 naming the request id).
package protocol ClientFacingError: Error {
    /// The answer for the client, or nil for a 500.
    var clientError: AppError? { get }
}
