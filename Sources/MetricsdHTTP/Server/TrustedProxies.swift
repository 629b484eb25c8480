import Glibc
import NIOCore

/// `METRICSD_FORWARDED_HEADER`: the one header that names the client behind a trusted proxy. The other is ignored,
/// whoever sends it: a proxy sets one and passes the client's own other header through, so reading both (or
/// preferring one) lets the client choose what is logged.
public enum ForwardedHeader: String, Sendable, CaseIterable {
    /// `X-Forwarded-For: client, proxy1` (nginx's `$proxy_add_x_forwarded_for`; the default).
    case xForwardedFor = "x-forwarded-for"
    /// `Forwarded: for=client;proto=https, for=proxy1` (RFC 7239).
    case forwarded

    /// The header's name as written in requests.
    public var fieldName: String { self == .forwarded ? "Forwarded" : "X-Forwarded-For" }

    /// The header that is ignored.
    public var other: ForwardedHeader { self == .forwarded ? .xForwardedFor : .forwarded }
}

/// `METRICSD_TRUSTED_PROXIES`: the peers (a reverse proxy in front of metricsd) whose forwarded-address header
/// (``ForwardedHeader``) names the client in the request log. The header from any other peer — an internet
/// client sending one directly — is ignored: the log shows the peer's own address.
public struct TrustedProxies: Sendable, Equatable, CustomStringConvertible {
    /// An address and prefix length: `10.0.0.0/8`, `::1/128`.
    struct Network: Sendable, Equatable {
        let bytes: [UInt8]
        let prefix: Int

        /// Whether this network holds much of the internet: wider than any one operator's addresses, so that
        /// trusting it trusts strangers. IPv4: wider than /8 (the largest blocks ever allocated to one holder
        /// are /8s) and not all multicast or reserved (224.0.0.0/3); every such range holds public addresses.
        /// IPv6: wider than /16 (the regional registries hold /12s; the largest allocations to one holder are
        /// around /19) and overlapping global unicast, 2000::/3.
        var isTooBroad: Bool {
            if self.bytes.count == 4 {
                return self.prefix < 8 && !(self.prefix >= 3 && self.bytes[0] & 0xE0 == 0xE0)
            }
            // Overlaps 2000::/3 when the first min(prefix, 3) bits agree with 001.
            let bits = min(self.prefix, 3)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - bits))
            return self.prefix < 16 && (bits == 0 || self.bytes[0] & mask == 0x20 & mask)
        }

        var text: String { "\(TrustedProxies.describe(self.bytes))/\(self.prefix)" }

        func contains(_ address: [UInt8]) -> Bool {
            guard address.count == self.bytes.count else { return false }
            var remaining = self.prefix
            for index in 0..<address.count where remaining > 0 {
                let bits = min(8, remaining)
                let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - bits))
                if address[index] & mask != self.bytes[index] & mask { return false }
                remaining -= bits
            }
            return true
        }
    }

    let networks: [Network]
    private let text: String
    /// The header read from a trusted peer.
    public var header: ForwardedHeader = .xForwardedFor

    /// No trusted proxy (the default): every request is logged with its peer's address.
    public init() {
        self.networks = []
        self.text = ""
    }

    /// Addresses and networks separated by commas or spaces: `127.0.0.1, ::1, 10.0.0.0/8`.
    public init?(parsing text: String) {
        var networks: [Network] = []
        for item in text.split(whereSeparator: { $0 == "," || $0 == " " }) {
            let parts = item.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
            guard let bytes = Self.address(String(parts[0])) else { return nil }
            var prefix = bytes.count * 8
            if parts.count == 2 {
                guard let value = Int(parts[1]), (0...bytes.count * 8).contains(value) else { return nil }
                prefix = value
            }
            networks.append(Network(bytes: bytes, prefix: prefix))
        }
        guard !networks.isEmpty else { return nil }
        self.networks = networks
        self.text = text
    }

    public var isEmpty: Bool { self.networks.isEmpty }
    public var description: String { self.isEmpty ? "none" : self.text }

    /// The networks that hold much of the internet (``Network/isTooBroad``), as `address/prefix`.
    public var tooBroad: [String] { self.networks.filter(\.isTooBroad).map(\.text) }

    func trusts(_ address: [UInt8]) -> Bool { self.networks.contains { $0.contains(address) } }

    /// The client of a request from `peer` (the connection's remote address, already described) whose
    /// ``header`` has `value` (its lines joined with commas; nil when absent): the peer itself unless it is
    /// trusted; then the nearest address in the header, read from the right, that is not itself a trusted proxy.
    /// An entry that is not an address stops the walk at the last trusted hop.
    func client(peer: Peer, forwarded value: String?) -> String {
        guard let peerBytes = peer.bytes, self.trusts(peerBytes), let value else { return peer.text }
        let hops: [Substring] =
            switch self.header {
            case .forwarded: Self.forwardedFor(value)
            case .xForwardedFor: value.split(separator: ",").map { $0.trimmingOWS() }
            }
        var client = peer.text
        for hop in hops.reversed() {
            let text = Self.stripPort(hop)
            guard let bytes = Self.address(String(text)) else { break }
            client = Self.describe(bytes)
            if !self.trusts(bytes) { break }
        }
        return client
    }

    /// The `for=` values of a `Forwarded` header (RFC 7239), in order.
    static func forwardedFor(_ header: String) -> [Substring] {
        var hops: [Substring] = []
        for element in header.split(separator: ",") {
            for pair in element.split(separator: ";") {
                let trimmed = pair.trimmingOWS()
                guard trimmed.count > 4, trimmed.prefix(4).lowercased() == "for=" else { continue }
                var value = trimmed.dropFirst(4)
                if value.hasPrefix("\""), value.hasSuffix("\""), value.count >= 2 {
                    value = value.dropFirst().dropLast()
                }
                hops.append(value)
            }
        }
        return hops
    }

    /// `[2001:db8::1]:4711` → `2001:db8::1`, `192.0.2.1:80` → `192.0.2.1`; a bare address unchanged.
    static func stripPort(_ hop: Substring) -> Substring {
        if hop.hasPrefix("["), let close = hop.firstIndex(of: "]") {
            return hop[hop.index(after: hop.startIndex)..<close]
        }
        if hop.filter({ $0 == ":" }).count == 1, let colon = hop.firstIndex(of: ":") { return hop[..<colon] }
        return hop
    }

    /// The bytes of an IPv4 (4) or IPv6 (16) address; an IPv4-mapped IPv6 address as IPv4.
    /// Parsed into plain byte buffers, not `in_addr`/`in6_addr`: in a whole-module (release) build those C types
    /// resolve to NIO's copy of the header, and their initializers are then out of this file's reach.
    static func address(_ text: String) -> [UInt8]? {
        var v4 = [UInt8](repeating: 0, count: 4)
        if v4.withUnsafeMutableBytes({ inet_pton(AF_INET, text, $0.baseAddress) }) == 1 { return v4 }
        var bytes = [UInt8](repeating: 0, count: 16)
        guard bytes.withUnsafeMutableBytes({ inet_pton(AF_INET6, text, $0.baseAddress) }) == 1 else { return nil }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
            return Array(bytes[12...])
        }
        return bytes
    }

    static func describe(_ bytes: [UInt8]) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        let ok = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) != nil }
        return ok ? buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } : "?"
    }

    /// A connection's remote address, as logged and as matched.
    struct Peer: Sendable {
        let text: String
        let bytes: [UInt8]?

        init(_ address: SocketAddress?) {
            switch address {
            case .v4, .v6:
                let bytes = address?.ipAddress.flatMap { TrustedProxies.address($0) }
                (self.text, self.bytes) = (bytes.map { TrustedProxies.describe($0) } ?? "unknown", bytes)
            case .unixDomainSocket:
                (self.text, self.bytes) = ("unix", nil)
            case .none:
                (self.text, self.bytes) = ("unknown", nil)
            }
        }
    }
}
