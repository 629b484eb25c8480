import Foundation
import HealthMetrics
import HTTPTypes
import Logging
import NIOCore

/// `GET /v1/profile/metrics/today` and `POST /v1/profile/metrics/acknowledge`.
struct ProfileMetricsController {
    let store: any MetricsStore
    let formula: MetricsFormula

    var endpoints: [Endpoint] {
        [
            Endpoint(.get, "/v1/profile/metrics/today", access: .user, .callback(self.today)),
            Endpoint(.post, "/v1/profile/metrics/acknowledge", access: .user, .async(self.acknowledge)),
        ]
    }

    /// The user's latest metrics, read by the batched read (no task; the body is written on the connection's
    /// event loop). A user with valid settings but no row yet (just onboarded) gets them computed, stored and
    /// returned now: never the 404 race of the old design.
    @Sendable func today(_ request: EndpointRequest, _ done: @escaping @Sendable (Result<Reply, any Error>) -> Void) {
        let userID: Int64
        do {
            userID = try request.user()
        } catch {
            done(.failure(error))
            return
        }
        let store = self.store
        store.latestMetrics(userID: userID) { result in
            switch result {
            case .success(.some(let latest)):
                request.eventLoop.execute { done(.success(.json(Self.todayBody(latest)))) }
            case .success(.none):
                Task {
                    do {
                        done(.success(.json(try await Self.computeNowBody(userID: userID, store: store, logger: request.logger))))
                    } catch {
                        done(.failure(error))
                    }
                }
            case .failure(let error):
                done(.failure(error))
            }
        }
    }

    /// A user without a row yet: computed, stored and returned now, or a 404 saying why there is nothing.
    static func computeNowBody(userID: Int64, store: any MetricsStore, logger: Logger) async throws -> String {
        switch try await store.computeNow(userID: userID) {
        case .computed(let latest):
            logger.debug("Computed metrics on request")
            return Self.todayBody(latest)
        case .skipped(let reasons):
            throw Self.noMetrics(userID: userID, .invalidSettings(reasons))
        case .unknownUser:
            throw Self.noMetrics(userID: userID, .unknownUser)
        }
    }

    /// The 404 of a user who has no metrics, saying why (the same words for the read and the acknowledgement).
    static func noMetrics(userID: Int64, _ reason: NoMetricsReason) -> AppError {
        switch reason {
        case .unknownUser:
            return AppError(.notFound, "no metrics: user \(userID) does not exist")
        case .invalidSettings(let reasons):
            return AppError(.notFound, "no metrics: " + reasons.map(\.description).joined(separator: "; "))
        case .notComputedYet:
            return AppError(
                .notFound,
                "no metrics yet: nothing to acknowledge; GET /v1/profile/metrics/today computes and returns them")
        }
    }

    /// Acknowledges the metrics the user saw, named by version and `computedAt`.
    @Sendable func acknowledge(_ request: EndpointRequest) async throws -> Reply {
        let userID = try request.user()
        let (version, computedAt) = try self.parseAcknowledgement(request.body)
        switch try await self.store.acknowledge(userID: userID, version: version, computedAt: computedAt) {
        case .acknowledged(let at, let version):
            return .json(
                JSONWriter.object([
                    "success": .bool(true),
                    "data": .raw(
                        JSONWriter.object([
                            "acknowledged": .bool(true),
                            "acknowledgement": .raw(
                                JSONWriter.object(["acknowledgedAt": .timestamp(at), "version": .int(Int64(version))])),
                        ])),
                ]))
        case .notCurrent:
            throw AppError(.notFound, "Your metrics have been updated. Please refresh and try again.")
        case .noMetrics(let reason):
            throw Self.noMetrics(userID: userID, reason)
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

    /// The latest-metrics body, field for field (written straight into one string: the busiest answer).
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
