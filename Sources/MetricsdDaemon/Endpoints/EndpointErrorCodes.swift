import MetricsdHTTP
import MetricsdPostgres

/// The endpoints' error codes (the HTTP layer's own are ``AppError/Code/httpCodes``).
extension AppError.Code {
    /// 400: a request body the endpoint cannot use; the message names the field.
    public static let invalidBody = Self(rawValue: "request.invalid_body")
    /// 404: the token's user does not exist.
    public static let userUnknown = Self(rawValue: "metrics.user_unknown")
    /// 404: the user's settings are missing or invalid; the message gives every reason.
    public static let settingsInvalid = Self(rawValue: "metrics.settings_invalid")
    /// 404 (acknowledge): the user has no metrics yet; the latest read computes them.
    public static let notComputedYet = Self(rawValue: "metrics.not_computed_yet")
    /// 404 (acknowledge): the metrics named are no longer the current ones.
    public static let stale = Self(rawValue: "metrics.stale")
    /// 406: the `Accept` header names no format the export can send.
    public static let notAcceptable = Self(rawValue: "request.not_acceptable")
    /// 429: an export of the same user's metrics is still being sent.
    public static let exportInProgress = Self(rawValue: "export.in_progress")
    /// 400: the job id in the path is not a positive 64-bit integer.
    public static let jobInvalidID = Self(rawValue: "job.invalid_id")
    /// 404: no recompute job has this id.
    public static let jobNotFound = Self(rawValue: "job.not_found")
    /// 409: the job is already finished (done, failed or cancelled).
    public static let jobFinished = Self(rawValue: "job.finished")

    /// The 503 of a database that cannot be reached now: the database error's own code
    /// (`database.connection_failed`, `database.pool_timeout`, …).
    static func database(_ error: PostgresError) -> Self { Self(rawValue: error.errorCode) }

    /// Database codes an API reply may carry (503): those of ``PostgresError/clientError``.
    public static let databaseCodes: [Self] = [
        PostgresError.Code.connectionFailed, .connectionLost, .queryFailed, .poolTimeout, .poolClosed,
    ].map { Self(rawValue: $0.errorCode) }

    /// The endpoints' codes, the database's 503s included.
    public static let endpointCodes: [Self] =
        [
            .invalidBody, .userUnknown, .settingsInvalid, .notComputedYet, .stale, .jobInvalidID, .jobNotFound,
            .jobFinished,
            .notAcceptable, .exportInProgress,
        ]
        + databaseCodes
}
