import HTTPTypes
import HealthMetrics
import Logging
import MetricsdHTTP
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `GET /v1/profile/metrics/today` and `POST /v1/profile/metrics/acknowledge`.
struct ProfileMetricsController {
    let store: any MetricsStore
    let formula: MetricsFormula

    var endpoints: [Endpoint] {
        [
            Endpoint(.get, "/v1/profile/metrics/today", access: .user, caching: .personal, .callback(self.today)),
            Endpoint(
                .post, "/v1/profile/metrics/acknowledge", access: .user, caching: .noStore, .async(self.acknowledge)),
        ]
    }

    /// The user's latest metrics, read by the batched read (no task; the body is written on the connection's
    /// event loop). A user with valid settings but no row yet (just onboarded) gets them computed, stored and
    /// returned now, in the connection's own task: never the 404 race of the old design.
    @Sendable func today(_ request: EndpointRequest, _ done: @escaping @Sendable (Endpoint.Answer) -> Void) {
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
                // Metrics computed from settings that are no longer valid are not the person's current metrics.
                if let reasons = latest.invalidSettings {
                    done(.failure(AppError(.notFound, .settingsInvalid, "no metrics: " + reasons)))
                    return
                }
                request.eventLoop.execute { done(.reply(Reply(body: Self.todayBody(latest)))) }
            case .success(.none):
                done(
                    .later {
                        Reply(body: try await Self.computeNowBody(userID: userID, store: store, logger: request.logger))
                    })
            case .failure(let error):
                done(.failure(error))
            }
        }
    }

    /// A user without a row yet: computed, stored and returned now, or a 404 saying why there is nothing.
    static func computeNowBody(userID: Int64, store: any MetricsStore, logger: Logger) async throws -> ByteBuffer {
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
            return AppError(.notFound, .userUnknown, "no metrics: user \(userID) does not exist")
        case .invalidSettings(let reasons):
            return AppError(
                .notFound, .settingsInvalid, "no metrics: " + reasons.map(\.description).joined(separator: "; "))
        case .notComputedYet:
            return AppError(
                .notFound, .notComputedYet,
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
            throw AppError(.notFound, .stale, "Your metrics have been updated. Please refresh and try again.")
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
            throw AppError.badRequest(.invalidBody, "body must be a JSON object with version and metricsComputedAt")
        }
        guard let versionValue = body.version else { throw AppError.badRequest(.invalidBody, "version is required") }
        guard case .number(let number) = versionValue, number.isFinite, number == number.rounded(),
            abs(number) <= 2_147_483_647
        else { throw AppError.badRequest(.invalidBody, "version must be an integer") }
        let version = Int(number)
        guard self.formula.knownVersions.contains(version) else {
            throw AppError.badRequest(
                .invalidBody,
                "version \(version) is not a known formula version (\(self.formula.knownVersions.lowerBound)–\(self.formula.knownVersions.upperBound))"
            )
        }
        guard let dateValue = body.metricsComputedAt else {
            throw AppError.badRequest(.invalidBody, "metricsComputedAt is required")
        }
        guard case .string(let text) = dateValue else {
            throw AppError.badRequest(.invalidBody, "metricsComputedAt must be an ISO 8601 date-time string")
        }
        guard let computedAt = Timestamp(iso8601: text) else {
            throw AppError.badRequest(
                .invalidBody, "metricsComputedAt is not an ISO 8601 date-time such as 2025-10-29T14:30:45.123Z")
        }
        return (version, computedAt)
    }

    /// The latest-metrics body, field for field, written straight into the bytes of the reply (the busiest
    /// answer: no intermediate strings), ended by a newline.
    static func todayBody(_ latest: LatestMetrics) -> ByteBuffer {
        let metrics = latest.metrics
        var body = BodySink(ByteBufferAllocator().buffer(capacity: 768))
        body.write(#"{"success":true,"data":{"metrics":{"bmi":"#)
        Explanations.writeTenths(metrics.bmiTenths, into: &body)
        body.write(#","bmr":"#)
        body.write(decimal: metrics.bmr)
        body.write(#","tdee":"#)
        body.write(decimal: metrics.tdee)
        body.write(#","computedAt":""#)
        body.write(timestamp: latest.computedAt)
        body.write(#"","version":"#)
        body.write(decimal: Int64(metrics.version))
        // The sentences hold nothing JSON must escape (ValuesTests checks every one), so they go in as they are.
        body.write(#"},"explanations":{"bmi":""#)
        Explanations.writeBMI(metrics, into: &body)
        body.write(#"","bmr":""#)
        Explanations.writeBMR(metrics, into: &body)
        body.write(#"","tdee":""#)
        Explanations.writeTDEE(metrics, into: &body)
        if let acknowledgedAt = latest.acknowledgedAt {
            body.write(#""},"acknowledged":true,"acknowledgement":{"acknowledgedAt":""#)
            body.write(timestamp: acknowledgedAt)
            body.write(#"","version":"#)
            body.write(decimal: Int64(metrics.version))
            body.write("}}}\n")
        } else {
            body.write(#""},"acknowledged":false,"acknowledgement":null}}"#)
            body.write("\n")
        }
        return body.buffer
    }
}

/// Writes text into a `ByteBuffer`.
struct BodySink: TextSink {
    var buffer: ByteBuffer

    init(_ buffer: ByteBuffer) {
        self.buffer = buffer
    }

    mutating func write(_ text: StaticString) {
        text.withUTF8Buffer { _ = self.buffer.writeBytes($0) }
    }

    mutating func write(decimal value: Int64) {
        // At most 20 characters, written backwards into a stack buffer, then copied once.
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var magnitude = value.magnitude
            var index = 20
            repeat {
                index -= 1
                digits[index] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            if value < 0 {
                index -= 1
                digits[index] = UInt8(ascii: "-")
            }
            _ = self.buffer.writeBytes(UnsafeBufferPointer(rebasing: digits[index..<20]))
        }
    }

    mutating func write(_ text: String) {
        self.buffer.writeString(text)
    }

    /// An ISO 8601 instant with milliseconds.
    mutating func write(timestamp: Timestamp) {
        self.buffer.writeString(timestamp.iso8601)
    }
}
