import Foundation

/// Directories and files a test writes under the scratch space (`METRICSD_TEST_TMP`).
package enum ScratchFiles {
    /// A fresh directory under the test scratch space.
    package static func directory(_ name: String) throws -> String {
        let base =
            ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
            ?? NSTemporaryDirectory()
        let path = base + "/\(name)-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    package static func write(_ text: String, to path: String, mode: mode_t? = nil) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        if let mode { chmod(path, mode) }
    }
}
