import CoreMetrics
import Logging
import Synchronization
import Tracing
import W3CTraceContext

/// The process's tracing, as every module uses it: off (the default) until the daemon ``install(_:logger:)``s
/// it. While off, every helper here is one relaxed atomic load and a branch: no span, no service context, no
/// allocation on the read's path.
public enum Traces {
    private static let enabled = Atomic<Bool>(false)
    private static let installed = Mutex<MetricsdTracer?>(nil)

    /// Whether spans are made at all.
    @inline(__always)
    public static var isEnabled: Bool { self.enabled.load(ordering: .relaxed) }

    /// Turns tracing on for the rest of the process and returns the service that exports the spans (run it in the
    /// daemon's service group). Also the tracer of `InstrumentationSystem`, for any library that traces.
    public static func install(_ settings: TracingSettings, logger: Logger) -> SpanExporter {
        let dropped = Counter(label: "metricsd_trace_spans_dropped_total")
        let queue = SpanQueue(capacity: settings.queueCapacity, dropped: dropped)
        let tracer = MetricsdTracer(sampler: settings.sampler, queue: queue)
        let first = self.installed.withLock { installed in
            defer { installed = tracer }
            return installed == nil
        }
        if first { InstrumentationSystem.bootstrap(tracer) }
        self.enabled.store(true, ordering: .relaxed)
        return SpanExporter(settings: settings, queue: queue, dropped: dropped, logger: logger)
    }

    /// The tracer, when tracing is on.
    public static var tracer: MetricsdTracer? {
        guard self.isEnabled else { return nil }
        return self.installed.withLock { $0 }
    }

    /// A new span, child of the span in `parent` (root when it holds none); nil while tracing is off, and when the
    /// span is not sampled.
    public static func startSpan(
        _ name: String, kind: SpanKind = .internal, parent: ServiceContext?, links: [ServiceContext] = []
    ) -> MetricsdSpan? {
        guard let tracer = self.tracer else { return nil }
        return tracer.sampledSpan(
            name, parent: parent ?? .topLevel, kind: kind, links: links,
            start: { DefaultTracerClock.now.nanosecondsSinceEpoch })
    }

    /// The current task's span context, when tracing is on and there is one (what a callback or a pool thread
    /// carries to continue the trace).
    public static var currentContext: ServiceContext? {
        guard self.isEnabled, let context = ServiceContext.current, context[TraceContextKey.self] != nil else {
            return nil
        }
        return context
    }

    /// Runs `operation` in a span, child of the current task's span (root without one), which is current for the
    /// operation's own spans; an error thrown marks it failed. While tracing is off: `operation(nil)`.
    public static func withSpan<T>(
        _ name: String, kind: SpanKind = .internal, attributes: [(String, SpanAttribute)] = [],
        isolation: isolated (any Actor)? = #isolation, _ operation: (MetricsdSpan?) async throws -> T
    ) async rethrows -> T {
        guard let span = self.startSpan(name, kind: kind, parent: ServiceContext.current) else {
            return try await operation(nil)
        }
        for (key, value) in attributes { span.set(key, value) }
        defer { span.end() }
        do {
            return try await ServiceContext.$current.withValue(span.context) { try await operation(span) }
        } catch {
            span.setStatus(SpanStatus(code: .error))
            span.set("error.type", .string(String(describing: type(of: error))))
            throw error
        }
    }

    /// A request's parent from its `traceparent` and `tracestate` header values; nil when there is no valid
    /// `traceparent` (the request then starts a trace).
    public static func remoteParent(traceParent: String?, traceState: String?) -> ServiceContext? {
        guard let traceParent,
            let trace = try? TraceContext(traceParentHeaderValue: traceParent, traceStateHeaderValue: traceState)
        else { return nil }
        var context = ServiceContext.topLevel
        context[TraceContextKey.self] = trace
        return context
    }

    /// Whether the span whose context `context` holds is sampled.
    public static func isSampled(_ context: ServiceContext) -> Bool {
        context[TraceContextKey.self]?.flags.contains(.sampled) ?? false
    }
}
