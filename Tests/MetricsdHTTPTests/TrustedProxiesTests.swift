import NIOCore
import Testing

@testable import MetricsdHTTP

/// `METRICSD_TRUSTED_PROXIES`: which address the request log names as the client.
@Suite struct TrustedProxiesTests {
    static func peer(_ ip: String) throws -> TrustedProxies.Peer {
        TrustedProxies.Peer(try SocketAddress(ipAddress: ip, port: 40000))
    }

    @Test func parsing() {
        #expect(TrustedProxies(parsing: "127.0.0.1") != nil)
        #expect(TrustedProxies(parsing: "127.0.0.1, ::1 10.0.0.0/8,fd00::/8") != nil)
        for bad in ["", ",", "localhost", "10.0.0.0/33", "::1/129", "10.0.0.0/-1", "1.2.3", "10.0.0.0/8/8"] {
            #expect(TrustedProxies(parsing: bad) == nil, "\(bad)")
        }
    }

    @Test func networks() throws {
        let proxies = try #require(TrustedProxies(parsing: "10.0.0.0/8,192.168.1.7,2001:db8::/32"))
        #expect(proxies.trusts(try #require(TrustedProxies.address("10.200.3.4"))))
        #expect(!proxies.trusts(try #require(TrustedProxies.address("11.0.0.1"))))
        #expect(proxies.trusts(try #require(TrustedProxies.address("192.168.1.7"))))
        #expect(!proxies.trusts(try #require(TrustedProxies.address("192.168.1.8"))))
        #expect(proxies.trusts(try #require(TrustedProxies.address("2001:db8:1::5"))))
        #expect(!proxies.trusts(try #require(TrustedProxies.address("2001:db9::5"))))
        // An IPv4 peer on an IPv6 socket (::ffff:10.1.1.1) is the IPv4 address.
        #expect(proxies.trusts(try #require(TrustedProxies.address("::ffff:10.1.1.1"))))
    }

    @Test func theClientComesFromTheHeaderOnlyThroughATrustedPeer() throws {
        let proxies = try #require(TrustedProxies(parsing: "127.0.0.1,10.0.0.0/8"))
        let nginx = try Self.peer("127.0.0.1")
        let stranger = try Self.peer("203.0.113.50")
        // An internet client sending the header itself: ignored.
        #expect(proxies.client(peer: stranger, forwarded: "198.51.100.1") == "203.0.113.50")
        // Through the proxy: the nearest untrusted hop from the right; a forged left part is never taken.
        #expect(proxies.client(peer: nginx, forwarded: "198.51.100.1") == "198.51.100.1")
        #expect(proxies.client(peer: nginx, forwarded: "6.6.6.6, 198.51.100.1") == "198.51.100.1")
        #expect(proxies.client(peer: nginx, forwarded: "198.51.100.1, 10.1.2.3") == "198.51.100.1")
        // Not an address: the walk stops at the last trusted hop.
        #expect(proxies.client(peer: nginx, forwarded: "unknown, 10.1.2.3") == "10.1.2.3")
        #expect(proxies.client(peer: nginx, forwarded: "garbage") == "127.0.0.1")
        #expect(proxies.client(peer: nginx, forwarded: nil) == "127.0.0.1")
        // No trusted proxy configured: always the peer.
        #expect(TrustedProxies().client(peer: nginx, forwarded: "198.51.100.1") == "127.0.0.1")
    }

    /// METRICSD_FORWARDED_HEADER=forwarded: RFC 7239's for= values, quoted IPv6 with a port and IPv4 with a port;
    /// an element without for= (a client's `proto=https`) names nobody.
    @Test func theForwardedHeaderWhenChosen() throws {
        var proxies = try #require(TrustedProxies(parsing: "127.0.0.1,10.0.0.0/8"))
        proxies.header = .forwarded
        let nginx = try Self.peer("127.0.0.1")
        #expect(
            proxies.client(peer: nginx, forwarded: #"for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https"#)
                == "2001:db8:cafe::17")
        #expect(proxies.client(peer: nginx, forwarded: "for=192.0.2.60:8080;by=10.0.0.1") == "192.0.2.60")
        #expect(proxies.client(peer: nginx, forwarded: "proto=https") == "127.0.0.1")
        // The X-Forwarded-For syntax is not Forwarded's: a bare address names nobody.
        #expect(proxies.client(peer: nginx, forwarded: "198.51.100.1") == "127.0.0.1")
    }

    /// Ranges that hold much of the internet: wider than /8 (IPv4) outside multicast and reserved space, wider
    /// than /16 (IPv6) overlapping global unicast.
    @Test func rangesThatHoldMuchOfTheInternet() throws {
        let cases: [(String, [String])] = [
            ("0.0.0.0/0", ["0.0.0.0/0"]),
            ("::/0", ["::/0"]),
            ("127.0.0.1,::1,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,fe80::/10", []),
            // Cloudflare's and CloudFront's published ranges: one operator's, not warned about.
            ("104.16.0.0/13,172.64.0.0/13,2400:cb00::/32,2606:4700::/32,2600:9000::/28", []),
            ("11.0.0.0/8", []),
            ("10.0.0.0/7", ["10.0.0.0/7"]),
            ("126.0.0.0/7", ["126.0.0.0/7"]),
            ("224.0.0.0/3,240.0.0.0/4", []),
            ("2000::/3,2001:db8::/15,8000::/1", ["2000::/3", "2001:db8::/15"]),
        ]
        for (text, broad) in cases {
            #expect(try #require(TrustedProxies(parsing: text)).tooBroad == broad, "\(text)")
        }
    }
}
