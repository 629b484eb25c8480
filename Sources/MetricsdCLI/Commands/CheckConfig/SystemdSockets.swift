import Glibc
import MetricsdHTTP

/// The socket units systemd passes to `metricsd serve` (`metricsd.socket`, `metricsd-internal.socket`) as systemd
/// has them loaded — drop-ins, enablement and masking resolved by systemd itself — for `check-config`, which runs
/// beside the service, not under it.
///
/// Asked with `systemctl show` (any user may): the unit files alone would not say whether a socket was started
/// without being enabled, and parsing them would repeat systemd's rules for drop-ins and search paths. Nil where
/// systemd is not the running init (`/run/systemd/system` missing, as `sd_booted(3)` checks): nothing passes
/// sockets there, and the listeners are the settings'.
struct SystemdSockets: Equatable {
    /// One socket unit.
    struct Unit: Equatable {
        var id: String
        /// `loaded`, `not-found`, `masked`, …
        var loadState = ""
        /// `active` while systemd holds its sockets.
        var activeState = ""
        /// `enabled`, `disabled`, `static`, …
        var unitFileState = ""
        /// `ListenStream=` addresses as systemd prints them, without the `(Stream)` suffix.
        var listen: [String] = []

        /// Whether systemd passes these sockets when metricsd starts: the unit is loaded, and started now or at
        /// boot. (metricsd.service pulls metricsd.socket in whenever it starts: its `Wants=`.)
        var isUsed: Bool {
            self.loadState == "loaded"
                && (self.activeState == "active" || self.unitFileState.hasPrefix("enabled")
                    || self.id == SystemdSockets.publicUnit)
        }

        /// The addresses as listeners: `host:port`, `[v6]:port`, a port alone (systemd listens on every address,
        /// `[::]:port`), a path (a Unix socket); nil for what metricsd cannot probe (an abstract socket).
        var addresses: [(text: String, address: ListenAddress?)] {
            self.listen.map { text in
                if text.hasPrefix("/") { return (text, ListenAddress(unixPath: text)) }
                if let port = Int(text), (1...65535).contains(port) {
                    return (text, ListenAddress(host: "::", port: port))
                }
                return (text, ListenAddress(parsing: text))
            }
        }
    }

    static let publicUnit = "metricsd.socket"
    static let internalUnit = "metricsd-internal.socket"
    static let service = "metricsd.service"

    var publicSocket: Unit?
    var internalSocket: Unit?
    /// Whether metricsd.service runs (a connection to its sockets then reaches it, and does not start it).
    var serviceActive = false

    /// How many sockets systemd passes each listener (0: none, and the setting's address is the listener).
    var passedSockets: (public: Int, internal: Int) {
        func count(_ unit: Unit?) -> Int { unit.map { $0.isUsed ? $0.listen.count : 0 } ?? 0 }
        return (count(self.publicSocket), count(self.internalSocket))
    }

    /// systemd's view, or nil without systemd (or when `systemctl` cannot be run).
    static func query() -> SystemdSockets? {
        guard access("/run/systemd/system", F_OK) == 0 else { return nil }
        let programs: [String] = ["/usr/bin/systemctl", "/bin/systemctl"]
        guard let program = programs.first(where: { access($0, X_OK) == 0 }) else { return nil }
        let arguments = [
            program, "show", "--no-pager", "--property=Id,LoadState,ActiveState,UnitFileState,Listen",
            Self.publicUnit, Self.internalUnit, Self.service,
        ]
        guard let output = Self.output(of: arguments) else { return nil }
        return Self.parse(output)
    }

    /// `systemctl show` of several units: blocks of `Name=value` lines, one block per unit, blank lines between.
    static func parse(_ text: String) -> SystemdSockets {
        var sockets = SystemdSockets()
        for block in text.split(separator: "\n\n", omittingEmptySubsequences: true) {
            var unit = Unit(id: "")
            for line in block.split(separator: "\n") {
                guard let equals = line.firstIndex(of: "=") else { continue }
                let value = String(line[line.index(after: equals)...])
                switch line[..<equals] {
                case "Id": unit.id = value
                case "LoadState": unit.loadState = value
                case "ActiveState": unit.activeState = value
                case "UnitFileState": unit.unitFileState = value
                case "Listen":
                    // `127.0.0.1:8080 (Stream)`: only stream sockets are metricsd's.
                    guard value.hasSuffix(" (Stream)") else { continue }
                    unit.listen.append(String(value.dropLast(" (Stream)".count)))
                default: break
                }
            }
            switch unit.id {
            case Self.publicUnit: sockets.publicSocket = unit
            case Self.internalUnit: sockets.internalSocket = unit
            case Self.service: sockets.serviceActive = unit.activeState == "active" || unit.activeState == "reloading"
            default: break
            }
        }
        return sockets
    }

    /// The standard output of a program (its standard error discarded), or nil when it cannot be run or fails.
    static func output(of arguments: [String]) -> String? {
        var pipe: [Int32] = [0, 0]
        guard Glibc.pipe(&pipe) == 0 else { return nil }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addclose(&actions, pipe[0])
        posix_spawn_file_actions_addclose(&actions, pipe[1])
        let argv = arguments.map { strdup($0) } + [nil]
        // The C locale: systemctl's output is parsed, not shown.
        let environment: [String] = ["LC_ALL=C", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"]
        let envp = environment.map { strdup($0) } + [nil]
        defer { for string in argv + envp { free(string) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, arguments[0], &actions, nil, argv, envp)
        close(pipe[1])
        defer { close(pipe[0]) }
        guard spawned == 0 else { return nil }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1_000_000 {
            let count = read(pipe[0], &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += buffer[0..<count]
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        guard status == 0 else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }
}
