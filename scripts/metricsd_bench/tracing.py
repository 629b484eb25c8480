"""Step tracing: the latest read with tracing off, at 1 % and at 100 % sampling."""

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

from .common import CLK_TCK, Daemon, LOG_DIR, cluster_jiffies, die, free_port, process_cpu_s, run, say

class TracingStep:
    """The latest read with tracing off, sampled at 1 % and at 100 %, in one run."""

    SINK = (
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
        "        self.send_response(200); self.send_header('Content-Type', 'application/json')\n"
        "        self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'{}')\n"
        "    def log_message(self, *a): pass\n"
        "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")

    def tracing(self):
        say(f"step tracing: the latest read with tracing off, at 1 % and at 100 % (wrk -t2 -c32, {self.args.duration} s each)")
        tokens_path, count = self.make_tokens()
        if count == 0:
            die("no users with metrics to mint tokens for")
        lua = self.wrk_lua(tokens_path)
        self.mark_daily_done(self.db, 1)
        sink_port = free_port()
        sink = subprocess.Popen([sys.executable, "-c", self.SINK, str(sink_port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.children.add(sink)
        endpoint = f"http://127.0.0.1:{sink_port}"
        settings = {
            "off": None,
            "1 %": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
            "100 %": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                      "OTEL_TRACES_SAMPLER": "always_on"},
        }
        runs = []
        try:
            for k, label in enumerate(["off", "1 %", "off", "1 %", "100 %"]):
                runs.append((label, self.tracing_run(f"tracing-{k + 1}", settings[label], lua)))
                r = runs[-1][1]
                say(f"  {label}: {r['rps']:,.0f} req/s, p99 {r['p99_ms']:.2f} ms, cpu per read: daemon "
                    f"{r['daemon_us']:.1f} µs, database {r['database_us']:.1f} µs; spans dropped {r['dropped']:,.0f}")
        finally:
            sink.kill()
            sink.wait()
        self.results["tracing"] = runs

    def tracing_run(self, name, env_extra, lua):
        daemon = Daemon(self, name, env_extra)
        try:
            url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
            wrk = ["wrk", "-t2", "-c32", "--latency", "-s", lua]
            run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))  # warm-up
            d0, c0 = process_cpu_s(daemon.proc.pid), cluster_jiffies(self.cluster.postmaster_pid())
            result = self.logged_wrk(wrk + [f"-d{self.args.duration}s", url])
            d1, c1 = process_cpu_s(daemon.proc.pid), cluster_jiffies(self.cluster.postmaster_pid())
            n = result["requests"]
            result["daemon_us"] = (d1 - d0) / n * 1e6
            result["database_us"] = (c1 - c0) / CLK_TCK / n * 1e6
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10).read().decode()
            dropped = re.search(r"^metricsd_trace_spans_dropped_total(?:\{[^}]*\})? ([0-9.e+]+)$", metrics, re.M)
            result["dropped"] = float(dropped.group(1)) if dropped else 0.0
            return result
        finally:
            daemon.stop()

    def tracing_rows(self, fmt, verdict):
        runs = self.results.get("tracing")
        if not runs:
            return []
        rows = []
        for label, r in runs:
            rows.append((f"tracing {label}: the latest read", fmt(r["rps"]), "req/s", "", "", None))
            rows.append(("  p99 / cpu per read: daemon, database / spans dropped",
                         f"{r['p99_ms']:.2f} ms / {r['daemon_us']:.1f}, {r['database_us']:.1f} µs / {r['dropped']:,.0f}",
                         "", "", "", None))
        off = [r["rps"] for label, r in runs if label == "off"]
        one = [r["rps"] for label, r in runs if label == "1 %"]
        full = [r["rps"] for label, r in runs if label == "100 %"]
        base = sum(off) / len(off)
        rows.append(("tracing: the two runs off, the slower ÷ the faster (run-to-run noise)", fmt(min(off) / max(off), 2),
                     "ratio", "", "", None))
        ratio = (sum(one) / len(one)) / base
        rows.append(("tracing: 1 % sampling ÷ off (means of two runs each)", fmt(ratio, 2), "ratio", "≥ 0.95",
                     verdict(ratio >= 0.95), None))
        rows.append(("tracing: 100 % sampling ÷ off", fmt(full[0] / base, 2), "ratio", "", "", None))
        return rows
