/// A request's `If-None-Match` (RFC 9110 §13.1.2): `*` or a list of entity tags.
///
/// A field that does not parse as either is ignored, as if absent: the request gets the full reply, never a
/// `304` the client did not ask for. Several field lines are one comma-separated list.
package enum IfNoneMatch: Equatable, Sendable {
    /// `*`: any current representation matches.
    case any
    /// The listed tags (at least one).
    case tags([EntityTag])

    /// The condition of the request's field lines; nil when there is none or it is malformed.
    package init?<Lines: Sequence>(fieldLines: Lines) where Lines.Element: StringProtocol {
        var tags: [EntityTag] = []
        var sawAny = false
        var sawLine = false
        for line in fieldLines {
            sawLine = true
            guard let parsed = Self.parse(Substring(line)) else { return nil }
            switch parsed {
            case .any: sawAny = true
            case .tags(let more): tags.append(contentsOf: more)
            }
        }
        guard sawLine else { return nil }
        if sawAny {
            // `*` is only valid alone.
            guard tags.isEmpty else { return nil }
            self = .any
        } else {
            guard !tags.isEmpty else { return nil }
            self = .tags(tags)
        }
    }

    /// Whether the condition is false for a representation with this tag, so that a GET or HEAD is answered
    /// `304 Not Modified`: `*`, or a listed tag that weakly matches.
    package func matches(_ current: EntityTag) -> Bool {
        switch self {
        case .any: return true
        case .tags(let tags): return tags.contains { $0.weaklyMatches(current) }
        }
    }

    /// One field line: `*`, or `#entity-tag` (empty list elements allowed, as RFC 9110 §5.6.1 says). Read as
    /// bytes, as HTTP defines it (a polling app sends this on every request; `Character` steps cost ~1 µs).
    private static func parse(_ line: Substring) -> IfNoneMatch? {
        let bytes = line.utf8
        let end = bytes.endIndex
        var index = bytes.startIndex
        func skipOWS() {
            while index < end, bytes[index] == 0x20 || bytes[index] == 0x09 { index = bytes.index(after: index) }
        }
        skipOWS()
        if index < end, bytes[index] == UInt8(ascii: "*") {
            index = bytes.index(after: index)
            skipOWS()
            return index == end ? .any : nil
        }
        var tags: [EntityTag] = []
        while true {
            skipOWS()
            if index == end { break }
            if bytes[index] == UInt8(ascii: ",") {
                index = bytes.index(after: index)
                continue
            }
            var isWeak = false
            if bytes[index] == UInt8(ascii: "W") {
                let slash = bytes.index(after: index)
                guard slash < end, bytes[slash] == UInt8(ascii: "/") else { return nil }
                isWeak = true
                index = bytes.index(after: slash)
            }
            guard index < end, bytes[index] == UInt8(ascii: "\"") else { return nil }
            let open = bytes.index(after: index)
            guard let close = bytes[open...].firstIndex(of: UInt8(ascii: "\"")) else { return nil }
            // etagc = %x21 / %x23-7E / obs-text
            guard bytes[open..<close].allSatisfy({ $0 == 0x21 || (0x23...0x7E).contains($0) || $0 >= 0x80 }) else {
                return nil
            }
            tags.append(EntityTag(opaque: Substring(bytes[open..<close]), isWeak: isWeak))
            index = bytes.index(after: close)
            skipOWS()
            if index == end { break }
            guard bytes[index] == UInt8(ascii: ",") else { return nil }
        }
        return tags.isEmpty ? nil : .tags(tags)
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (HTTP's optional whitespace).
    func trimmingOWS() -> Substring {
        var slice = self
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return slice
    }
}
