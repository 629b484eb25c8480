import Foundation
import Glibc
import MetricsdTestSupport
import Testing

/// `metricsd refresh-credentials` runs as root (the unit's `ExecReload=+…`) and writes into the runtime directory,
/// which belongs to the service's user: nothing that user planted there (a link for `credentials`, for a file,
/// for the runtime directory itself) makes root change anything outside it. The runtime directory here belongs
/// to `nobody`, as it would to the service's user; the victim is root's, as /etc would be. Needs root (CI runs
/// the tests as root): only root can hand a directory to another user.
@Suite struct RuntimeCredentialsTests {
    static let nobody: uid_t = 65534

    /// A runtime directory of `nobody` (mode 0755), a credential store with a valid pair, and a victim directory
    /// of root's (0755) holding a file of root's (0644).
    struct Host {
        let base: String
        var runtime: String { self.base + "/run" }
        var credentials: String { self.runtime + "/credentials" }
        var store: String { self.base + "/credstore" }
        var victim: String { self.base + "/victim" }
        var victimFile: String { self.victim + "/root-only.conf" }
        let pair: TestCertificate

        init() async throws {
            try #require(
                geteuid() == 0, "refresh-credentials' tests need root (as in CI): it hands files to another user")
            self.base = try ScratchFiles.directory("refresh")
            self.pair = try await TestCertificate.make("refresh")
            for directory in [self.runtime, self.store, self.victim] {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                chmod(directory, 0o755)
            }
            try #require(chown(self.runtime, RuntimeCredentialsTests.nobody, RuntimeCredentialsTests.nobody) == 0)
            try ScratchFiles.write("root's own\n", to: self.victimFile, mode: 0o644)
            try FileManager.default.copyItem(
                atPath: self.pair.certificate, toPath: self.store + "/metricsd-tls-certificate")
            try FileManager.default.copyItem(atPath: self.pair.key, toPath: self.store + "/metricsd-tls-key")
        }

        /// Runs `metricsd refresh-credentials` for this runtime directory.
        func refresh(runtime: String? = nil, extra: [String: String] = [:]) async throws -> (
            status: Int32, stdout: String, stderr: String
        ) {
            try await CommandLineTests.metricsd(
                ["refresh-credentials"],
                ["METRICSD_CREDSTORE": self.store, "RUNTIME_DIRECTORY": runtime ?? self.runtime].merging(extra) { $1 })
        }

        /// A link owned by `nobody`, as the service's user would plant it.
        func plant(link: String, to target: String) throws {
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
            try #require(lchown(link, RuntimeCredentialsTests.nobody, RuntimeCredentialsTests.nobody) == 0)
        }
    }

    /// Owner, group, mode and content of each path (content "" for a directory: its entries instead).
    static func snapshot(_ paths: [String]) throws -> [String] {
        try paths.map { path in
            let info = try #require(FileStatus(path), "\(path)")
            let content =
                info.isDirectory
                ? try FileManager.default.contentsOfDirectory(atPath: path).sorted().joined(separator: ",")
                : try String(contentsOfFile: path, encoding: .utf8)
            return "\(path) \(info.uid):\(info.gid) \(String(info.permissions, radix: 8)) \(content)"
        }
    }

    static func owner(_ path: String) -> (uid: uid_t, mode: mode_t, isFile: Bool)? {
        FileStatus(path).map { ($0.uid, $0.permissions, $0.isRegularFile) }
    }

    @Test func installsForTheOwnerOfTheRuntimeDirectory() async throws {
        let host = try await Host()
        // The service's main process runs as nobody, as the runtime directory's owner: accepted.
        let service = Process()
        service.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        service.arguments = ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/bin/sleep", "30"]
        try service.run()
        defer { service.terminate() }
        let result = try await host.refresh(extra: ["MAINPID": "\(service.processIdentifier)"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.hasPrefix("refreshed tls-certificate (valid until "), "\(result.stdout)")
        #expect(
            result.stdout.contains("EC P-256, serial \(host.pair.serial)) and tls-key in \(host.credentials)"),
            "\(result.stdout)")
        #expect(result.stderr.isEmpty, "\(result.stderr)")
        let directory = try #require(Self.owner(host.credentials))
        #expect(directory.uid == Self.nobody && directory.mode == 0o700)
        for (name, source) in [("tls-certificate", host.pair.certificate), ("tls-key", host.pair.key)] {
            let file = try #require(Self.owner(host.credentials + "/" + name))
            #expect(file.uid == Self.nobody && file.mode == 0o400 && file.isFile, "\(name)")
            let installed = try String(contentsOfFile: host.credentials + "/" + name, encoding: .utf8)
            let expected = try String(contentsOfFile: source, encoding: .utf8)
            #expect(
                installed.trimmingCharacters(in: .whitespacesAndNewlines)
                    == expected.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        #expect(!FileManager.default.fileExists(atPath: host.credentials + "/tls-key.new"))
    }

    @Test func aCredentialsLinkToAnotherDirectoryIsRefusedAndTheDirectoryStaysRoots() async throws {
        let host = try await Host()
        try host.plant(link: host.credentials, to: host.victim)
        let before = try Self.snapshot([host.victim, host.victimFile])
        let result = try await host.refresh()
        #expect(result.status == 78, "\(result)")
        #expect(
            result.stderr
                == "metricsd: refresh-credentials: \(host.credentials) is a symbolic link to \(host.victim), not a directory: remove it (rm \(host.credentials)) and reload again; refresh-credentials makes the directory itself\n",
            "\(result.stderr)")
        #expect(try Self.snapshot([host.victim, host.victimFile]) == before)
        #expect(Self.owner(host.victim)?.uid == 0 && Self.owner(host.victim)?.mode == 0o755)
    }

    /// Links for the files inside `credentials/` are replaced by the files, never written through or handed over.
    @Test func linksForTheFilesAreReplacedNotWrittenThrough() async throws {
        let host = try await Host()
        try FileManager.default.createDirectory(atPath: host.credentials, withIntermediateDirectories: false)
        try #require(chown(host.credentials, Self.nobody, Self.nobody) == 0)
        try host.plant(link: host.credentials + "/tls-certificate.new", to: host.victimFile)
        try host.plant(link: host.credentials + "/tls-key", to: host.victimFile)
        try host.plant(link: host.credentials + "/tls-key.new", to: host.victim + "/created-by-root")
        let before = try Self.snapshot([host.victim, host.victimFile])
        let result = try await host.refresh()
        #expect(result.status == 0, "\(result)")
        #expect(try Self.snapshot([host.victim, host.victimFile]) == before)
        #expect(
            result.stderr
                == "metricsd: refresh-credentials: warning: \(host.credentials)/tls-key was a symbolic link to \(host.victimFile), and is replaced by the refreshed file (nothing was written through it)\n",
            "\(result.stderr)")
        for name in ["tls-certificate", "tls-key"] {
            let file = try #require(Self.owner(host.credentials + "/" + name))
            #expect(file.isFile && file.uid == Self.nobody && file.mode == 0o400, "\(name)")
        }
        let key = try String(contentsOfFile: host.credentials + "/tls-key", encoding: .utf8)
        #expect(key.contains("PRIVATE KEY"))
    }

    @Test func aRuntimeDirectoryThatIsALinkIsRefused() async throws {
        let host = try await Host()
        let link = host.base + "/run-link"
        try host.plant(link: link, to: host.victim)
        let before = try Self.snapshot([host.victim, host.victimFile])
        let result = try await host.refresh(runtime: link)
        #expect(result.status == 78, "\(result)")
        #expect(
            result.stderr
                == "metricsd: refresh-credentials: \(link) is a symbolic link to \(host.victim), not the service's runtime directory: remove it (rm \(link)); systemd makes the runtime directory when metricsd starts\n",
            "\(result.stderr)")
        #expect(try Self.snapshot([host.victim, host.victimFile]) == before)
        // With a trailing slash, which would make open(2) follow the link.
        #expect(try await host.refresh(runtime: link + "/").status == 78)
        #expect(try Self.snapshot([host.victim, host.victimFile]) == before)
    }

    /// A runtime directory others can write to, one that is not the service's, and a `credentials` of a third user.
    @Test func aRuntimeDirectoryOthersControlIsRefused() async throws {
        let host = try await Host()
        chmod(host.runtime, 0o777)
        let open = try await host.refresh()
        #expect(open.status == 78, "\(open)")
        #expect(
            open.stderr
                == "metricsd: refresh-credentials: \(host.runtime) is writable by users other than its owner (mode 0777): chmod go-w \(host.runtime) (RuntimeDirectoryMode= in the unit: 0755 or stricter)\n",
            "\(open.stderr)")
        #expect(!FileManager.default.fileExists(atPath: host.credentials))
        chmod(host.runtime, 0o755)

        // The service runs as root here (this test's own process), but the directory is nobody's.
        let other = try await host.refresh(extra: ["MAINPID": "\(getpid())"])
        #expect(other.status == 78, "\(other)")
        #expect(
            other.stderr
                == "metricsd: refresh-credentials: \(host.runtime) belongs to uid \(Self.nobody), but metricsd (pid \(getpid())) runs as uid 0: the runtime directory must be the service's own (RuntimeDirectory= in the unit; a restart makes it anew)\n",
            "\(other.stderr)")
        #expect(!FileManager.default.fileExists(atPath: host.credentials))

        try FileManager.default.createDirectory(atPath: host.credentials, withIntermediateDirectories: false)
        try #require(chown(host.credentials, 4242, 4242) == 0)
        let third = try await host.refresh()
        #expect(third.status == 78, "\(third)")
        #expect(
            third.stderr
                == "metricsd: refresh-credentials: \(host.credentials) belongs to uid 4242, neither the service's user (uid \(Self.nobody)) nor root: remove it (rm -r \(host.credentials)) and reload again\n",
            "\(third.stderr)")
        #expect(Self.owner(host.credentials)?.uid == 4242)
        #expect(try FileManager.default.contentsOfDirectory(atPath: host.credentials) == [])
    }
}
