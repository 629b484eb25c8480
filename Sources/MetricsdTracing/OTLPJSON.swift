import NIOCore
import Tracing
import W3CTraceContext

/// An `ExportTraceServiceRequest` in OTLP's JSON encoding (the protobuf JSON mapping with OTLP's exceptions):
/// trace and span ids in lowercase hex, 64-bit integers (times, integer attributes) as decimal strings, enums as
/// their numbers.
enum OTLPJSON {
    static func request(_ spans: [FinishedSpan], serviceName: String) -> ByteBuffer {
        var out = ""
        out.reserveCapacity(256 + spans.count * 512)
        out += #"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"#
        self.string(serviceName, into: &out)
        out += #"}}]},"scopeSpans":[{"scope":{"name":"metricsd"},"spans":["#
        for (index, span) in spans.enumerated() {
            if index > 0 { out += "," }
            self.span(span, into: &out)
        }
        out += "]}]}]}"
        return ByteBuffer(string: out)
    }

    private static func span(_ span: FinishedSpan, into out: inout String) {
        out +=
            #"{"traceId":""# + span.trace.traceID.description + #"","spanId":""# + span.trace.spanID.description + "\""
        if let parent = span.parentSpanID { out += #","parentSpanId":""# + parent.description + "\"" }
        if let state = span.trace.traceStateHeaderValue, !state.isEmpty {
            out += #","traceState":"#
            self.string(state, into: &out)
        }
        out += #","name":"#
        self.string(span.name, into: &out)
        out += #","kind":"# + String(self.kind(span.kind))
        out += #","startTimeUnixNano":""# + String(span.start) + #"","endTimeUnixNano":""# + String(span.end) + "\""
        out += #","attributes":["#
        for (index, (key, value)) in span.attributes.enumerated() {
            if index > 0 { out += "," }
            self.attribute(key, value, into: &out)
        }
        out += "]"
        if !span.links.isEmpty {
            out += #","links":["#
            for (index, link) in span.links.enumerated() {
                if index > 0 { out += "," }
                out += #"{"traceId":""# + link.traceID.description + #"","spanId":""# + link.spanID.description + "\"}"
            }
            out += "]"
        }
        if let status = span.status {
            out += #","status":{"code":"# + (status.code == .error ? "2" : "1")
            if let message = status.message {
                out += #","message":"#
                self.string(message, into: &out)
            }
            out += "}"
        }
        out += "}"
    }

    /// `SPAN_KIND_*` of OTLP's `Span.SpanKind`.
    private static func kind(_ kind: SpanKind) -> Int {
        switch kind {
        case .internal: 1
        case .server: 2
        case .client: 3
        case .producer: 4
        case .consumer: 5
        }
    }

    private static func attribute(_ key: String, _ value: FinishedSpan.Value, into out: inout String) {
        out += #"{"key":"#
        self.string(key, into: &out)
        out += #","value":{"#
        switch value {
        case .string(let text):
            out += #""stringValue":"#
            self.string(text, into: &out)
        case .int(let number): out += #""intValue":""# + String(number) + "\""
        case .double(let number):
            out += number.isFinite ? #""doubleValue":"# + String(number) : #""stringValue":""# + String(number) + "\""
        case .bool(let flag): out += #""boolValue":"# + (flag ? "true" : "false")
        }
        out += "}}"
    }

    /// A JSON string literal.
    static func string(_ text: String, into out: inout String) {
        out += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}
