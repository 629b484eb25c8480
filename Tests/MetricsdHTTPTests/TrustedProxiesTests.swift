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

    @Test func theClientComesFromHeadersOnlyThroughATrustedPeer() throws {
        let proxies = try #require(TrustedProxies(parsing: "127.0.0.1,10.0.0.0/8"))
        let nginx = try Self.peer("127.0.0.1")
        let stranger = try Self.peer("203.0.113.50")
        // An internet client sending the header itself: ignored.
        #expect(proxies.client(peer: stranger, forwarded: nil, forwardedFor: "198.51.100.1") == "203.0.113.50")
        // Through the proxy: the nearest untrusted hop from the right; a forged left part is never taken.
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: "198.51.100.1") == "198.51.100.1")
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: "6.6.6.6, 198.51.100.1") == "198.51.100.1")
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: "198.51.100.1, 10.1.2.3") == "198.51.100.1")
        // Not an address: the walk stops at the last trusted hop.
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: "unknown, 10.1.2.3") == "10.1.2.3")
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: "garbage") == "127.0.0.1")
        #expect(proxies.client(peer: nginx, forwarded: nil, forwardedFor: nil) == "127.0.0.1")
        // Forwarded (RFC 7239) wins over X-Forwarded-For; quoted IPv6 with a port, and IPv4 with a port.
        #expect(
            proxies.client(peer: nginx, forwarded: #"for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https"#, forwardedFor: "1.1.1.1")
                == "2001:db8:cafe::17")
        #expect(proxies.client(peer: nginx, forwarded: "for=192.0.2.60:8080;by=10.0.0.1", forwardedFor: nil) == "192.0.2.60")
        // No trusted proxy configured: always the peer.
        #expect(TrustedProxies().client(peer: nginx, forwarded: nil, forwardedFor: "198.51.100.1") == "127.0.0.1")
    }
}
