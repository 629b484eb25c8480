import CoreFoundation
import Glibc

/// What `lstat` says of a path (the link itself, not what it points to); nil when it does not exist.
package struct FileStatus: Sendable, Equatable {
    package let uid: uid_t
    package let gid: gid_t
    /// The permission bits (`0o7777`).
    package let permissions: mode_t
    package let isDirectory: Bool
    package let isRegularFile: Bool

    package init?(_ path: String) {
        var info = Glibc.stat()
        guard lstat(path, &info) == 0 else { return nil }
        self.uid = info.st_uid
        self.gid = info.st_gid
        self.permissions = info.st_mode & 0o7777
        self.isDirectory = info.st_mode & S_IFMT == S_IFDIR
        self.isRegularFile = info.st_mode & S_IFMT == S_IFREG
    }
}
