import Foundation
import HealthMetrics
import Hummingbird
import Logging
import MetricsdPostgres

/// The admin API: recompute-all jobs (`POST/GET /v1/admin/recompute`, `…/{id}`, `…/{id}/cancel`).
/// Served only when an admin token is configured.
struct AdminController {
    let jobs: RecomputeJobs
    let formula: MetricsFormula

    func addRoutes(to group: RouterGroup<AppRequestContext>) {
        group.post("recompute", use: self.trigger)
        group.get("recompute", use: self.list)
        group.get("recompute/{id}", use: self.show)
        group.post("recompute/{id}/cancel", use: self.cancel)
    }

    /// Creates the job for this build's formula version (202), or returns the pending/running one (200).
    @Sendable func trigger(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        // No body, or a JSON object (reserved for options): anything else is a client error.
        let body = try await request.body.collect(upTo: context.maxUploadSize)
        // (Decoded as a dictionary: an empty `Decodable` struct would accept any JSON value, arrays included.)
        if body.readableBytes > 0 {
            guard (try? JSONDecoder().decode([String: AnyJSON].self, from: Data(body.readableBytesView))) != nil else {
                throw AppError.badRequest("body must be empty or a JSON object")
            }
        }
        let (job, created) = try await self.jobs.trigger(version: self.formula.version, requestedBy: "http")
        context.logger.info(
            created ? "Recompute job created" : "Recompute job already active",
            metadata: ["metricsd.job.id": "\(job.id)", "metricsd.version": "\(job.version)"])
        return JSONResponse(
            status: created ? .accepted : .ok, headers: [.location: "/v1/admin/recompute/\(job.id)"],
            body: Self.envelope(["created": .bool(created), "job": .raw(Self.json(job))]))
    }

    @Sendable func list(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        let jobs = try await self.jobs.recent(limit: 20)
        return JSONResponse(body: Self.envelope(["jobs": .raw("[" + jobs.map(Self.json).joined(separator: ",") + "]")]))
    }

    @Sendable func show(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        let id = try Self.jobID(context)
        guard let job = try await self.jobs.job(id: id) else { throw AppError(.notFound, "no recompute job \(id)") }
        return JSONResponse(body: Self.envelope(["job": .raw(Self.json(job))]))
    }

    @Sendable func cancel(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        // No body is needed; one that is sent is read (and ignored) within the limit, so an oversized one is a 413.
        _ = try await request.body.collect(upTo: context.maxUploadSize)
        let id = try Self.jobID(context)
        switch try await self.jobs.cancel(id: id) {
        case .cancelled(let job):
            context.logger.info("Recompute job cancelled", metadata: ["metricsd.job.id": "\(id)"])
            return JSONResponse(body: Self.envelope(["job": .raw(Self.json(job))]))
        case .alreadyFinished(let job):
            throw AppError(.conflict, "recompute job \(id) is already \(job.state.rawValue)")
        case .notFound:
            throw AppError(.notFound, "no recompute job \(id)")
        }
    }

    static func jobID(_ context: AppRequestContext) throws(AppError) -> Int64 {
        let text = context.parameters.get("id") ?? ""
        guard (1...18).contains(text.utf8.count), text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), let id = Int64(text),
            id >= 1
        else { throw AppError.badRequest("job id must be a positive integer") }
        return id
    }

    static func envelope(_ data: KeyValuePairs<String, JSONWriter.Value>) -> String {
        JSONWriter.object(["success": .bool(true), "data": .raw(JSONWriter.object(data))])
    }

    /// The RecomputeJob schema of the OpenAPI document.
    static func json(_ job: RecomputeJob) -> String {
        JSONWriter.object([
            "id": .int(job.id),
            "version": .int(Int64(job.version)),
            "state": .string(job.state.rawValue),
            "usersTotal": .int(job.usersTotal),
            "usersDone": .int(job.usersDone),
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
