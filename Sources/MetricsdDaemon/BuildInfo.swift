import HealthMetrics
import MetricsdBuildStamp

/// This build.
public enum BuildInfo {
    /// The version printed by `metricsd --version` and recorded in instance heartbeats.
    public static let version = "1.0.0"

    /// The git commit this binary was built from (`-dirty` with uncommitted changes, `unknown` outside a git
    /// checkout), stamped before each build by the BuildStamp plugin.
    public static var commit: String { BuildStamp.commit }

    /// The Swift compiler that built this binary (from `#if compiler`, exact to the minor version).
    public static let swiftVersion: String = {
        #if compiler(>=6.4)
            return "6.4 or later"
        #elseif compiler(>=6.3)
            return "6.3"
        #elseif compiler(>=6.2)
            return "6.2"
        #elseif compiler(>=6.1)
            return "6.1"
        #else
            return "6.0"
        #endif
    }()

    /// The platform this binary was built for.
    public static let platform: String = {
        #if arch(x86_64)
            let arch = "x86_64"
        #elseif arch(arm64)
            let arch = "aarch64"
        #else
            let arch = "unknown"
        #endif
        #if os(Linux)
            return arch + "-linux"
        #else
            return arch
        #endif
    }()

    /// The Debian package version when built as the package (scripts/package: from its debian/changelog, e.g.
    /// `1.0.0` or `1.0.0-2`), nil otherwise; stamped before each build by the BuildStamp plugin.
    public static var packageVersion: String? { BuildStamp.packageVersion }

    /// `metricsd --version`: version, the Debian package's version when built as the package, formula version,
    /// build.
    public static let versionText: String =
        (["metricsd \(BuildInfo.version)"] + (BuildInfo.packageVersion.map { ["package \($0)"] } ?? []) + [
            "formula version \(MetricsFormula.current.version)",
            "commit \(BuildInfo.commit)",
            "built with Swift \(BuildInfo.swiftVersion) for \(BuildInfo.platform)",
        ]).joined(separator: "\n")
}
