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
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.1.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.20.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.20.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.1.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.1.0"),
    ],
    targets: [
        // Pure core: formulas, validation, explanations, ages, daily time. No I/O, no clock.
        .target(name: "HealthMetrics", swiftSettings: swiftSettings),

        // C libraries through pkg-config.
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),

        // Adapters.
        .target(
            name: "MetricsdPostgres",
            dependencies: [
                "CLibPQ", "HealthMetrics",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MetricsdSystemd",
            dependencies: [
                "CSystemd",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),

        // The git commit, stamped before each build (metricsd --version).
        .plugin(name: "BuildStampPlugin", capability: .buildTool(), path: "Sources/BuildStampPlugin"),
        .target(name: "MetricsdBuildStamp", plugins: ["BuildStampPlugin"]),

        // Everything testable above the adapters: configuration, HTTP, services, log formats.
        .target(
            name: "MetricsdApp",
            dependencies: [
                "HealthMetrics", "MetricsdBuildStamp", "MetricsdPostgres", "MetricsdSystemd",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            exclude: ["Resources/openapi.yaml"],
            swiftSettings: swiftSettings
        ),

        // Thin executable: argument parsing and wiring.
        .executableTarget(
            name: "metricsd",
            dependencies: [
                "MetricsdApp",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),

        .testTarget(name: "HealthMetricsTests", dependencies: ["HealthMetrics"], swiftSettings: swiftSettings),
        // The service manager's side of sd_notify, shared by the test targets.
        .target(name: "NotifyTestSupport", path: "Tests/NotifyTestSupport", swiftSettings: swiftSettings),
        .testTarget(
            name: "MetricsdSystemdTests",
            dependencies: ["MetricsdSystemd", "NotifyTestSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MetricsdTests",
            dependencies: [
                "HealthMetrics", "MetricsdPostgres", "MetricsdSystemd", "MetricsdApp", "NotifyTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
            ],
            exclude: ["Fixtures"],
            swiftSettings: swiftSettings
        ),
    ]
)
