import Foundation
import Testing

/// The unit file passes systemd's own checks. `systemd-analyze` missing is a failure, never a skip.
@Suite struct SystemdUnitTests {
    /// The repository root: this file is `<root>/Tests/MetricsdSystemdTests/SystemdUnitTests.swift`.
    static let repositoryRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let unitFile = Self.repositoryRoot.appendingPathComponent("systemd/metricsd.service")

    /// The installed `systemd-analyze`, or a failed test saying how to get it.
    static func systemdAnalyze() throws -> String {
        let candidates = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        return try #require(
            candidates.first { FileManager.default.isExecutableFile(atPath: $0) },
            "systemd-analyze not found in \(candidates): install systemd (apt-get install systemd) to check the unit"
        )
    }

    /// Runs `executable` with a fixed environment and returns its exit status and output.
    static func run(_ executable: String, _ arguments: [String]) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let stdoutURL = directory.appendingPathComponent("stdout")
        let stderrURL = directory.appendingPathComponent("stderr")
        try #require(FileManager.default.createFile(atPath: stdoutURL.path, contents: nil))
        try #require(FileManager.default.createFile(atPath: stderrURL.path, contents: nil))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "SYSTEMD_COLORS": "0"]
        process.standardOutput = try FileHandle(forWritingTo: stdoutURL)
        process.standardError = try FileHandle(forWritingTo: stderrURL)
        try process.run()
        process.waitUntilExit()
        return (
            process.terminationStatus,
            try String(contentsOf: stdoutURL, encoding: .utf8),
            try String(contentsOf: stderrURL, encoding: .utf8)
        )
    }

    static let socketFiles = ["metricsd.socket", "metricsd-internal.socket"].map {
        Self.repositoryRoot.appendingPathComponent("systemd/\($0)")
    }

    /// `verify` fails when an `Exec…=` binary does not exist and only warns (exit 0) on unknown keys, so it
    /// checks a copy that starts `/bin/true`, beside the two socket units, and any output at all is a failure.
    @Test func verifyPrintsNothing() throws {
        let analyze = try Self.systemdAnalyze()
        let original = try String(contentsOf: Self.unitFile, encoding: .utf8)
        let prefix = "ExecStart=/usr/bin/metricsd "
        var lines = original.components(separatedBy: "\n")
        try #require(lines.contains { $0.hasPrefix(prefix) }, "no `\(prefix)…` line in the unit")
        for index in lines.indices where lines[index].hasPrefix("Exec") {
            lines[index] = lines[index].replacingOccurrences(of: "/usr/bin/metricsd ", with: "/bin/true ")
        }

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "metricsd-unit-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let copy = directory.appendingPathComponent("metricsd.service")
        try lines.joined(separator: "\n").write(to: copy, atomically: true, encoding: .utf8)

        var paths = [copy.path]
        for socket in Self.socketFiles {
            let socketCopy = directory.appendingPathComponent(socket.lastPathComponent)
            try String(contentsOf: socket, encoding: .utf8).write(to: socketCopy, atomically: true, encoding: .utf8)
            paths.append(socketCopy.path)
        }
        let result = try Self.run(analyze, ["verify", "--man=no"] + paths)
        #expect(result.status == 0, "systemd-analyze verify exited \(result.status)")
        #expect(
            result.stdout + result.stderr == "", "systemd-analyze verify printed:\n\(result.stdout)\(result.stderr)")
    }

    /// Exposure at most 1.5 (`--threshold` is in tenths).
    @Test func securityExposureIsAtMostOnePointFive() throws {
        let analyze = try Self.systemdAnalyze()
        let result = try Self.run(analyze, ["security", "--offline=true", "--threshold=15", Self.unitFile.path])
        let score = result.stdout.split(separator: "\n").first { $0.contains("Overall exposure level") }
        print("systemd-analyze security: \(score.map(String.init) ?? "no score line")")
        #expect(score != nil, "no score in:\n\(result.stdout)\(result.stderr)")
        #expect(result.status == 0, "exposure above 1.5:\n\(result.stdout)\(result.stderr)")
    }

    /// The settings the notify protocol and restart policy depend on, in the section where they take effect.
    /// The README's install steps are exactly `scripts/install-steps`, the file the package test runs in a fresh
    /// Debian root: what operators read is what was tested.
    @Test func readmeInstallStepsAreTheTestedScript() throws {
        let script = try String(
            contentsOf: Self.repositoryRoot.appendingPathComponent("scripts/install-steps"), encoding: .utf8)
        let readme = try String(contentsOf: Self.repositoryRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let first = "# 1. The package"
        let steps = try #require(script.range(of: first)).lowerBound
        let tested = String(script[steps...]).trimmingCharacters(in: .whitespacesAndNewlines)
        let start = try #require(readme.range(of: "```sh\n" + first)).lowerBound
        let blockStart = readme.index(start, offsetBy: "```sh\n".count)
        let end = try #require(readme.range(of: "\n```", range: blockStart..<readme.endIndex)).lowerBound
        let shown = String(readme[blockStart..<end])
            .replacingOccurrences(of: #"\./metricsd_[^ ]*_amd64\.deb"#, with: "\"$DEB\"", options: .regularExpression)
        #expect(shown == tested)
    }

    @Test func protocolSettingsAreInTheirSections() throws {
        let sections = try Self.parse(String(contentsOf: Self.unitFile, encoding: .utf8))
        let unit = try #require(sections["Unit"])
        let service = try #require(sections["Service"])
        #expect(unit["StartLimitIntervalSec"] == ["10min"] && unit["StartLimitBurst"] == ["5"])
        #expect(service["Type"] == ["notify"])
        #expect(service["NotifyAccess"] == ["main"])
        #expect(service["ExecReload"] == ["+/usr/bin/metricsd refresh-credentials", "/bin/sh -c 'kill -HUP $MAINPID'"])
        #expect(service["WatchdogSec"] == ["30s"])
        #expect(service["Restart"] == ["on-failure"])
        #expect(service["RestartSec"] == ["1s"])
        #expect(unit["Wants"]?.contains { $0.split(separator: " ").contains("metricsd.socket") } == true)
        #expect(unit["After"]?.contains { $0.split(separator: " ").contains("metricsd.socket") } == true)
        #expect(service["DynamicUser"] == ["yes"])
        #expect(service["LoadCredential"] == ["jwt-secret:metricsd-jwt-secret", "admin-token:metricsd-admin-token"])
        let secretVariables = ["METRICSD_JWT_SECRET=", "METRICSD_ADMIN_TOKEN=", "PGPASSWORD=", "DATABASE_URL="]
        #expect(
            (service["Environment"] ?? []).allSatisfy { line in !secretVariables.contains { line.hasPrefix($0) } },
            "secrets must not be passed with Environment=")
        #expect(service["StartLimitIntervalSec"] == nil && service["StartLimitBurst"] == nil)
    }

    /// The sockets the daemon tells apart by name, the service they activate, and the packet filter the service's
    /// own does not cover (systemd creates these sockets).
    @Test func socketsAreNamedForTheDaemon() throws {
        for (file, name) in zip(Self.socketFiles, ["public", "internal"]) {
            let socket = try #require(Self.parse(String(contentsOf: file, encoding: .utf8))["Socket"], "\(file.path)")
            #expect(socket["FileDescriptorName"] == [name], "\(file.lastPathComponent)")
            #expect(
                socket["IPAddressDeny"] == ["any"] && socket["IPAddressAllow"] == ["localhost"],
                "\(file.lastPathComponent)")
            #expect(socket["ListenStream"]?.count == 1, "\(file.lastPathComponent)")
        }
        let internalSocket = try #require(
            Self.parse(String(contentsOf: Self.socketFiles[1], encoding: .utf8))["Socket"])
        #expect(internalSocket["Service"] == ["metricsd.service"])
    }

    /// `[Section]` → key → values, comments and blank lines skipped.
    static func parse(_ text: String) -> [String: [String: [String]]] {
        var sections: [String: [String: [String]]] = [:]
        var current = ""
        for rawLine in text.split(separator: "\n") {
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                current = String(line.dropFirst().dropLast())
                continue
            }
            guard let equals = line.firstIndex(of: "=") else { continue }
            let key = String(line[..<equals])
            sections[current, default: [:]][key, default: []].append(String(line[line.index(after: equals)...]))
        }
        return sections
    }
}
