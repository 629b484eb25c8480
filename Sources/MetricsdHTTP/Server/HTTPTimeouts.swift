import NIOCore

/// How long an HTTP client may take in each state that waits for it.
package struct HTTPTimeouts: Sendable, Equatable {
    /// For a request's head (the first one from the connection's start) and, separately, for its body.
    package var request: TimeAmount
    /// Between a reply and the next request.
    package var idle: TimeAmount
    /// For a reply to be taken by the client: its end while the channel is not writable, or a closing reply.
    package var write: TimeAmount

    package init(request: TimeAmount, idle: TimeAmount, write: TimeAmount) {
        self.request = request
        self.idle = idle
        self.write = write
    }
}
