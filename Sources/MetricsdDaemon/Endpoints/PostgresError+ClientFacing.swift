import MetricsdHTTP
import MetricsdPostgres

extension PostgresError: ClientFacingError {
    /// A database that cannot be reached now (or a pool closed by shutdown) is a 503 with `Retry-After` and the
    /// error's own code (`database.connection_failed`, …); any other database error is the server's fault.
    package var clientError: AppError? {
        guard self.isTransient || self.code == .poolClosed else { return nil }
        return AppError.unavailable(.database(self), "database unavailable, retry shortly")
    }
}
