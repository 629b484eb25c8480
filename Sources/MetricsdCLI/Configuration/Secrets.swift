import MetricsdDaemon
import MetricsdHTTP
import Foundation

/// Reads secrets the way systemd deployments expect: `$CREDENTIALS_DIRECTORY/<credential>` first (`LoadCredential=`),
/// else a file named by a `*_FILE` variable, else the variable itself (development only).
///
/// File contents are trimmed of surrounding whitespace (a trailing newline from `echo` or `systemd-creds`).
/// An unreadable or empty file is an error naming the path; secrets themselves never appear in messages.
public enum Secrets {
    public static func read(
        credential: String, file fileVariable: String?, variable: String?, environment: [String: String]
    ) throws(ConfigurationError) -> String? {
        if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            let path = directory + "/" + credential
            if FileManager.default.fileExists(atPath: path) {
                return try Self.readFile(path, what: "credential \(credential)")
            }
        }
        if let fileVariable, let path = environment[fileVariable], !path.isEmpty {
            return try Self.readFile(path, what: fileVariable)
        }
        if let variable, let value = environment[variable], !value.isEmpty {
            return value
        }
        return nil
    }

    static func readFile(_ path: String, what: String) throws(ConfigurationError) -> String {
        let text: String
        do {
            text = try Self.readText(path)
        } catch {
            throw ConfigurationError("\(what): \(error.message)")
        }
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty else { throw ConfigurationError("\(what): \(path) is empty") }
        return trimmed
    }

    /// The whole file as UTF-8 text (empty allowed); errors say "cannot read PATH (reason)".
    static func readText(_ path: String) throws(ConfigurationError) -> String {
        // FileHandle, not Data(contentsOf:): that refuses character devices, and /dev/null is a fine empty file.
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw ConfigurationError("cannot read \(path) (\(Self.errnoReason(path)))")
        }
        defer { try? handle.close() }
        let data: Data
        do {
            data = try handle.readToEnd() ?? Data()
        } catch {
            throw ConfigurationError("cannot read \(path) (\(Self.errnoReason(path)))")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigurationError("\(path) is not UTF-8 text")
        }
        return text
    }

    /// Why a path cannot be opened, from `open(2)`'s errno: "no such file", "permission denied" …
    static func errnoReason(_ path: String) -> String {
        let descriptor = open(path, O_RDONLY)
        if descriptor >= 0 {
            close(descriptor)
            return "unreadable"
        }
        return String(cString: strerror(errno)).lowercased()
    }
}
