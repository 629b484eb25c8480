import NIOCore

/// A reply body written part by part while it is produced (a user's export), instead of one buffer: what a reply
/// holds in memory is the part being written, whatever the body's size.
///
/// The connection runs `produce` in its own task once the head is written. Each ``BodyWriter/write(_:)`` returns
/// when its part is flushed to the socket, so a client that reads slowly slows the producer down (nothing piles
/// up in the channel), and each part moves the connection's write deadline forward: a client that stops reading
/// for the write timeout is cut off, one that reads is not, however long the body. A streamed reply ends the
/// connection after it (the body has no `Content-Length`: NIO sends it chunked), and a producer that fails
/// part-way closes the connection without the last chunk, so the client sees a truncated body, never a complete
/// wrong one.
package struct BodyStream: Sendable {
    let produce: @Sendable (BodyWriter) async throws -> Void

    package init(_ produce: @escaping @Sendable (BodyWriter) async throws -> Void) {
        self.produce = produce
    }
}

/// Where a ``BodyStream`` writes its parts.
package struct BodyWriter: Sendable {
    let send: @Sendable (ByteBuffer) async throws -> Void

    /// Writes one part and waits until it is flushed; throws when the connection is gone.
    package func write(_ part: ByteBuffer) async throws {
        guard part.readableBytes > 0 else { return }
        try await self.send(part)
    }
}

extension JSONWriter {
    /// `text` as a JSON string literal, quotes included (for bodies written by hand, part by part).
    package static func quoted(_ text: String) -> String {
        var writer = JSONWriter(capacity: text.utf8.count + 2)
        writer.writeString(text)
        return writer.text
    }
}
