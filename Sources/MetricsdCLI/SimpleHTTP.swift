import Glibc
import MetricsdDaemon
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A minimal blocking HTTP/1.1 GET over a TCP socket, for `metricsd healthcheck` (no HTTP client dependency).
enum SimpleHTTP {
    struct Response {
        let status: Int
        let body: String
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static func get(host: String, port: Int, path: String, timeout: Double) -> Result<Response, Failure> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let first = list else {
            return .failure(Failure(description: "cannot resolve \(host)"))
        }
        defer { freeaddrinfo(list) }
        let descriptor = socket(first.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return .failure(Failure(description: String(cString: strerror(errno)))) }
        defer { close(descriptor) }
        // `struct timeval` as its two C longs (spelling `timeval` trips MemberImportVisibility once NIOHTTP1 is
        // imported in this module: the compiler finds it in SwiftOverlayShims).
        var limit: (Int, Int) = (Int(timeout), Int((timeout - timeout.rounded(.down)) * 1_000_000))
        let size = socklen_t(MemoryLayout<(Int, Int)>.size)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, size)
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &limit, size)
        guard connect(descriptor, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 else {
            return .failure(Failure(description: String(cString: strerror(errno)).lowercased()))
        }
        let request =
            "GET \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\nUser-Agent: metricsd-healthcheck\r\n\r\n"
        let sent = request.utf8CString.withUnsafeBufferPointer { send(descriptor, $0.baseAddress, $0.count - 1, 0) }
        guard sent > 0 else { return .failure(Failure(description: String(cString: strerror(errno)).lowercased())) }
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while data.count < 1_000_000 {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count < 0 { return .failure(Failure(description: "no answer within \(timeout)s")) }
            if count == 0 { break }
            data += buffer[0..<count]
        }
        let text = String(decoding: data, as: UTF8.self)
        guard let statusLine = text.split(separator: "\r\n", maxSplits: 1).first,
            let code = statusLine.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { return .failure(Failure(description: "not an HTTP answer")) }
        let body = text.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        return .success(Response(status: code, body: body))
    }
}
