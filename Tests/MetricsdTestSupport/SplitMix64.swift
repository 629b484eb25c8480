/// A small seeded PRNG (SplitMix64), so that a randomized test's failure reproduces from its seed.
package struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    package init(seed: UInt64) { self.state = seed }
    package mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    package mutating func next(upTo bound: Int) -> Int { Int(self.next() % UInt64(bound)) }
}
