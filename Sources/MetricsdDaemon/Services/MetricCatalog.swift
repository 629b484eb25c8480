import CoreMetrics
import MetricsdHTTP
import Prometheus

/// Every series of `/metrics`, with its type, help text and (for histograms) buckets: the one place the
/// exposition is documented. Conventions (Prometheus): base units (seconds, bytes), counters end in `_total`,
/// every family has `# HELP` and `# TYPE`.
///
/// The code records through swift-metrics (`Counter(label:)`, `Gauge(label:)`, `Timer(label:)`);
/// `DocumentedMetricsFactory` looks each name up here when the series is made. A name missing from the catalog
/// is exported without help text, which `promtool check metrics` and the tests report.
enum MetricCatalog {
    enum Kind: String, Sendable {
        case counter, gauge, histogram
    }

    struct Entry: Sendable {
        let name: String
        let kind: Kind
        let help: String
        /// Label names, in the order the code passes them.
        let labels: [String]
        /// Histograms only.
        let buckets: [Duration]

        init(_ name: String, _ kind: Kind, labels: [String] = [], buckets: [Duration] = [], _ help: String) {
            self.name = name
            self.kind = kind
            self.help = help
            self.labels = labels
            self.buckets = buckets
        }
    }

    /// Buckets of the HTTP latency histogram: 1 ms to 10 s.
    static let httpBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5),
        .seconds(10),
    ]
    /// Buckets of the daily-unit histograms: 1 s to 6 h.
    static let unitBuckets: [Duration] = [
        .seconds(1), .seconds(5), .seconds(15), .seconds(30), .seconds(60), .seconds(120), .seconds(300),
        .seconds(600), .seconds(1800), .seconds(3600), .seconds(7200), .seconds(21600),
    ]

    static let entries: [Entry] = [
        // Build
        Entry(
            "metricsd_build_info", .gauge, labels: ["version", "formula_version"],
            "Always 1; the labels name this build's version and formula version."),

        // HTTP
        Entry(
            "metricsd_http_requests_total", .counter, labels: ["route", "method", "status"],
            "HTTP requests answered, by route template (or unmatched, shed, too_large), method and status code."),
        Entry(
            "metricsd_http_request_duration_seconds", .histogram, labels: ["route"], buckets: httpBuckets,
            "Time from a request's arrival to its response being written, by route template."),
        Entry(
            "metricsd_http_requests_in_flight", .gauge,
            "Requests being handled right now (requests past METRICSD_MAX_IN_FLIGHT are shed with 503)."),

        // TLS (METRICSD_TLS)
        Entry(
            "metricsd_tls_certificate_expiry_timestamp_seconds", .gauge, labels: ["listener"],
            "When the certificate the listener (public, internal) serves expires, in seconds since 1970; only while it speaks TLS."
        ),

        // Database pool
        Entry(
            "metricsd_db_pool_connections", .gauge, labels: ["state"],
            "Database connections of this instance's pool: open, and in_use of those."),
        Entry(
            "metricsd_db_pool_waiting_requests", .gauge,
            "Callers waiting for a free database connection right now."),
        Entry(
            "metricsd_db_errors_total", .counter, labels: ["kind"],
            "Database errors by kind: connect, connection_lost, query, pool_timeout (no free connection in time)."),

        Entry(
            "metricsd_notifications_usable", .gauge, labels: [],
            "1 while the daemon hears settings changes and recompute wake-ups by LISTEN (a notification it sent itself arrived), 0 while it polls for them every METRICSD_IDLE_POLL_SECONDS (DATABASE_URL goes through a pooler and METRICSD_NOTIFY_DATABASE_URL is unset, or notifications do not arrive there)."
        ),

        // Read servers (METRICSD_READ_DATABASE_URL)
        Entry(
            "metricsd_read_server_reads_total", .counter, labels: ["server"],
            "Users' latest reads answered by each read server (host:port) and by the primary (server primary): each one's share of the reads."
        ),
        Entry(
            "metricsd_read_server_usable", .gauge, labels: ["server"],
            "1 while latest reads go to the read server (it answers and is within METRICSD_READ_MAX_LAG_SECONDS of the primary), else 0."
        ),
        Entry(
            "metricsd_read_server_lag_seconds", .gauge, labels: ["server"],
            "How far the read server's data may be behind the primary's commits, from its replay position (-1 until first measured); it keeps growing while the server does not answer."
        ),
        Entry(
            "metricsd_read_server_problem", .gauge, labels: ["server", "reason"],
            "1 for the reason the read server is not read from now, else 0: unreachable, not_answering (no answer within the read bound), lagging, other_cluster (another system identifier), other_timeline, other_primary (not in recovery and not DATABASE_URL's primary), primary_not_wanted (the primary; target_session_attrs asks for standbys)."
        ),
        Entry(
            "metricsd_read_fallbacks_total", .counter, labels: ["reason"],
            "Users' latest reads a read server did not answer, read again on the primary: missing (no row there yet) or error (the read failed)."
        ),

        // Daily job
        Entry(
            "metricsd_daily_units", .gauge, labels: ["state"],
            "Zones by the state of their unit for the current due date: done, running, pending, missing (not created yet)."
        ),
        Entry(
            "metricsd_daily_oldest_overdue_unit_age_seconds", .gauge,
            "Seconds since the oldest unfinished current unit fell due (its zone's local daily time); 0 when all are done."
        ),
        Entry(
            "metricsd_daily_users_waiting", .gauge,
            "Users whose zone's daily time has passed and who have neither a row nor a skip verdict for that date yet."),
        Entry(
            "metricsd_daily_units_completed_total", .counter,
            "Daily units (one zone's users for one date) this instance finished."),
        Entry(
            "metricsd_daily_unit_duration_seconds", .histogram, buckets: unitBuckets,
            "Time from a daily unit's first claim to its end, for the units this instance finished."),
        Entry(
            "metricsd_daily_lateness_seconds", .histogram, labels: ["utc_offset"], buckets: unitBuckets,
            "Time from each user's due instant (the local daily time on their date) to the commit of their row, one observation per row this instance's daily units wrote, by the zone's UTC offset at that instant (+05:45)."
        ),
        Entry(
            "metricsd_daily_unit_delay_seconds", .histogram, buckets: unitBuckets,
            "Time from a zone's due instant (local daily time) to the end of its unit, for the units this instance finished."
        ),

        // Work (daily units and recompute jobs)
        Entry(
            "metricsd_users_examined_total", .counter, labels: ["kind"],
            "Users this instance read and evaluated, by kind of work (daily, recompute): written + already current + skipped."
        ),
        Entry(
            "metricsd_users_written_total", .counter, labels: ["kind"],
            "Users whose metrics row this instance inserted or changed, by kind of work."),
        Entry(
            "metricsd_users_already_current_total", .counter, labels: ["kind"],
            "Users examined who already had the same row for the date and formula version (nothing written)."),
        Entry(
            "metricsd_users_skipped_total", .counter, labels: ["kind"],
            "Users examined whose settings cannot give metrics (a skip verdict recorded; see metricsd skipped)."),
        Entry(
            "metricsd_skip_reasons_total", .counter, labels: ["kind", "reason"],
            "Reasons given for skipped users, by reason code (a user skipped for two reasons counts under both)."),
        Entry(
            "metricsd_work_leases_taken_over_total", .counter, labels: ["kind"],
            "Chunks this instance claimed whose lease another instance held and let expire (crashed or stalled)."),
        Entry(
            "metricsd_work_chunks_lost_total", .counter,
            "Chunks this instance lost mid-work (its lease expired and another took it, or the work was cancelled); the last batch was rolled back."
        ),
        Entry(
            "metricsd_work_failures_total", .counter, labels: ["kind"],
            "Failed attempts at a chunk (daily, recompute, retention) or at claiming one (claim); the chunk is retried after a backoff."
        ),

        // Tracing (OTEL_TRACES_EXPORTER=otlp): exported only while tracing is on
        Entry(
            "metricsd_trace_spans_dropped_total", .counter,
            "Finished sampled spans never sent: the export queue was full, or the export that carried them failed."),

        // Recompute jobs
        Entry(
            "metricsd_recompute_jobs_active", .gauge,
            "Recompute jobs pending or running."),
        Entry(
            "metricsd_recompute_users", .gauge, labels: ["state"],
            "Users of the active recompute jobs: total (when created) and examined so far."),

        // Retention
        Entry(
            "metricsd_retention_rows_removed_total", .counter,
            "Metrics rows this instance removed because they were older than METRICSD_RETENTION_DAYS."),
        Entry(
            "metricsd_retention_runs_completed_total", .counter,
            "Retention runs this instance saw finish (the last chunk's worker or the tick's sweep)."),
        Entry(
            "metricsd_retention_behind_seconds", .gauge,
            "How far removal lags METRICSD_RETENTION_DAYS: the cutoff the setting asks for now minus the last finished run's (before the first, minus the oldest row's date). Only while retention is on."
        ),

        // The move of an upgraded install's history into monthly partitions
        Entry(
            "metricsd_history_move_active", .gauge,
            "1 while the history an upgrade left in the old partition of profile_metrics is being moved into monthly partitions (copied, indexed, swapped in); 0 when done or there was nothing to move."
        ),
        Entry(
            "metricsd_history_move_rows", .gauge, labels: ["state"],
            "Rows of the history move: estimated (the old partition's rows when it began, as its statistics said) and copied so far, by every instance."
        ),
        Entry(
            "metricsd_history_move_writes_pending", .gauge,
            "Writes to the old partition's rows (retention, deleted users, late rows) logged during the move and not yet replayed into the monthly partitions."
        ),
    ]

    static let byName: [String: Entry] = Dictionary(uniqueKeysWithValues: entries.map { ($0.name, $0) })

    static func help(_ name: String) -> String {
        Self.byName[name]?.help ?? ""
    }
}

/// swift-metrics over a `PrometheusCollectorRegistry`, with the help text and buckets of `MetricCatalog`.
///
/// (swift-prometheus's own `PrometheusMetricsFactory` registers every series without help text, and the
/// registry refuses a second registration of a name with other help text: so every series goes through here.)
package struct DocumentedMetricsFactory: MetricsFactory {
    let registry: PrometheusCollectorRegistry

    /// The registry's name for `label`, with the catalogue's help text (none for a name not in it).
    package init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
    }

    private static func descriptor(_ label: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: label, unitName: "", helpText: MetricCatalog.help(label))
    }

    package func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        self.registry.makeCounter(descriptor: Self.descriptor(label), labels: dimensions)
    }

    package func makeFloatingPointCounter(label: String, dimensions: [(String, String)])
        -> any FloatingPointCounterHandler
    {
        self.registry.makeCounter(descriptor: Self.descriptor(label), labels: dimensions)
    }

    package func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        guard aggregate else {
            return self.registry.makeGauge(descriptor: Self.descriptor(label), labels: dimensions)
        }
        // No series records values into a histogram today; seconds go through `Timer`.
        let buckets = MetricCatalog.byName[label]?.buckets.map { Double($0.components.seconds) } ?? [1, 10, 100]
        return self.registry.makeValueHistogram(
            descriptor: Self.descriptor(label), labels: dimensions, buckets: buckets)
    }

    package func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        self.registry.makeGauge(descriptor: Self.descriptor(label), labels: dimensions)
    }

    package func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        let buckets = MetricCatalog.byName[label].map { $0.buckets.isEmpty ? MetricCatalog.httpBuckets : $0.buckets }
        return self.registry.makeDurationHistogram(
            descriptor: Self.descriptor(label), labels: dimensions, buckets: buckets ?? MetricCatalog.httpBuckets)
    }

    package func destroyCounter(_ handler: any CounterHandler) {
        if let counter = handler as? Prometheus.Counter { self.registry.unregisterCounter(counter) }
    }

    package func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {
        if let counter = handler as? Prometheus.Counter { self.registry.unregisterCounter(counter) }
    }

    package func destroyMeter(_ handler: any MeterHandler) {
        if let gauge = handler as? Prometheus.Gauge { self.registry.unregisterGauge(gauge) }
    }

    package func destroyRecorder(_ handler: any RecorderHandler) {
        switch handler {
        case let gauge as Prometheus.Gauge: self.registry.unregisterGauge(gauge)
        case let histogram as ValueHistogram: self.registry.unregisterValueHistogram(histogram)
        default: break
        }
    }

    package func destroyTimer(_ handler: any TimerHandler) {
        if let histogram = handler as? DurationHistogram { self.registry.unregisterDurationHistogram(histogram) }
    }
}
