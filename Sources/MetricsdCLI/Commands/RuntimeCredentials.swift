import Glibc
import MetricsdConfiguration

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `credentials/` in the service's runtime directory, written by root (`refresh-credentials`) for the service's
/// user, without ever acting through a path that user could have replaced.
///
/// The runtime directory belongs to the service's user, so everything in it may be a link it planted: a
/// `credentials` pointing at `/etc/ssl`, a `tls-key.new` pointing at `/etc/shadow`. Root following one would hand
/// that directory or file to the service (a `chown` follows links), or write through it. So every step works on
/// descriptors: the runtime directory is opened without following a link, `credentials` is made and opened in it
/// the same way (`mkdirat`, `openat` with `O_NOFOLLOW`), its owner and mode are set on the opened descriptor
/// (`fchown`, `fchmod`), each file is created in it with `O_CREAT | O_EXCL | O_NOFOLLOW` (never an existing file or
/// link) and renamed into place inside it (`renameat`, which replaces a link rather than writing through it).
/// What cannot be right is refused with what to change: a runtime directory that is a link, is writable by others,
/// or does not belong to the user the service runs as; a `credentials` that is a link, not a directory, or
/// belongs to someone else.
struct RuntimeCredentials {
    /// The runtime directory (`$RUNTIME_DIRECTORY`, /run/metricsd).
    let runtime: String
    /// The service's main process (`$MAINPID`, set by systemd for `ExecReload=`): the runtime directory must
    /// belong to the user it runs as. nil when run by hand.
    let servicePID: Int32?

    var path: String { self.runtime + "/credentials" }

    /// What went wrong, as `refresh-credentials` reports it (exit 78).
    private func failure(_ text: String) -> ConfigurationError {
        ConfigurationError(.credentialsRefreshFailed, text)
    }

    /// Writes each file (mode 0400) into `credentials/` (mode 0700), both owned by the runtime directory's owner,
    /// each by a rename: the service never reads half a file.
    /// - Returns: a warning for each file that was a link or something else but a file before (replaced).
    func install(_ files: [(name: String, text: String)]) throws(ConfigurationError) -> [String] {
        let (runtimeDescriptor, owner) = try self.openRuntime()
        defer { close(runtimeDescriptor) }
        let directory = try self.openCredentials(in: runtimeDescriptor, owner: owner)
        defer { close(directory) }
        var warnings: [String] = []
        for (name, text) in files {
            if let replaced = try self.write(text + "\n", named: name, in: directory, owner: owner) {
                warnings.append(replaced)
            }
        }
        return warnings
    }

    /// The runtime directory, opened without following a link, and its owner (the service's user).
    private func openRuntime() throws(ConfigurationError) -> (descriptor: Int32, owner: stat) {
        let parentPath = HostEnvironment.directory(of: self.runtime)
        let parent = open(parentPath.isEmpty ? "." : parentPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard parent >= 0 else {
            throw self.failure(
                "\(self.runtime) does not exist: is metricsd running? (\(parentPath): \(Secrets.reason(errno)))")
        }
        defer { close(parent) }
        var above = stat()
        fstat(parent, &above)
        // Only root may change the directory the runtime directory is in (or, like /tmp, it is sticky): else someone
        // could swap the runtime directory itself between the checks below and their use.
        if above.st_uid != 0 || (above.st_mode & 0o022 != 0 && above.st_mode & mode_t(S_ISVTX) == 0) {
            throw self.failure(
                "\(parentPath), which holds the runtime directory \(self.runtime), can be changed by users other than root (owner uid \(above.st_uid), mode \(Self.octal(above.st_mode))): use a runtime directory under /run (RuntimeDirectory= in the unit)"
            )
        }
        let name = String(self.runtime.split(separator: "/").last ?? "")
        let descriptor = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard descriptor >= 0 else {
            let code = errno
            switch code {
            case _ where Self.isLink(parent, name):
                throw self.failure(
                    "\(self.runtime) is a symbolic link\(Self.target(parent, name)), not the service's runtime directory: remove it (rm \(self.runtime)); systemd makes the runtime directory when metricsd starts"
                )
            case ENOENT: throw self.failure("\(self.runtime) does not exist: is metricsd running?")
            case ENOTDIR:
                throw self.failure(
                    "\(self.runtime) is not a directory: remove it; systemd makes the runtime directory when metricsd starts"
                )
            default: throw self.failure("cannot open \(self.runtime) (\(Secrets.reason(code)))")
            }
        }
        var owner = stat()
        fstat(descriptor, &owner)
        if owner.st_mode & 0o022 != 0 {
            close(descriptor)
            throw self.failure(
                "\(self.runtime) is writable by users other than its owner (mode \(Self.octal(owner.st_mode))): chmod go-w \(self.runtime) (RuntimeDirectoryMode= in the unit: 0755 or stricter)"
            )
        }
        if let pid = self.servicePID, let uid = Self.uid(ofProcess: pid), uid != owner.st_uid {
            close(descriptor)
            throw self.failure(
                "\(self.runtime) belongs to uid \(owner.st_uid), but metricsd (pid \(pid)) runs as uid \(uid): the runtime directory must be the service's own (RuntimeDirectory= in the unit; a restart makes it anew)"
            )
        }
        return (descriptor, owner)
    }

    /// `credentials/` in the runtime directory: made if missing, opened without following a link, refused when it
    /// is anything but a directory of the service's user or of root; then given to the service's user, mode 0700.
    private func openCredentials(in runtime: Int32, owner: stat) throws(ConfigurationError) -> Int32 {
        if mkdirat(runtime, "credentials", 0o700) != 0 && errno != EEXIST {
            throw self.failure("cannot create \(self.path) (\(Secrets.reason(errno)))")
        }
        let descriptor = openat(runtime, "credentials", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard descriptor >= 0 else {
            let code = errno
            switch code {
            case _ where Self.isLink(runtime, "credentials"):
                throw self.failure(
                    "\(self.path) is a symbolic link\(Self.target(runtime, "credentials")), not a directory: remove it (rm \(self.path)) and reload again; refresh-credentials makes the directory itself"
                )
            case ENOTDIR:
                throw self.failure("\(self.path) is not a directory: remove it (rm \(self.path)) and reload again")
            default:
                throw self.failure("cannot open \(self.path) (\(Secrets.reason(code)))")
            }
        }
        var found = stat()
        fstat(descriptor, &found)
        guard found.st_uid == owner.st_uid || found.st_uid == 0 else {
            close(descriptor)
            throw self.failure(
                "\(self.path) belongs to uid \(found.st_uid), neither the service's user (uid \(owner.st_uid)) nor root: remove it (rm -r \(self.path)) and reload again"
            )
        }
        guard fchown(descriptor, owner.st_uid, owner.st_gid) == 0, fchmod(descriptor, 0o700) == 0 else {
            let reason = Secrets.reason(errno)
            close(descriptor)
            throw self.failure("cannot give \(self.path) to the service's user (\(reason))")
        }
        return descriptor
    }

    /// Writes `text` as `name` in `directory`: a new file `name.new` (never an existing one, never through a link),
    /// owned by `owner`, mode 0400, renamed over `name`.
    /// - Returns: a warning when `name` was not a plain file before (a link is replaced, not written through).
    private func write(_ text: String, named name: String, in directory: Int32, owner: stat) throws(ConfigurationError)
        -> String?
    {
        let path = self.path + "/" + name
        let temporary = name + ".new"
        var before = stat()
        let replaced: String? =
            fstatat(directory, name, &before, AT_SYMLINK_NOFOLLOW) == 0 && before.st_mode & S_IFMT != S_IFREG
            ? "\(path) was \(before.st_mode & S_IFMT == S_IFLNK ? "a symbolic link\(Self.target(directory, name))" : "not a plain file"), and is replaced by the refreshed file (nothing was written through it)"
            : nil
        // A leftover (or a planted link) goes; O_EXCL then refuses anything that appears in its place meanwhile.
        if unlinkat(directory, temporary, 0) != 0 && errno != ENOENT {
            throw self.failure("cannot remove \(path).new (\(Secrets.reason(errno))): remove it and reload again")
        }
        let descriptor = openat(directory, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o400)
        guard descriptor >= 0 else { throw self.failure("cannot write \(path).new (\(Secrets.reason(errno)))") }
        let bytes = Array(text.utf8)
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress! + written, $0.count - written) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            written += count
        }
        let done =
            written == bytes.count && fchown(descriptor, owner.st_uid, owner.st_gid) == 0
            && fchmod(descriptor, 0o400) == 0
        let reason = Secrets.reason(errno)
        close(descriptor)
        guard done, renameat(directory, temporary, directory, name) == 0 else {
            let failure = done ? Secrets.reason(errno) : reason
            unlinkat(directory, temporary, 0)
            throw self.failure("cannot write \(path) (\(failure))")
        }
        return replaced
    }

    /// Whether `name` in `directory` is a symbolic link (which `openat` with `O_DIRECTORY | O_NOFOLLOW` refuses with
    /// ENOTDIR or ELOOP, as for any other non-directory).
    private static func isLink(_ directory: Int32, _ name: String) -> Bool {
        var info = stat()
        return fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) == 0 && info.st_mode & S_IFMT == S_IFLNK
    }

    /// ` to TARGET` for the link `name` in `directory`, "" when it cannot be read.
    private static func target(_ directory: Int32, _ name: String) -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
        let count = readlinkat(directory, name, &buffer, buffer.count - 1)
        guard count > 0 else { return "" }
        return " to " + String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The real user id of process `pid` (`Uid:` in /proc/PID/status), nil when it cannot be read.
    static func uid(ofProcess pid: Int32) -> uid_t? {
        guard let status = try? Secrets.readText("/proc/\(pid)/status") else { return nil }
        let line = status.split(separator: "\n").first { $0.hasPrefix("Uid:") }
        return line?.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { uid_t($0) }
    }

    /// A mode's permission bits as `chmod` takes them: `0755`.
    static func octal(_ mode: mode_t) -> String {
        let digits = String(mode & 0o7777, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }
}
