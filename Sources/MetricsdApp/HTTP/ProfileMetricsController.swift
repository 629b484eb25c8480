import Foundation
import HealthMetrics
import Hummingbird
import Logging
import NIOCore

/// `GET /v1/profile/metrics/today` and `POST /v1/profile/metrics/acknowledge` (SPEC.md, seeds 000/001).
struct ProfileMetricsController {
    let store: any MetricsStore
    let formula: MetricsFormula

    func addRoutes(to group: RouterGroup<AppRequestContext>) {
        group.get("today", use: self.today)
        group.post("acknowledge", use: self.acknowledge)
    }

    /// The user's latest metrics. A user with valid settings but no row yet (just onboarded) gets them computed,
    /// stored and returned now: never the 404 race of the old design.
    @Sendable func today(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        let userID = try Self.user(context)
        if let latest = try await self.store.latestMetrics(userID: userID) {
            return JSONResponse(body: Self.todayBody(latest))
        }
        return JSONResponse(body: try await Self.computeNowBody(userID: userID, store: self.store, logger: context.logger))
    }

    /// A user without a row yet: computed, stored and returned now, or a 404 saying why there is nothing.
    static func computeNowBody(userID: Int64, store: any MetricsStore, logger: Logger) async throws -> String {
        switch try await store.computeNow(userID: userID) {
        case .computed(let latest):
            logger.debug("Computed metrics on request")
            return Self.todayBody(latest)
        case .skipped(let reasons):
            throw AppError(.notFound, "no metrics: " + reasons.map(\.description).joined(separator: "; "))
        case .unknownUser:
            throw AppError(.notFound, "no metrics: user \(userID) does not exist")
        }
    }

    /// Acknowledges the metrics the user saw, named by version and `computedAt`.
    @Sendable func acknowledge(request: Request, context: AppRequestContext) async throws -> JSONResponse {
        let userID = try Self.user(context)
        let body = try await request.body.collect(upTo: context.maxUploadSize)
        let (version, computedAt) = try self.parseAcknowledgement(body)
        switch try await self.store.acknowledge(userID: userID, version: version, computedAt: computedAt) {
        case .acknowledged(let at, let version):
            return JSONResponse(
                body: JSONWriter.object([
                    "success": .bool(true),
                    "data": .raw(
                        JSONWriter.object([
                            "acknowledged": .bool(true),
                            "acknowledgement": .raw(
                                JSONWriter.object(["acknowledgedAt": .timestamp(at), "version": .int(Int64(version))])),
                        ])),
                ]))
        case .notCurrent, .noMetrics:
            throw AppError(.notFound, "Your metrics have been updated. Please refresh and try again.")
        }
    }

    /// `{"version": Int, "metricsComputedAt": ISO 8601}`; a 400 naming the field for anything else.
    func parseAcknowledgement(_ buffer: ByteBuffer) throws(AppError) -> (Int, Timestamp) {
        struct Body: Decodable {
            let version: JSONScalar?
            let metricsComputedAt: JSONScalar?
        }
        guard let body = try? JSONDecoder().decode(Body.self, from: Data(buffer.readableBytesView)) else {
            throw AppError.badRequest("body must be a JSON object with version and metricsComputedAt")
        }
        guard let versionValue = body.version else { throw AppError.badRequest("version is required") }
        guard case .number(let number) = versionValue, number.isFinite, number == number.rounded(),
            abs(number) <= 2_147_483_647
        else { throw AppError.badRequest("version must be an integer") }
        let version = Int(number)
        guard self.formula.knownVersions.contains(version) else {
            throw AppError.badRequest(
                "version \(version) is not a known formula version (\(self.formula.knownVersions.lowerBound)–\(self.formula.knownVersions.upperBound))"
            )
        }
        guard let dateValue = body.metricsComputedAt else { throw AppError.badRequest("metricsComputedAt is required") }
        guard case .string(let text) = dateValue else {
            throw AppError.badRequest("metricsComputedAt must be an ISO 8601 date-time string")
        }
        guard let computedAt = Timestamp(iso8601: text) else {
            throw AppError.badRequest("metricsComputedAt is not an ISO 8601 date-time such as 2025-10-29T14:30:45.123Z")
        }
        return (version, computedAt)
    }

    static func user(_ context: AppRequestContext) throws(AppError) -> Int64 {
        guard let userID = context.userID else { throw AppError.unauthorized("missing bearer token") }
        return userID
    }

    /// SPEC.md's body, field for field (the hot path: written straight into one string).
    static func todayBody(_ latest: LatestMetrics) -> String {
        let metrics = latest.metrics
        let explanations = Explanations(metrics)
        let version = String(metrics.version)
        var writer = JSONWriter(capacity: 1024)
        writer.raw(#"{"success":true,"data":{"metrics":{"bmi":"#)
        writer.raw(metrics.bmi.description)
        writer.raw(#","bmr":"#)
        writer.raw(String(metrics.bmr))
        writer.raw(#","tdee":"#)
        writer.raw(String(metrics.tdee))
        writer.raw(#","computedAt":""#)
        writer.raw(latest.computedAt.iso8601)
        writer.raw(#"","version":"#)
        writer.raw(version)
        writer.raw(#"},"explanations":{"bmi":"#)
        writer.writeString(explanations.bmi)
        writer.raw(#","bmr":"#)
        writer.writeString(explanations.bmr)
        writer.raw(#","tdee":"#)
        writer.writeString(explanations.tdee)
        if let acknowledgedAt = latest.acknowledgedAt {
            writer.raw(#"},"acknowledged":true,"acknowledgement":{"acknowledgedAt":""#)
            writer.raw(acknowledgedAt.iso8601)
            writer.raw(#"","version":"#)
            writer.raw(version)
            writer.raw("}}}")
        } else {
            writer.raw(#"},"acknowledged":false,"acknowledgement":null}}"#)
        }
        return writer.text
    }
}
