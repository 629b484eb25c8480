/// Where a listener binds: `host:port` (`127.0.0.1:8080`, `[::1]:8080`, `localhost:0`; port 0 picks a free port),
/// or a Unix socket, `unix:/run/metricsd/internal.sock` (an absolute path; host and port are then unused).
public struct ListenAddress: Sendable, Hashable, CustomStringConvertible {
    public let host: String
    public let port: Int
    /// The Unix socket's path, for `unix:PATH`.
    public let unixPath: String?

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
        self.unixPath = nil
    }

    public init(unixPath: String) {
        self.host = ""
        self.port = 0
        self.unixPath = unixPath
    }

    public init?(parsing text: String) {
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst(5))
            // sun_path holds 107 bytes and a NUL.
            guard path.hasPrefix("/"), path.utf8.count < 108, !path.utf8.contains(0) else { return nil }
            self.init(unixPath: path)
            return
        }
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                return nil
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":"), !text[..<colon].contains(":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard !host.isEmpty, !portText.isEmpty, portText.allSatisfy(\.isASCII), let port = Int(portText),
            (0...65535).contains(port)
        else { return nil }
        self.init(host: String(host), port: port)
    }

    /// Whether only this host can connect: a Unix socket, `localhost`, or a loopback address.
    public var isLocal: Bool {
        if self.unixPath != nil { return true }
        let host = self.host.lowercased()
        return host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }

    public var description: String {
        if let path = self.unixPath { return "unix:" + path }
        return self.host.contains(":") ? "[\(self.host)]:\(self.port)" : "\(self.host):\(self.port)"
    }
}
