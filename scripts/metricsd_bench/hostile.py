"""Step hostile: clients that try to take more than their share (pipelining, never reading, /readyz floods, slowhttptest, the connection limit)."""

import os
import re
import select
import socket
import subprocess
import threading
import time

from .common import (CLUSTER_DIR, Daemon, LOG_DIR, accept_queue, die, open_server_connections, raise_open_files, resident_mb, run, say, timed_get)

HOSTILE_PARTS = ["pipeline", "never-read", "readyz", "slowhttptest", "limit"]
HOSTILE_PIPELINE_REQUEST = b"GET /openapi.yaml HTTP/1.1\r\nHost: bench\r\n\r\n"
SLOWHTTPTEST_MODES = [
    # (name, path, arguments): 1,000 connections at 200/s, 30 s, probe timeout 3 s
    ("slowloris", "/healthz", ["-H", "-i", "10", "-x", "24"]),
    ("slow body", "/v1/profile/metrics/acknowledge", ["-B", "-i", "10", "-s", "8192", "-x", "24"]),
    ("slow read", "/openapi.yaml", ["-X", "-w", "10", "-y", "20", "-n", "2", "-z", "32", "-k", "3"]),
    ("range", "/openapi.yaml", ["-R", "-a", "10", "-b", "3000"]),
]


class HostileClients:
    """The `hostile` step, mixed into Bench: one daemon at the default configuration, and

    - pipelining without reading: one client pipelines GET /openapi.yaml as fast as the server takes it, never
      reads, and reconnects when the server closes it, for --hostile-seconds (default 60); the daemon's RSS
      growth, and the latest read's p99 for 4 other clients (wrk -c4) before and during it;
    - 512 clients send GET /openapi.yaml with `Connection: close` and never read: the time until the server
      holds none of them, and the slowest GET /healthz from a fresh client (every 20 ms) meanwhile, beside the
      same figure with the same clients reading their replies (the control: what that load costs on this machine);
    - a /readyz flood (wrk -c16) beside the latest read (wrk -c16): readiness probes in the WAL
      (pg_waldump), and the latest read's req/s beside it ÷ beside a /healthz flood of the same shape;
    - Debian's slowhttptest at 1,000 connections: slowloris, slow body, slow read and range, each 30 s, with
      its own verdict per second (service available or not);
    - the connection limit: METRICSD_MAX_CONNECTIONS + 76 idle connections; those beyond the limit are
      answered (503) and closed at once, and the kernel's accept queue stays empty.
    """

    def hostile(self):
        say("step hostile: misbehaving clients")
        raise_open_files()
        self.mark_daily_done(self.db, 1)
        tokens_path, count = self.make_tokens()
        if count == 0:
            die("no users with metrics to mint tokens for")
        lua = self.wrk_lua(tokens_path)
        result = {}
        parts = self.args.hostile_parts
        daemon = Daemon(self, "hostile")
        try:
            if "pipeline" in parts:
                result["pipeline"] = self.hostile_pipelining(daemon, lua)
            if "never-read" in parts:
                result["never_read"] = self.hostile_never_read(daemon)
            if "readyz" in parts:
                result["readyz"] = self.hostile_readyz(daemon, lua)
            if "slowhttptest" in parts:
                result["slowhttptest"] = [self.hostile_slowhttptest(daemon, *mode) for mode in SLOWHTTPTEST_MODES]
        finally:
            daemon.stop()
        if "limit" in parts:
            result["limit"] = self.hostile_connection_limit()
        self.results["hostile"] = result
        return result

    def wrk_latest(self, port, lua, seconds, connections=4):
        url = f"http://127.0.0.1:{port}/v1/profile/metrics/today"
        p = run(["wrk", "-t1", f"-c{connections}", "--latency", "-s", lua, f"-d{seconds}s", url])
        with open(os.path.join(LOG_DIR, "wrk-hostile.log"), "a") as f:
            f.write(p.stdout + p.stderr)
        return self.parse_wrk(p.stdout)

    def hostile_pipelining(self, daemon, lua):
        seconds = self.args.hostile_seconds
        say(f"  pipelining without reading, {seconds} s")
        before = self.wrk_latest(daemon.port, lua, 10)
        rss_before = resident_mb(daemon.pid)
        stop = threading.Event()
        stats = {"sent": 0, "connections": 0}

        def attacker():
            burst = HOSTILE_PIPELINE_REQUEST * 64
            while not stop.is_set():
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                try:
                    s.connect(("127.0.0.1", daemon.port))
                except OSError:
                    s.close()
                    time.sleep(0.1)
                    continue
                s.setblocking(False)
                stats["connections"] += 1
                while not stop.is_set():
                    try:
                        stats["sent"] += s.send(burst)
                    except BlockingIOError:
                        select.select([], [s], [], 0.05)
                    except OSError:
                        break  # closed by the server
                s.close()

        peak = [rss_before]

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], resident_mb(daemon.pid))
                time.sleep(0.1)

        threads = [threading.Thread(target=attacker, daemon=True), threading.Thread(target=watch, daemon=True)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(2)
        during = self.wrk_latest(daemon.port, lua, max(5, seconds - 4))
        while time.monotonic() - t0 < seconds:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        peak[0] = max(peak[0], resident_mb(daemon.pid))
        time.sleep(5)
        return {"seconds": elapsed, "rss_before_mb": rss_before, "rss_peak_mb": peak[0],
                "growth_mb": peak[0] - rss_before, "rss_after_mb": resident_mb(daemon.pid),
                "offered_per_s": stats["sent"] / len(HOSTILE_PIPELINE_REQUEST) / elapsed,
                "connections": stats["connections"], "p99_before_ms": before["p99_ms"],
                "p99_during_ms": during["p99_ms"], "rps_before": before["rps"], "rps_during": during["rps"],
                "non2xx_during": during["non2xx"]}

    def hostile_never_read(self, daemon, clients=512):
        """--never-read-rounds rounds of: `clients` sockets (2 KiB receive buffers) each send GET /openapi.yaml with
        `Connection: close` and never read; a prober timing a GET /healthz from a fresh client every 20 ms, from 1 s
        before the first of them connects (the baseline: this machine's own latency, whatever else runs on it) until
        the server holds none of them. Then, as a control, the same rounds with clients that read their replies
        (the same connections, requests and bytes, from well-behaved clients): what the load itself costs a fresh
        client on this machine, beside what the never-reading ones cost. The prober is its own process, so the
        client loop's Python never delays its timings. Reported for each: the slowest probe over all rounds while
        the clients were there (and p99, p50, the sample count), the baseline's, and the time until all were closed."""
        idle = float(daemon.env.get("METRICSD_HTTP_IDLE_TIMEOUT_SECONDS", "60"))
        rounds = self.args.never_read_rounds
        say(f"  {clients} clients that never read a closing reply, {rounds} round(s), /healthz probed every 20 ms")
        result = self.never_read_rounds(daemon, clients, rounds, idle, read=False)
        say(f"  control: {clients} clients that read their closing replies, {rounds} round(s)")
        result["control"] = self.never_read_rounds(daemon, clients, rounds, idle, read=True)
        return result

    @staticmethod
    def healthz_prober(port, stop, connection):
        """Runs in its own process: a GET /healthz from a fresh client every 20 ms until `stop`; sends the probes."""
        probes = []
        while not stop.is_set():
            started = time.monotonic()
            status, took = timed_get(port, "/healthz")
            probes.append((started, status, took))
            time.sleep(0.02)
        connection.send(probes)
        connection.close()

    def never_read_rounds(self, daemon, clients, rounds, idle, read):
        import multiprocessing
        context = multiprocessing.get_context("fork")
        request = b"GET /openapi.yaml HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
        during, baseline, failures, closed, still_open = [], [], 0, [], 0
        for _ in range(rounds):
            stop = context.Event()
            receiver, sender = context.Pipe(duplex=False)
            prober = context.Process(target=HostileClients.healthz_prober, args=(daemon.port, stop, sender), daemon=True)
            prober.start()
            time.sleep(1.0)
            sockets = []
            t0 = time.monotonic()
            for _ in range(clients):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                s.connect(("127.0.0.1", daemon.port))
                s.sendall(request)
                sockets.append(s)
            if read:
                for s in sockets:
                    s.settimeout(2 * idle + 10)
                    try:
                        while s.recv(65536):
                            pass
                    except OSError:
                        pass
            closed_after = None
            while time.monotonic() - t0 < 2 * idle + 10:
                if open_server_connections(daemon.port) <= 1:  # the prober's own connection may be open
                    time.sleep(0.05)
                    if open_server_connections(daemon.port) <= 1:
                        closed_after = time.monotonic() - t0
                        break
                time.sleep(0.05)
            stop.set()
            probes = receiver.recv()
            prober.join()
            still_open = max(still_open, open_server_connections(daemon.port))
            for s in sockets:
                s.close()
            # A probe that ended after the first client connected counts as "during".
            during += [took for started, _, took in probes if started + took >= t0]
            baseline += [took for started, _, took in probes if started + took < t0]
            failures += sum(1 for _, status, _ in probes if status != 200)
            closed.append(closed_after)
            time.sleep(1)

        def summary(latencies):
            ordered = sorted(latencies)
            if not ordered:
                return float("nan"), float("nan"), float("nan")
            at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
            return ordered[-1] * 1000, at(0.99), at(0.5)

        (worst, p99, p50), (base_worst, base_p99, base_p50) = summary(during), summary(baseline)
        return {"clients": clients, "rounds": rounds, "idle_timeout_s": idle,
                "closed_after_s": None if None in closed else max(closed), "still_open": still_open,
                "healthz_max_ms": worst, "healthz_p99_ms": p99, "healthz_p50_ms": p50, "healthz_failures": failures,
                "healthz_probes": len(during), "baseline_max_ms": base_worst, "baseline_p99_ms": base_p99,
                "baseline_p50_ms": base_p50, "baseline_probes": len(baseline)}

    def wal_probes(self, start_lsn, end_lsn):
        """Readiness probes committed between two WAL positions: metricsd's logical messages, by pg_waldump."""
        p = run([os.path.join(self.cluster.bindir(), "pg_waldump"), "-p", os.path.join(CLUSTER_DIR, "data", "pg_wal"),
                 "-s", start_lsn, "-e", end_lsn, "-r", "LogicalMessage"], check=False)
        return sum('prefix "metricsd"' in line for line in p.stdout.splitlines())

    def hostile_readyz(self, daemon, lua, seconds=15):
        say(f"  /readyz flood beside the latest read, then a /healthz flood beside it ({seconds} s each)")
        url = f"http://127.0.0.1:{daemon.port}"
        out = {}
        for name in ("readyz", "healthz"):
            lsn0 = self.cluster.value(self.db, "SELECT pg_current_wal_flush_lsn()")
            t0 = time.monotonic()
            flood = subprocess.Popen(["wrk", "-t1", "-c16", f"-d{seconds}s", f"{url}/{name}"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            latest = self.wrk_latest(daemon.port, lua, seconds, connections=16)
            flood_out = flood.communicate()[0]
            lsn1 = self.cluster.value(self.db, "SELECT pg_current_wal_flush_lsn()")
            window = time.monotonic() - t0
            wal_bytes = int(self.cluster.value(self.db, f"SELECT pg_wal_lsn_diff('{lsn1}', '{lsn0}')"))
            out[name] = {"flood_rps": self.parse_wrk(flood_out)["rps"], "latest_rps": latest["rps"],
                         "latest_p99_ms": latest["p99_ms"], "probes": self.wal_probes(lsn0, lsn1),
                         "wal_bytes": wal_bytes, "seconds": seconds, "window_s": window}
        out["ratio"] = out["readyz"]["latest_rps"] / out["healthz"]["latest_rps"]
        return out

    def hostile_slowhttptest(self, daemon, name, path, arguments, connections=1000, seconds=30):
        say(f"  slowhttptest {name}: {connections} connections, {seconds} s")
        prefix = os.path.join(LOG_DIR, "slowhttptest-" + name.replace(" ", "-"))
        peak = [resident_mb(daemon.pid)]
        cmd = ["slowhttptest", "-c", str(connections), "-r", "200", "-l", str(seconds), "-p", "3", "-g", "-o", prefix,
               "-u", f"http://127.0.0.1:{daemon.port}{path}"] + arguments
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while p.poll() is None:
            peak[0] = max(peak[0], resident_mb(daemon.pid))
            time.sleep(0.2)
        output = p.stdout.read()
        with open(prefix + ".log", "w") as f:
            f.write(output)
        rows = []
        try:
            with open(prefix + ".csv") as f:
                next(f)
                rows = [line.strip().split(",") for line in f if line.strip()]
        except OSError:
            pass
        unavailable = sum(1 for row in rows if len(row) >= 5 and int(row[4]) == 0)
        connected = max((int(row[3]) for row in rows if len(row) >= 5), default=0)
        plain = re.sub(r"\x1b\[[\d;]*m", "", output)  # slowhttptest colours its report
        status = re.search(r"Exit status:\s*([^\n]+)", plain)
        return {"name": name, "seconds_reported": len(rows), "seconds_unavailable": unavailable,
                "max_connected": connected, "exit_status": status.group(1).strip() if status else "?",
                "rss_peak_mb": peak[0]}

    def hostile_connection_limit(self, extra=76):
        daemon = Daemon(self, "hostile-limit")
        limit = int(daemon.env.get("METRICSD_MAX_CONNECTIONS", "1024"))
        say(f"  connection limit: {limit} + {extra} idle connections")
        sockets = []
        try:
            for _ in range(limit + extra):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", daemon.port))
                sockets.append(s)
            time.sleep(2)
            queued = accept_queue(daemon.port)
            refused, silent = 0, 0
            for s in sockets:
                try:
                    data = s.recv(4096)
                    refused += data.startswith(b"HTTP/1.1 503")
                except (BlockingIOError, OSError):
                    silent += 1
            held = open_server_connections(daemon.port)
        finally:
            for s in sockets:
                s.close()
            daemon.stop()
        return {"limit": limit, "opened": limit + extra, "refused_503": refused, "unanswered": silent,
                "held_by_server": held, "accept_queue": queued}

    def hostile_rows(self, fmt, verdict):
        """The step's lines of the table."""
        h = self.results.get("hostile")
        if not h:
            return []
        rows = []
        if "pipeline" in h:
            p = h["pipeline"]
            rows.append((f"hostile: one client pipelines /openapi.yaml, never reads ({p['seconds']:.0f} s, "
                         f"{p['offered_per_s']:,.0f} req/s offered, {p['connections']} connections)",
                         fmt(p["growth_mb"], 1), "MB RSS", "≤ 32", verdict(p["growth_mb"] <= 32), None))
            rows.append(("  RSS before / peak / 5 s after", f"{p['rss_before_mb']:.0f} / {p['rss_peak_mb']:.0f} / "
                         f"{p['rss_after_mb']:.0f}", "MB", "", "", None))
            ratio = p["p99_during_ms"] / p["p99_before_ms"]
            rows.append(("  4 other clients' latest-read p99: during ÷ before", fmt(ratio, 2), "ratio",
                         f"({p['p99_before_ms']:.2f} → {p['p99_during_ms']:.2f} ms)", verdict(ratio <= 1.5), None))
        if "never_read" in h:
            n = h["never_read"]
            closed = "never" if n["closed_after_s"] is None else f"{n['closed_after_s']:.1f}"
            rows.append((f"hostile: {n['clients']} clients never read a closing reply: all closed after", closed, "s",
                         f"≤ {2 * n['idle_timeout_s']:.0f}",
                         verdict(n["closed_after_s"] is not None and n["closed_after_s"] <= 2 * n["idle_timeout_s"]), None))
            rows.append((f"  slowest GET /healthz from a fresh client meanwhile (max of {n['healthz_probes']} probes, "
                         f"{n['rounds']} round(s); p99 {n['healthz_p99_ms']:.1f}, p50 {n['healthz_p50_ms']:.1f} ms)",
                         fmt(n["healthz_max_ms"], 1), "ms", "< 100",
                         verdict(n["healthz_max_ms"] < 100 and n["healthz_failures"] == 0), None))
            rows.append((f"    the same probes in the second before the clients, the machine's own (max of "
                         f"{n['baseline_probes']}; p99 {n['baseline_p99_ms']:.1f}, p50 {n['baseline_p50_ms']:.1f} ms)",
                         fmt(n["baseline_max_ms"], 1), "ms", "", "", None))
            if "control" in n:
                c = n["control"]
                rows.append((f"  control: the same {c['clients']} clients reading their replies: slowest GET /healthz "
                             f"(max of {c['healthz_probes']}; p99 {c['healthz_p99_ms']:.1f}, p50 {c['healthz_p50_ms']:.1f} ms)",
                             fmt(c["healthz_max_ms"], 1), "ms", "", "", None))
                rows.append(("  slowest /healthz beside never-reading clients ÷ beside reading ones",
                             fmt(n["healthz_max_ms"] / c["healthz_max_ms"], 2), "ratio", "", "", None))
        if "readyz" in h:
            r = h["readyz"]
            # n probes at most once a second span at least n - 1 seconds: the rate is the gaps between them over the
            # window in which the WAL was read (the flood's seconds plus wrk's start and the two WAL positions).
            probes = r["readyz"]["probes"]
            window = r["readyz"].get("window_s", r["readyz"]["seconds"])
            per_s = max(0, probes - 1) / window
            rows.append((f"hostile: /readyz flood ({r['readyz']['flood_rps']:,.0f} req/s): readiness probes in the WAL, "
                         f"{probes} in {window:.1f} s (probes - 1 ÷ the window)",
                         fmt(per_s, 2), "per s", "≤ 1", verdict(per_s <= 1.0), None))
            rows.append(("  WAL written during the /readyz flood ÷ during the /healthz flood",
                         f"{r['readyz']['wal_bytes']:,} / {r['healthz']['wal_bytes']:,}", "bytes", "", "", None))
            rows.append(("  latest read req/s beside the /readyz flood ÷ beside a /healthz flood", fmt(r["ratio"], 2),
                         "ratio", "≥ 0.9", verdict(r["ratio"] >= 0.9), None))
        if "slowhttptest" in h:
            for s in h["slowhttptest"]:
                rows.append((f"slowhttptest {s['name']}, 1,000 connections: seconds without service ({s['exit_status']})",
                             f"{s['seconds_unavailable']} of {s['seconds_reported']}", "s", "0",
                             verdict(s["seconds_unavailable"] == 0 and s["seconds_reported"] > 0), None))
                rows.append(("  most connections open at once / daemon's peak RSS",
                             f"{s['max_connected']} / {s['rss_peak_mb']:.0f}", "conn / MB", "", "", None))
        if "limit" in h:
            c = h["limit"]
            over = c["opened"] - c["limit"]
            rows.append((f"connection limit {c['limit']:,}: of {over} connections beyond it, answered 503 and closed",
                         f"{c['refused_503']}", f"of {over}", f"{over}", verdict(c["refused_503"] == over), None))
            rows.append(("  left in the kernel's accept queue / held by the server", f"{c['accept_queue']} / {c['held_by_server']}",
                         "conn", f"0 / ≤ {c['limit']}", verdict(c["accept_queue"] == 0 and c["held_by_server"] <= c["limit"]),
                         None))
        return rows


# ----------------------------------------------------------------------------------------------------------
# event loop (step eventloop): what each kind of request costs the event loop, and /healthz beside it
