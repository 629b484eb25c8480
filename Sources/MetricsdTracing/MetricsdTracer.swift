import Synchronization
import Tracing
import W3CTraceContext

/// The key under which a span's W3C trace context travels in a ``ServiceContext``.
public enum TraceContextKey: ServiceContextKey {
    public typealias Value = TraceContext
    public static var nameOverride: String? { "traceparent" }
}

/// metricsd's tracer: W3C trace context, the configured ``Sampler``, and finished sampled spans handed to the
/// exporter's queue. Spans of traces that are not sampled carry their context (so that children and the
/// statements' comments follow the decision) and are never recorded.
public final class MetricsdTracer: Tracer, Sendable {
    public typealias Span = MetricsdSpan

    let sampler: Sampler
    let queue: SpanQueue

    init(sampler: Sampler, queue: SpanQueue) {
        self.sampler = sampler
        self.queue = queue
    }

    public func startSpan<Instant: TracerInstant>(
        _ operationName: String, context: @autoclosure () -> ServiceContext, ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant, function: String, file fileID: String, line: UInt
    ) -> MetricsdSpan {
        self.span(operationName, parent: context(), kind: kind, links: [], start: instant().nanosecondsSinceEpoch)
    }

    /// A new span, child of the span whose context `parent` holds (a root span when it holds none), when it is
    /// sampled; nil when it is not. metricsd's own spans are made only when sampled: a span of a trace that is not
    /// recorded would cost a request an object, a lock and ids for nothing (its statements carry no comment, and
    /// no reply names it), and its children, finding no context, make none either.
    func sampledSpan(
        _ name: String, parent: ServiceContext, kind: SpanKind, links: [ServiceContext], start: () -> UInt64
    ) -> MetricsdSpan? {
        let parentTrace = parent[TraceContextKey.self]
        if let parentTrace, !parentTrace.flags.contains(.sampled) { return nil }  // the same id decides the same
        var ids = FastIDs()
        let traceID = parentTrace?.traceID ?? TraceID.random(using: &ids)
        guard self.sampler.samples(traceIDLow: Self.low(traceID), parentSampled: parentTrace.map { _ in true }) else {
            return nil
        }
        return self.span(
            name, parent: parent, traceID: traceID, sampled: true, kind: kind, links: links, start: start())
    }

    /// A new span, child of the span whose context `parent` holds (a root span when it holds none); not recorded
    /// when not sampled (for libraries tracing through `InstrumentationSystem`).
    func span(
        _ name: String, parent: ServiceContext, kind: SpanKind, links: [ServiceContext], start: UInt64
    ) -> MetricsdSpan {
        let parentTrace = parent[TraceContextKey.self]
        var ids = FastIDs()
        let traceID = parentTrace?.traceID ?? TraceID.random(using: &ids)
        let sampled = self.sampler.samples(
            traceIDLow: Self.low(traceID), parentSampled: parentTrace.map { $0.flags.contains(.sampled) })
        return self.span(
            name, parent: parent, traceID: traceID, sampled: sampled, kind: kind, links: links, start: start)
    }

    private func span(
        _ name: String, parent: ServiceContext, traceID: TraceID, sampled: Bool, kind: SpanKind,
        links: [ServiceContext],
        start: UInt64
    ) -> MetricsdSpan {
        let parentTrace = parent[TraceContextKey.self]
        var ids = FastIDs()
        let trace = TraceContext(
            traceID: traceID, spanID: SpanID.random(using: &ids), flags: sampled ? .sampled : [],
            state: parentTrace?.state ?? TraceState([]))
        var context = parent
        context[TraceContextKey.self] = trace
        return MetricsdSpan(
            name: name, kind: kind, context: context, parentSpanID: parentTrace?.spanID,
            links: links.compactMap { $0[TraceContextKey.self] }, start: start, queue: sampled ? self.queue : nil)
    }

    /// The trace id's last 8 bytes as a big-endian number (the sampler's input).
    static func low(_ id: TraceID) -> UInt64 {
        withUnsafeBytes(of: id.bytes) { Sampler.low($0) }
    }

    public func forceFlush() {}

    public func extract<Carrier, Extract: Extractor>(
        _ carrier: Carrier, into context: inout ServiceContext, using extractor: Extract
    ) where Extract.Carrier == Carrier {
        guard let parent = extractor.extract(key: "traceparent", from: carrier),
            let trace = try? TraceContext(
                traceParentHeaderValue: parent,
                traceStateHeaderValue: extractor.extract(key: "tracestate", from: carrier))
        else { return }
        context[TraceContextKey.self] = trace
    }

    public func inject<Carrier, Inject: Injector>(
        _ context: ServiceContext, into carrier: inout Carrier, using injector: Inject
    ) where Inject.Carrier == Carrier {
        guard let trace = context[TraceContextKey.self] else { return }
        injector.inject(trace.traceParentHeaderValue, forKey: "traceparent", into: &carrier)
        if let state = trace.traceStateHeaderValue { injector.inject(state, forKey: "tracestate", into: &carrier) }
    }
}

/// Trace and span ids: SplitMix64 over one atomic counter seeded once from the system's generator. Unique and
/// evenly spread (what W3C ids and the ratio sampler need) without a system call per id, which the system
/// generator makes; they are no secret.
struct FastIDs: RandomNumberGenerator {
    private static let state = Atomic<UInt64>(UInt64.random(in: .min ... .max))

    mutating func next() -> UInt64 {
        var z = Self.state.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// One span. Thread-safe; ending it twice records it once.
public final class MetricsdSpan: Span, Sendable {
    public let context: ServiceContext
    let kind: SpanKind
    let parentSpanID: SpanID?
    let start: UInt64
    /// The exporter's queue for a sampled span; nil: not recorded.
    private let queue: SpanQueue?
    private let state: Mutex<State>

    private struct State {
        var name: String
        var attributes = SpanAttributes()
        var links: [TraceContext]
        var status: SpanStatus?
        var ended = false
    }

    init(
        name: String, kind: SpanKind, context: ServiceContext, parentSpanID: SpanID?, links: [TraceContext],
        start: UInt64,
        queue: SpanQueue?
    ) {
        self.context = context
        self.kind = kind
        self.parentSpanID = parentSpanID
        self.start = start
        self.queue = queue
        self.state = Mutex(State(name: name, links: links))
    }

    /// The span's W3C trace context.
    public var trace: TraceContext { self.context[TraceContextKey.self]! }

    public var isRecording: Bool { self.queue != nil }

    /// The `traceparent` header value of a sampled span; nil when the span is not recorded.
    public var sampledTraceParent: String? { self.isRecording ? self.trace.traceParentHeaderValue : nil }

    public var operationName: String {
        get { self.state.withLock { $0.name } }
        set { self.state.withLock { $0.name = newValue } }
    }

    public var attributes: SpanAttributes {
        get { self.state.withLock { $0.attributes } }
        set { self.state.withLock { $0.attributes = newValue } }
    }

    /// Sets one attribute (nothing for a span that is not recorded).
    public func set(_ key: String, _ value: SpanAttribute) {
        guard self.isRecording else { return }
        self.state.withLock { $0.attributes[key] = value }
    }

    public func setStatus(_ status: SpanStatus) {
        self.state.withLock { $0.status = status }
    }

    public func addEvent(_ event: SpanEvent) {}

    public func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {
        self.state.withLock { $0.status = SpanStatus(code: .error) }
    }

    public func addLink(_ link: SpanLink) {
        guard let trace = link.context[TraceContextKey.self] else { return }
        self.state.withLock { $0.links.append(trace) }
    }

    /// Links this span to the span whose context `other` is.
    public func link(_ other: ServiceContext) {
        guard self.isRecording, let trace = other[TraceContextKey.self] else { return }
        self.state.withLock { $0.links.append(trace) }
    }

    public func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        guard let queue = self.queue else { return }
        let end = instant().nanosecondsSinceEpoch
        let finished: FinishedSpan? = self.state.withLock { state in
            guard !state.ended else { return nil }
            state.ended = true
            return FinishedSpan(
                trace: self.trace, parentSpanID: self.parentSpanID, name: state.name, kind: self.kind,
                start: self.start,
                end: end, attributes: FinishedSpan.values(state.attributes), links: state.links, status: state.status)
        }
        if let finished { queue.add(finished) }
    }
}

/// A sampled span once ended: what the exporter sends.
struct FinishedSpan: Sendable {
    enum Value: Sendable {
        case string(String)
        case int(Int64)
        case double(Double)
        case bool(Bool)
    }

    let trace: TraceContext
    let parentSpanID: SpanID?
    let name: String
    let kind: SpanKind
    let start: UInt64
    let end: UInt64
    let attributes: [(String, Value)]
    let links: [TraceContext]
    let status: SpanStatus?

    static func values(_ attributes: SpanAttributes) -> [(String, Value)] {
        var values: [(String, Value)] = []
        // SpanAttributes is no Sequence: `forEach` is its only way through.
        // swift-format-ignore: ReplaceForEachWithForLoop
        attributes.forEach { key, attribute in
            switch attribute {
            case .int32(let value): values.append((key, .int(Int64(value))))
            case .int64(let value): values.append((key, .int(value)))
            case .double(let value): values.append((key, .double(value)))
            case .bool(let value): values.append((key, .bool(value)))
            case .string(let value): values.append((key, .string(value)))
            case .stringConvertible(let value): values.append((key, .string(value.description)))
            default: values.append((key, .string("\(attribute)")))
            }
        }
        return values.sorted { $0.0 < $1.0 }
    }
}
