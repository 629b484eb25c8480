import ServiceLifecycle

/// Runs `service` once `gate` opens, or not at all when the group stops first (a failed start-up, a port in use).
package struct Gated: Service {
    let gate: Gate
    let service: any Service

    package init(after gate: Gate, _ service: any Service) {
        self.gate = gate
        self.service = service
    }

    package func run() async throws {
        guard await self.gate.wait() else { return }
        try await self.service.run()
    }
}
