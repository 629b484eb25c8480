import HTTPTypes
import HealthMetrics
import Logging
import MetricsdHTTP
import MetricsdPostgres
import MetricsdWork
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The admin API: recompute-all jobs (`POST/GET /v1/admin/recompute`, `…/{id}`, `…/{id}/cancel`).
/// Served only when an admin token is configured.
package struct AdminController {
    let jobs: RecomputeJobs
    let formula: MetricsFormula

    var endpoints: [Endpoint] {
        [
            Endpoint(.post, "/v1/admin/recompute", access: .admin, caching: .noStore, .async(self.trigger)),
            Endpoint(.get, "/v1/admin/recompute", access: .admin, caching: .noStore, .async(self.list)),
            Endpoint(.get, "/v1/admin/recompute/{id}", access: .admin, caching: .noStore, .async(self.show)),
            Endpoint(.post, "/v1/admin/recompute/{id}/cancel", access: .admin, caching: .noStore, .async(self.cancel)),
        ]
    }

    /// Creates the job for this build's formula version (202), or returns the pending/running one (200), or, when
    /// every user already has this version's row for their current date (or a current skip verdict), makes no
    /// job and returns the newest finished one (200, `nothingToDo`).
    @Sendable func trigger(_ request: EndpointRequest) async throws -> Reply {
        // No body, or a JSON object (reserved for options): anything else is a client error.
        // (Decoded as a dictionary: an empty `Decodable` struct would accept any JSON value, arrays included.)
        if request.body.readableBytes > 0 {
            guard (try? JSONDecoder().decode([String: AnyJSON].self, from: Data(request.body.readableBytesView))) != nil
            else {
                throw AppError.badRequest(.invalidBody, "body must be empty or a JSON object")
            }
        }
        let version = self.formula.version
        let outcome = try await self.jobs.trigger(version: version, requestedBy: "http")
        var metadata: Logger.Metadata = ["metricsd.version": "\(version)"]
        if let job = outcome.job { metadata["metricsd.job.id"] = "\(job.id)" }
        request.logger.info("\(Self.message(outcome, version: version))", metadata: metadata)
        let body = Self.envelope([
            "created": .bool(outcome.created),
            "nothingToDo": .bool({ if case .nothingToDo = outcome { return true } else { return false } }()),
            "message": .string(Self.message(outcome, version: version)),
            "job": outcome.job.map { .raw(Self.json($0)) } ?? .null,
        ])
        guard let job = outcome.job else { return .json(body) }
        return .json(
            body, status: outcome.created ? .accepted : .ok, headers: [.location: "/v1/admin/recompute/\(job.id)"])
    }

    /// One sentence for the API's `message`, the log and the CLI.
    package static func message(_ outcome: RecomputeJobs.TriggerOutcome, version: Int) -> String {
        switch outcome {
        case .created(let job):
            "recompute job \(job.id) created for formula version \(version) (\(job.usersTotal) users)"
        case .active(let job):
            "recompute job \(job.id) for formula version \(version) is already \(job.state.rawValue)"
        case .nothingToDo(let latest):
            "nothing to do: every user already has a formula version \(version) row for their current local date "
                + "(or a skip verdict for it)"
                + (latest.map { "; latest job \($0.id) \($0.state.rawValue): \($0.counts.summary)" } ?? "")
        }
    }

    @Sendable func list(_ request: EndpointRequest) async throws -> Reply {
        let jobs = try await self.jobs.recent(limit: 20)
        return .json(Self.envelope(["jobs": .raw("[" + jobs.map(Self.json).joined(separator: ",") + "]")]))
    }

    @Sendable func show(_ request: EndpointRequest) async throws -> Reply {
        let id = try Self.jobID(request)
        guard let job = try await self.jobs.job(id: id) else {
            throw AppError(.notFound, .jobNotFound, "no recompute job \(id)")
        }
        return .json(Self.envelope(["job": .raw(Self.json(job))]))
    }

    @Sendable func cancel(_ request: EndpointRequest) async throws -> Reply {
        // No body is needed; one that is sent is read (and ignored) within the limit, so an oversized one is a 413.
        let id = try Self.jobID(request)
        switch try await self.jobs.cancel(id: id) {
        case .cancelled(let job):
            request.logger.info("Recompute job cancelled", metadata: ["metricsd.job.id": "\(id)"])
            return .json(Self.envelope(["job": .raw(Self.json(job))]))
        case .alreadyFinished(let job):
            throw AppError(.conflict, .jobFinished, "recompute job \(id) is already \(job.state.rawValue)")
        case .notFound:
            throw AppError(.notFound, .jobNotFound, "no recompute job \(id)")
        }
    }

    static func jobID(_ request: EndpointRequest) throws(AppError) -> Int64 {
        let text = request.parameter ?? ""
        guard (1...18).contains(text.utf8.count), text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), let id = Int64(text),
            id >= 1
        else { throw AppError.badRequest(.jobInvalidID, "job id must be a positive integer") }
        return id
    }

    static func envelope(_ data: KeyValuePairs<String, JSONWriter.Value>) -> String {
        JSONWriter.object(["success": .bool(true), "data": .raw(JSONWriter.object(data))])
    }

    /// The RecomputeJob schema of the OpenAPI document.
    package static func json(_ job: RecomputeJob) -> String {
        JSONWriter.object([
            "id": .int(job.id),
            "version": .int(Int64(job.version)),
            "state": .string(job.state.rawValue),
            "usersTotal": .int(job.usersTotal),
            "usersExamined": .int(job.usersExamined),
            "usersWritten": .int(job.usersWritten),
            "usersAlreadyCurrent": .int(job.usersAlreadyCurrent),
            "usersSkipped": .int(job.usersSkipped),
            "percent": .double((job.percent * 10).rounded() / 10),
            "ratePerSecond": job.ratePerSecond.map { .double(($0 * 10).rounded() / 10) } ?? .null,
            "etaSeconds": job.etaSeconds.map { .double(($0 * 10).rounded() / 10) } ?? .null,
            "createdAt": .timestamp(job.createdAt),
            "startedAt": job.startedAt.map { .timestamp($0) } ?? .null,
            "finishedAt": job.finishedAt.map { .timestamp($0) } ?? .null,
            "lastError": job.lastError.map { .string($0) } ?? .null,
        ])
    }
}
