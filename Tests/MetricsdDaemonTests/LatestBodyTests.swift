import Foundation
import HealthMetrics
import NIOCore
import Testing

@testable import MetricsdDaemon

/// The hand-written body of the latest read, against Foundation's JSON parser.
@Suite struct LatestBodyTests {
    /// The body of `GET …/today`, written byte by byte, is well-formed JSON with the values and the explanation
    /// sentences, with and without an acknowledgement.
    @Test(arguments: [nil, Timestamp(millisecondsSinceEpoch: 1_761_748_245_123)])
    func todayBodyIsWellFormed(_ acknowledgedAt: Timestamp?) throws {
        let latest = LatestMetrics(
            metrics: ComputedMetrics(bmiTenths: 225, bmr: 1650, tdee: 2268, version: 1),
            computedAt: Timestamp(millisecondsSinceEpoch: 1_761_696_300_000), acknowledgedAt: acknowledgedAt)
        let buffer = ProfileMetricsController.todayBody(latest)
        let body = String(buffer: buffer)
        #expect(body.hasSuffix("}\n"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
        #expect(object["success"] as? Bool == true)
        let data = try #require(object["data"] as? [String: Any])
        let metrics = try #require(data["metrics"] as? [String: Any])
        #expect((metrics["bmi"] as? NSNumber)?.doubleValue == 22.5)
        #expect(metrics["bmr"] as? Int == 1650)
        #expect(metrics["tdee"] as? Int == 2268)
        #expect(metrics["computedAt"] as? String == "2025-10-29T00:05:00.000Z")
        #expect(metrics["version"] as? Int == 1)
        let explanations = try #require(data["explanations"] as? [String: String])
        #expect(
            explanations == [
                "bmi": Explanations(latest.metrics).bmi, "bmr": Explanations(latest.metrics).bmr,
                "tdee": Explanations(latest.metrics).tdee,
            ])
        #expect(data["acknowledged"] as? Bool == (acknowledgedAt != nil))
        if let acknowledgedAt {
            let acknowledgement = try #require(data["acknowledgement"] as? [String: Any])
            #expect(acknowledgement["acknowledgedAt"] as? String == acknowledgedAt.iso8601)
            #expect(acknowledgement["version"] as? Int == 1)
        } else {
            #expect(data["acknowledgement"] is NSNull)
        }
    }
}
