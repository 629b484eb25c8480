import Foundation
import Glibc
import Synchronization
import Testing

/// A private PostgreSQL cluster for one test that must stop and start the database under a running daemon.
/// Made with `scripts/pg-cluster` (`METRICSD_PG_CLUSTER`) in a unique directory under `METRICSD_TEST_TMP`;
/// the shared test server is never touched. Always ``destroy()`` it (also on failure).
package struct ThrowawayCluster: Sendable {
    package let directory: String
    package let port: Int
    private let script: String

    private init(directory: String, port: Int, script: String) {
        self.directory = directory
        self.port = port
        self.script = script
    }

    /// Creates (initdb, a few seconds) a stopped cluster on a free port.
    package static func create(_ label: String) async throws -> ThrowawayCluster {
        let environment = ProcessInfo.processInfo.environment
        let script = try #require(
            environment["METRICSD_PG_CLUSTER"].flatMap { $0.isEmpty ? nil : $0 },
            "METRICSD_PG_CLUSTER is not set: run the tests with the README's test command (scripts/test)")
        let base = environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 } ?? NSTemporaryDirectory()
        let directory = URL(fileURLWithPath: base)
            .appendingPathComponent("\(label)-" + UUID().uuidString.prefix(8).lowercased()).path
        let cluster = ThrowawayCluster(directory: directory, port: DaemonProcess.freePort(), script: script)
        do {
            try await cluster.run("create", directory, String(cluster.port))
        } catch {
            await cluster.destroy()
            throw error
        }
        return cluster
    }

    /// `postgresql://postgres@127.0.0.1:PORT/postgres?sslmode=disable` (the cluster's own database).
    package var url: String { "postgresql://postgres@127.0.0.1:\(self.port)/postgres?sslmode=disable" }

    package func start() async throws { try await self.run("start", self.directory) }

    package func stop() async throws { try await self.run("stop", self.directory, "fast") }

    /// Stops (immediately) and deletes the cluster; never throws. A frozen cluster is thawed first: a stopped
    /// postmaster would not act on pg_ctl's signal.
    package func destroy() async {
        self.thaw()
        try? await self.run("destroy", self.directory)
    }

    // MARK: Freezing

    /// The postmaster's pid (first line of `data/postmaster.pid`), nil when the cluster is not running.
    package var postmasterPID: pid_t? {
        guard let text = try? String(contentsOfFile: self.directory + "/data/postmaster.pid", encoding: .utf8),
            let line = text.split(separator: "\n").first, let pid = pid_t(line.trimmingCharacters(in: .whitespaces))
        else { return nil }
        return kill(pid, 0) == 0 ? pid : nil
    }

    /// The postmaster and every process it started (backends, WAL sender or receiver, checkpointer, …), from
    /// `/proc` (each process's parent is field 4 of its `stat`).
    package func processes() -> [pid_t] {
        guard let postmaster = self.postmasterPID else { return [] }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        let children = entries.compactMap { pid_t($0) }.filter { pid in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                let end = stat.lastIndex(of: ")")
            else { return false }
            // After "pid (command)": state, then the parent's pid.
            let fields = stat[stat.index(after: end)...].split(separator: " ")
            return fields.count > 1 && pid_t(fields[1]) == postmaster
        }
        return [postmaster] + children
    }

    /// Stops every process of the server with SIGSTOP, the postmaster first (so that it starts no new one): the
    /// kernel still accepts TCP connections on its port, but nothing answers, as with a frozen VM. Returns how
    /// many processes were stopped. Always pair it with ``thaw()`` (``withFrozen(_:_:)`` does).
    @discardableResult
    package func freeze() throws -> Int {
        let processes = self.processes()
        try #require(!processes.isEmpty, "cannot freeze \(self.directory): no postmaster running")
        for pid in processes { kill(pid, SIGSTOP) }
        return processes.count
    }

    /// Resumes every process of the server (SIGCONT); harmless when none is stopped. Never throws.
    package func thaw() {
        for pid in self.processes().reversed() { kill(pid, SIGCONT) }
    }

    /// A new cluster beside this one (the same parent directory, a free port), made a streaming standby of it
    /// (`pg-cluster standby`: `pg_basebackup -R`) and started; deleted again when that fails.
    package func standby(_ label: String, synchronous: Bool) async throws -> ThrowawayCluster {
        let base = URL(fileURLWithPath: self.directory).deletingLastPathComponent()
        let standby = ThrowawayCluster(
            directory: base.appendingPathComponent("\(label)-" + UUID().uuidString.prefix(8).lowercased()).path,
            port: DaemonProcess.freePort(), script: self.script)
        do {
            try await self.run(
                "standby", standby.directory, String(standby.port), self.directory, synchronous ? "sync" : "async")
        } catch {
            await standby.destroy()
            throw error
        }
        return standby
    }

    /// One value from `sql` run with psql on this cluster, database `postgres` (also on a standby, which metricsd's
    /// own connections refuse).
    package func value(_ sql: String) async throws -> String {
        let (status, stdout, stderr) = try await Subprocess.capture(
            self.script, ["psql", self.directory, "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        try #require(status == 0, "psql on \(self.directory) failed (\(status)): \(stderr)")
        return stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Runs `scripts/pg-cluster ARGS` off the cooperative pool; throws with its output when it fails. For commands
    /// about several clusters (promote, rejoin), any member runs them.
    package func run(_ arguments: String...) async throws {
        let (status, output) = try await Subprocess.run(self.script, arguments)
        try #require(status == 0, "pg-cluster \(arguments.joined(separator: " ")) failed (\(status)):\n\(output)")
    }
}

/// Runs `body` with `resource` and then `cleanup`, whatever happens: the shape of every `with…` helper of the tests.
package func withCleanup<Resource, T>(
    _ resource: Resource, cleanup: (Resource) async -> Void, _ body: (Resource) async throws -> T
) async throws -> T {
    do {
        let value = try await body(resource)
        await cleanup(resource)
        return value
    } catch {
        await cleanup(resource)
        throw error
    }
}

/// Runs short helper programs (pg-cluster, `metricsd migrate`, `metricsd healthcheck`) to completion.
package enum Subprocess {
    /// Runs `executable arguments` with `environment` (the test's own when nil); exit status and stdout+stderr.
    package static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil
    ) async throws -> (status: Int32, output: String) {
        let (status, stdout, stderr) = try await self.capture(executable, arguments, environment: environment)
        return (status, stdout + stderr)
    }

    /// Like ``run(_:_:environment:)`` with stdout and stderr apart.
    ///
    /// Not `Foundation.Process`: it notices a child's exit through a socket the child inherits, so a command that
    /// leaves a server running (pg_ctl start) never "exits", and the server would inherit that socket. Here the
    /// child gets /dev/null, two temporary files and no other descriptor; a thread waits with `waitpid`. A command
    /// that cannot be run exits 127 (bash's "command not found").
    package static func capture(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil
    ) async throws -> (status: Int32, stdout: String, stderr: String) {
        let base = NSTemporaryDirectory() + "metricsd-subprocess-" + UUID().uuidString
        let (stdoutPath, stderrPath) = (base + ".out", base + ".err")
        defer {
            unlink(stdoutPath)
            unlink(stderrPath)
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        // posix_spawn_file_actions_addclosefrom_np is not imported: bash closes every other inherited descriptor
        // (e.g. other tests' sockets and pipes) and then runs the command.
        let closeAndRun = #"for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; exec "$@""#
        let argv = (["/bin/bash", "-c", closeAndRun, "bash", executable] + arguments).map { strdup($0) } + [nil]
        let envp = (environment ?? ProcessInfo.processInfo.environment).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for string in argv + envp { free(string) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/bin/bash", &actions, nil, argv, envp)
        guard rc == 0 else { throw SubprocessError(executable: executable, errno: rc) }
        let child = pid
        let status = await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            Thread.detachNewThread {
                var status: Int32 = 0
                while waitpid(child, &status, 0) < 0 && errno == EINTR {}
                // WIFEXITED / WEXITSTATUS / WTERMSIG by hand (the macros are not imported).
                let signal = status & 0x7f
                continuation.resume(returning: signal == 0 ? (status >> 8) & 0xff : -signal)
            }
        }
        let outText = (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? ""
        let errText = (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? ""
        return (status, outText, errText)
    }
}

package struct SubprocessError: Error, CustomStringConvertible {
    package let executable: String
    package let errno: Int32
    package var description: String { "cannot run \(self.executable): \(String(cString: strerror(self.errno)))" }
}

/// Runs `body` while `cluster` is frozen (``ThrowawayCluster/freeze()``; `body` gets how many processes were
/// stopped); thaws it afterwards whatever happens, and after `longest` at the latest even while `body` still runs:
/// a body that waits for an answer the frozen server cannot give (a daemon that waits for it) ends then and fails,
/// instead of holding the test and the server forever.
package func withFrozen<T>(
    _ cluster: ThrowawayCluster, longest: Duration = .seconds(60), _ body: (Int) async throws -> T
) async throws -> T {
    defer { cluster.thaw() }
    let stopped = try cluster.freeze()
    let finished = Flag()
    defer { finished.value.store(true, ordering: .relaxed) }
    let backstop = UInt32(longest.components.seconds)
    Thread.detachNewThread {
        for _ in 0..<backstop * 10 where !finished.value.load(ordering: .relaxed) { usleep(100_000) }
        if !finished.value.load(ordering: .relaxed) { cluster.thaw() }
    }
    return try await body(stopped)
}

private final class Flag: Sendable {
    let value = Atomic<Bool>(false)
}

/// Runs `body` with a new, stopped ``ThrowawayCluster``; destroys it afterwards.
package func withThrowawayCluster<T>(_ label: String, _ body: (ThrowawayCluster) async throws -> T) async throws -> T {
    try await withCleanup(try await ThrowawayCluster.create(label), cleanup: { await $0.destroy() }, body)
}
