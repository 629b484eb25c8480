// swift-tools-version:6.2
import PackageDescription

/// One set of language settings for every Swift target, tests included (Swift 6 mode implies strict concurrency).
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "metricsd",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "metricsd", targets: ["metricsd"])
    ],
    dependencies: [
        // 1.7 and later import FoundationEssentials, not Foundation (whose ICU data is 34 MB of the binary).
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.7.0"),
        // Tests only (keys and tokens for the token tests): metricsd verifies tokens with the system's libcrypto.
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.1.0"),
        // The tracing API (spans, service contexts); metricsd's own tracer and OTLP/HTTP JSON exporter implement it
        // (MetricsdTracing, which says why not swift-otel).
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.3.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.20.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.27.0"),
        // No default traits: ConfigurationSupport would link swift-configuration (0.6 MB) into HummingbirdCore
        // for a configuration reader metricsd does not use; FullFoundation is for Hummingbird's form coding.
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.20.0", traits: []),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.1.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        // W3C trace context: traceparent/tracestate parsing and formatting, random trace and span ids.
        .package(url: "https://github.com/swift-otel/swift-w3c-trace-context.git", from: "1.0.0"),
        // Tests only: an independent implementation that mints the tokens metricsd verifies (jwt-kit would link
        // swift-certificates' X.509 code and swift-crypto's BoringSSL into the binary for nothing).
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.1.0"),
    ],
    targets: [
        // Pure core: formulas, validation, explanations, ages, daily time. No I/O, no clock.
        .target(name: "HealthMetrics", swiftSettings: swiftSettings),

        // C libraries through pkg-config.
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // OpenSSL's libcrypto, which libpq loads anyway: the signature maths of token checks.
        .systemLibrary(name: "CLibCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),

        // The one masking rule for passwords and secrets in any text metricsd shows. No dependencies.
        .target(name: "MetricsdMasking", swiftSettings: swiftSettings),

        // Tracing: the tracer behind swift-distributed-tracing's API (W3C trace context, samplers), the spans'
        // helpers every module uses, and the exporter that sends finished spans as OTLP/HTTP JSON.
        .target(
            name: "MetricsdTracing",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
            ],
            swiftSettings: swiftSettings
        ),

        // The libpq driver alone: connections, the pool, results, errors, connection settings (the connection rules)
        // and the migrator with the embedded migrations.
        .target(
            name: "MetricsdPostgres",
            dependencies: [
                "CLibPQ", "HealthMetrics", "MetricsdMasking", "MetricsdTracing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings,
            plugins: ["EmbedResourcesPlugin"]
        ),
        .target(
            name: "MetricsdSystemd",
            dependencies: [
                "CSystemd", "MetricsdMasking",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),

        // The git commit, stamped before each build (metricsd --version).
        .plugin(name: "BuildStampPlugin", capability: .buildTool(), path: "Sources/BuildStampPlugin"),
        .target(name: "MetricsdBuildStamp", plugins: ["BuildStampPlugin"]),

        // migrations/*.sql and the OpenAPI document, embedded at build time (nothing generated is committed).
        .executableTarget(name: "ResourceEmbedder", swiftSettings: swiftSettings),
        .plugin(
            name: "EmbedResourcesPlugin", capability: .buildTool(), dependencies: ["ResourceEmbedder"],
            path: "Sources/EmbedResourcesPlugin"),

        // The daily work, each piece with its SQL: the schedule (due rule, scheduler service), claiming, batches,
        // recompute-all, retention and partitions, settings changes, and the work's status.
        .target(
            name: "MetricsdWork",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdSystemd", "MetricsdTracing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),

        // Serving reads: the store behind the API (latest read, computation on request, acknowledgements,
        // readiness), the batched latest read and the read servers.
        .target(
            name: "MetricsdReads",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdTracing", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),

        // The HTTP server: listeners (bound, or from systemd), connection handling, the dispatch table, reply encoding, token checks.
        // Knows nothing of PostgreSQL or of metricsd's endpoints.
        .target(
            name: "MetricsdHTTP",
            dependencies: [
                "CLibCrypto", "HealthMetrics", "MetricsdTracing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),

        // Configuration: the settings catalogue, settings files, credentials, and the typed configuration.
        .target(
            name: "MetricsdConfiguration",
            dependencies: [
                "HealthMetrics", "MetricsdHTTP", "MetricsdMasking", "MetricsdPostgres", "MetricsdReads",
                "MetricsdSystemd",
                "MetricsdTracing", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),

        // The daemon: built from the configuration (the composition root), reload, lifecycle, its own services and
        // its endpoints with the OpenAPI document.
        .target(
            name: "MetricsdDaemon",
            dependencies: [
                "HealthMetrics", "MetricsdBuildStamp", "MetricsdConfiguration", "MetricsdHTTP", "MetricsdPostgres",
                "MetricsdReads", "MetricsdSystemd", "MetricsdTracing", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            exclude: ["Resources/openapi.yaml"],
            swiftSettings: swiftSettings,
            plugins: ["EmbedResourcesPlugin"]
        ),

        // The command line: every command and its output.
        .target(
            name: "MetricsdCLI",
            dependencies: [
                "HealthMetrics", "MetricsdConfiguration", "MetricsdDaemon", "MetricsdHTTP", "MetricsdPostgres",
                "MetricsdReads", "MetricsdSystemd", "MetricsdWork",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),

        // Thin executable.
        .executableTarget(name: "metricsd", dependencies: ["MetricsdCLI"], swiftSettings: swiftSettings),

        // Tests split as the code is. Unit targets need no database and run in seconds (HealthMetricsTests,
        // MetricsdMaskingTests, MetricsdSystemdTests, MetricsdHTTPTests, MetricsdConfigurationTests, MetricsdCLITests,
        // MetricsdDaemonTests); database targets run against the real server scripts/test starts and fail without it
        // (MetricsdPostgresTests, MetricsdWorkTests, MetricsdReadsTests); IntegrationTests drive the built binary and
        // the HTTP API against real PostgreSQL; FaultTests hold the long fault-injection, failover and standby suites.
        .testTarget(name: "HealthMetricsTests", dependencies: ["HealthMetrics"], swiftSettings: swiftSettings),
        .testTarget(name: "MetricsdMaskingTests", dependencies: ["MetricsdMasking"], swiftSettings: swiftSettings),
        // The service manager's side of sd_notify, shared by the test targets.
        .target(name: "NotifyTestSupport", path: "Tests/NotifyTestSupport", swiftSettings: swiftSettings),
        // Test databases and clusters, the built daemon as a process, raw HTTP, JWT signing, invariants.
        .target(
            name: "MetricsdTestSupport",
            dependencies: [
                "HealthMetrics", "MetricsdConfiguration", "MetricsdDaemon", "MetricsdHTTP", "MetricsdPostgres",
                "MetricsdReads",
                "MetricsdSystemd", "MetricsdWork", "NotifyTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Tests/MetricsdTestSupport",
            swiftSettings: swiftSettings
        ),
        // metricsd with faults injected through its test seams (METRICSD_FAULTS), for the fault-injection suites.
        .executableTarget(
            name: "metricsd-faults",
            dependencies: ["MetricsdCLI", "MetricsdDaemon", "MetricsdPostgres", "MetricsdWork"],
            path: "Tests/FaultInjectingDaemon", swiftSettings: swiftSettings),
        .testTarget(
            name: "MetricsdSystemdTests",
            dependencies: ["MetricsdSystemd", "NotifyTestSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdHTTPTests",
            dependencies: [
                "HealthMetrics", "MetricsdHTTP", "MetricsdTestSupport",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdConfigurationTests",
            dependencies: ["MetricsdConfiguration", "MetricsdHTTP", "MetricsdTestSupport", "MetricsdTracing"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdCLITests",
            dependencies: ["MetricsdCLI", "MetricsdHTTP"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdDaemonTests",
            dependencies: [
                "HealthMetrics", "MetricsdCLI", "MetricsdConfiguration", "MetricsdDaemon", "MetricsdHTTP",
                "MetricsdPostgres",
                "MetricsdReads", "MetricsdSystemd", "MetricsdTestSupport", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdPostgresTests",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdTestSupport", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdWorkTests",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdReads", "MetricsdTestSupport", "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            exclude: ["Fixtures"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdReadsTests",
            dependencies: [
                "HealthMetrics", "MetricsdMasking", "MetricsdPostgres", "MetricsdReads", "MetricsdTestSupport",
                "MetricsdWork",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "HealthMetrics", "MetricsdCLI", "MetricsdConfiguration", "MetricsdDaemon", "MetricsdHTTP",
                "MetricsdPostgres",
                "MetricsdReads", "MetricsdSystemd", "MetricsdTestSupport", "MetricsdWork", "NotifyTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "FaultTests",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdTestSupport", "MetricsdWork",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
