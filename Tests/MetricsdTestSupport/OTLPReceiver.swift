import Foundation
import Testing

/// An OTLP/HTTP JSON trace receiver of the test's own (on HTTP or HTTPS): a small Python server that parses every request into
/// opentelemetry-proto's `ExportTraceServiceRequest` (`google.protobuf.json_format.Parse`, after turning OTLP's hex
/// ids into the base64 of protobuf's JSON mapping, as a collector does), answers 400 to anything that does not
/// parse, and records each span it received. Needs python3 with `opentelemetry-proto`: a receiver that cannot
/// start fails the test.
package final class OTLPReceiver: @unchecked Sendable {  // the Process is only read after start
    /// One received span, as the receiver parsed it.
    package struct ReceivedSpan: Sendable {
        package let traceID: String
        package let spanID: String
        package let parentSpanID: String
        package let name: String
        /// OTLP's `SpanKind` number: 1 internal, 2 server, 3 client.
        package let kind: Int
        package let startNanos: UInt64
        package let endNanos: UInt64
        /// Every attribute's value as text.
        package let attributes: [String: String]
        /// The linked spans' `traceId/spanId`.
        package let links: [String]
        /// OTLP's status code: 0 unset, 1 ok, 2 error.
        package let status: Int
        package let serviceName: String

        package var milliseconds: Double { Double(self.endNanos - self.startNanos) / 1e6 }
    }

    package let port: Int
    private let process: Process
    private let directory: String
    /// Whether it speaks TLS (``init(certificate:)``).
    private let usesTLS: Bool

    /// A receiver on plain HTTP, or on HTTPS with `certificate` (Python's `ssl`, TLS 1.2 or later).
    package init(certificate: TestCertificate? = nil) throws {
        self.port = DaemonProcess.freePort()
        self.usesTLS = certificate != nil
        self.directory = NSTemporaryDirectory() + "metricsd-otlp-\(getpid())-\(self.port)"
        try FileManager.default.createDirectory(atPath: self.directory, withIntermediateDirectories: true)
        try Self.script.write(toFile: self.directory + "/receiver.py", atomically: true, encoding: .utf8)
        self.process = Process()
        self.process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        self.process.arguments =
            ["python3", self.directory + "/receiver.py", String(self.port), self.directory]
            + (certificate.map { [$0.certificate, $0.key] } ?? [])
        // Its output to a file: a child that outlived the test must not hold the test runner's output open.
        _ = FileManager.default.createFile(atPath: self.directory + "/output.txt", contents: nil)
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: self.directory + "/output.txt"))
        self.process.standardOutput = output
        self.process.standardError = output
        try self.process.run()
    }

    deinit {
        // SIGKILL: the test process ignores SIGTERM, and its children inherit that.
        kill(self.process.processIdentifier, SIGKILL)
        self.process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    /// The endpoint for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    package var endpoint: String { "\(self.usesTLS ? "https" : "http")://127.0.0.1:\(self.port)" }

    /// TLS handshakes that failed (the client refused the certificate, or spoke plain HTTP), with the reason.
    package var failedHandshakes: [String] {
        ((try? String(contentsOfFile: self.directory + "/handshakes.txt", encoding: .utf8)) ?? "")
            .split(separator: "\n").map(String.init)
    }

    /// Waits until the receiver listens (it writes `ready`), failing after 15 s.
    package func waitUntilReady() async throws {
        let ready = await DaemonProcess.eventually(timeout: .seconds(15)) {
            FileManager.default.fileExists(atPath: self.directory + "/ready") || !self.process.isRunning
        }
        try #require(
            ready && self.process.isRunning, "the OTLP receiver did not start (python3 with opentelemetry-proto?)")
    }

    /// Requests that did not parse as an `ExportTraceServiceRequest`, with the parser's message.
    package var rejected: [String] {
        ((try? String(contentsOfFile: self.directory + "/rejected.txt", encoding: .utf8)) ?? "")
            .split(separator: "\n").map(String.init)
    }

    /// How many export requests arrived (parsed or not).
    package var requests: Int {
        ((try? String(contentsOfFile: self.directory + "/requests.txt", encoding: .utf8)) ?? "").split(separator: "\n")
            .count
    }

    /// Every span received so far.
    package var spans: [ReceivedSpan] {
        let text = (try? String(contentsOfFile: self.directory + "/spans.jsonl", encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                return nil
            }
            return ReceivedSpan(
                traceID: object["traceId"] as? String ?? "", spanID: object["spanId"] as? String ?? "",
                parentSpanID: object["parentSpanId"] as? String ?? "", name: object["name"] as? String ?? "",
                kind: object["kind"] as? Int ?? 0, startNanos: UInt64(object["start"] as? String ?? "") ?? 0,
                endNanos: UInt64(object["end"] as? String ?? "") ?? 0,
                attributes: object["attributes"] as? [String: String] ?? [:], links: object["links"] as? [String] ?? [],
                status: object["status"] as? Int ?? 0, serviceName: object["service"] as? String ?? "")
        }
    }

    /// The spans received, once `condition` holds for them (within `timeout`); the last ones seen otherwise.
    package func spans(
        timeout: Duration = .seconds(15), until condition: ([ReceivedSpan]) -> Bool
    ) async -> [ReceivedSpan] {
        var seen: [ReceivedSpan] = []
        _ = await DaemonProcess.eventually(timeout: timeout) {
            seen = self.spans
            return condition(seen)
        }
        return seen
    }

    private static let script = #"""
        import base64, json, os, sys, threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        port, directory = int(sys.argv[1]), sys.argv[2]
        lock = threading.Lock()
        # Ends with the test: on SIGTERM (whatever the disposition inherited), or when its parent is gone.
        import signal, time
        signal.signal(signal.SIGTERM, lambda *args: os._exit(0))
        parent = os.getppid()
        def watch_parent():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(0)
        threading.Thread(target=watch_parent, daemon=True).start()

        def append(name, text):
            with lock, open(os.path.join(directory, name), "a") as f:
                f.write(text + "\n")

        def hex_to_base64(node, lengths):
            # OTLP/JSON writes trace and span ids in hex; protobuf's JSON mapping wants base64.
            if isinstance(node, dict):
                for key, value in list(node.items()):
                    if key in lengths and isinstance(value, str):
                        raw = bytes.fromhex(value)
                        if len(raw) != lengths[key]:
                            raise ValueError("%s %r is not %d bytes of hex" % (key, value, lengths[key]))
                        node[key] = base64.b64encode(raw).decode()
                    else:
                        hex_to_base64(value, lengths)
            elif isinstance(node, list):
                for value in node:
                    hex_to_base64(value, lengths)

        def text(value):
            kind = value.WhichOneof("value")
            return str(getattr(value, kind)).lower() if kind == "bool_value" else str(getattr(value, kind))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                append("requests.txt", self.path)
                try:
                    if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/json":
                        raise ValueError("POST %s as %s" % (self.path, self.headers.get("Content-Type")))
                    document = json.loads(body)
                    hex_to_base64(document, {"traceId": 16, "spanId": 8, "parentSpanId": 8})
                    request = json_format.Parse(json.dumps(document), ExportTraceServiceRequest())
                except Exception as error:
                    append("rejected.txt", repr(error).replace("\n", " "))
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                for resource_spans in request.resource_spans:
                    service = ""
                    for attribute in resource_spans.resource.attributes:
                        if attribute.key == "service.name":
                            service = text(attribute.value)
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            append("spans.jsonl", json.dumps({
                                "traceId": span.trace_id.hex(), "spanId": span.span_id.hex(),
                                "parentSpanId": span.parent_span_id.hex(), "name": span.name, "kind": span.kind,
                                "start": str(span.start_time_unix_nano), "end": str(span.end_time_unix_nano),
                                "attributes": {a.key: text(a.value) for a in span.attributes},
                                "links": [l.trace_id.hex() + "/" + l.span_id.hex() for l in span.links],
                                "status": span.status.code, "service": service}))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        class Server(ThreadingHTTPServer):
            def get_request(self):
                # With TLS the handshake runs here: a client that refuses it is recorded, and the server goes on.
                try:
                    return super().get_request()
                except OSError as error:
                    append("handshakes.txt", repr(error).replace("\n", " "))
                    raise

        server = Server(("127.0.0.1", port), Handler)
        if len(sys.argv) > 4:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(sys.argv[3], sys.argv[4])
            server.socket = context.wrap_socket(server.socket, server_side=True)
        open(os.path.join(directory, "ready"), "w").close()
        server.serve_forever()
        """#
}
