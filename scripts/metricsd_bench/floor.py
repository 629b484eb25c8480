"""Step floor: the read against the HTTP floor (nginx serving the same body), CPU per request by party."""

import os
import shutil
import subprocess
import urllib.error
import urllib.request

from .common import (BENCH_DIR, CLK_TCK, Daemon, LOG_DIR, cluster_jiffies, descendants, die, free_port, process_cpu_s, read_proc_table, run, say)

class FloorStep:
    """The read against the HTTP floor, in one run: the server's CPU per request for nginx serving the read's own
    body from a file, metricsd's /healthz, the read (200) and the conditional read (304); and what each costs in
    instructions where `perf stat` can count them."""

    def static_nginx(self, body, workers=2):
        """nginx serving `body` at /body.json from a file (access log off, as metricsd's request log is at its
        default); returns (process, port)."""
        if not shutil.which("nginx") and not os.path.exists("/usr/sbin/nginx"):
            die("nginx is missing: apt-get install nginx")
        prefix = os.path.join(BENCH_DIR, "nginx-static")
        os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
        with open(os.path.join(prefix, "body.json"), "wb") as f:
            f.write(body)
        port = free_port()
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"daemon off;\nworker_processes {workers};\npid {prefix}/nginx.pid;\n"
                    f"error_log {prefix}/logs/error.log;\nevents {{ worker_connections 1024; }}\n"
                    f"http {{ access_log off; keepalive_requests 1000000; server {{ listen 127.0.0.1:{port}; "
                    f"location = /body.json {{ default_type application/json; root {prefix}; }} }} }}\n")
        return self.run_nginx(prefix, conf, port), port

    def stop_process(self, proc):
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.children.discard(proc)

    def floor_body(self, port, tokens_path):
        with open(tokens_path) as f:
            token = f.readline().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/profile/metrics/today",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                die(f"the read answered {r.status}")
            return r.read()

    def floor(self):
        say(f"step floor: server CPU per request of nginx (a file), /healthz, the read and the conditional read "
            f"(wrk -t2 -c32, {self.args.duration} s each, two rounds)")
        tokens_path, count = self.make_tokens(limit=None)
        if count == 0:
            die("no users with metrics to mint tokens for")
        lua = self.wrk_lua(tokens_path)
        self.mark_daily_done(self.db, 1)
        self.floor_counts = self.instructions_supported()
        if not self.floor_counts[0]:
            say(f"  instructions per request not counted: {self.floor_counts[1]}")
        daemon = Daemon(self, "floor")
        nginx = None
        rounds = []
        try:
            body = self.floor_body(daemon.port, tokens_path)
            conditional = self.conditional_lua(tokens_path, daemon.port)
            nginx, nginx_port = self.static_nginx(body)
            table = read_proc_table()
            nginx_pids = [nginx.pid] + descendants(table, nginx.pid)
            base = f"http://127.0.0.1:{daemon.port}"
            loads = [("nginx", f"http://127.0.0.1:{nginx_port}/body.json", None, nginx_pids),
                     ("healthz", f"{base}/healthz", None, [daemon.pid]),
                     ("read", f"{base}/v1/profile/metrics/today", lua, [daemon.pid]),
                     ("conditional", f"{base}/v1/profile/metrics/today", conditional, [daemon.pid])]
            for k in range(2):
                figures = {}
                for name, url, script, pids in loads:
                    figures[name] = self.floor_load(url, script, pids)
                    r = figures[name]
                    say(f"  round {k + 1} {name}: {r['rps']:,.0f} req/s, p99 {r['p99_ms']:.2f} ms, server CPU "
                        f"{r['server_us']:.1f} µs per request, database {r['database_us']:.1f} µs")
                rounds.append(figures)
        finally:
            if nginx:
                self.stop_process(nginx)
            daemon.stop()
        self.results["floor"] = {"rounds": rounds, "body_bytes": len(body), "counts": self.floor_counts}

    def floor_load(self, url, script, pids):
        wrk = ["wrk", "-t2", "-c32", "--latency"] + (["-s", script] if script else [])
        run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))  # warm-up
        counting = self.perf_instructions(pids, self.args.duration) if self.floor_counts[0] else None
        c0 = sum(process_cpu_s(p) or 0 for p in pids), cluster_jiffies(self.cluster.postmaster_pid())
        result = self.logged_wrk(wrk + [f"-d{self.args.duration}s", url])
        c1 = sum(process_cpu_s(p) or 0 for p in pids), cluster_jiffies(self.cluster.postmaster_pid())
        instructions = counting() if counting else None
        if result["non2xx"] or result["socket_errors"]:
            die(f"{url}: {result['non2xx']} non-2xx/3xx answers and {result['socket_errors']} socket errors")
        n = result["requests"]
        result["server_us"] = (c1[0] - c0[0]) / n * 1e6
        result["database_us"] = (c1[1] - c0[1]) / CLK_TCK / n * 1e6
        result["instructions"] = instructions / n if instructions else None
        return result

    # -- instructions ---------------------------------------------------------------------------------------

    @staticmethod
    def instructions_supported():
        """Whether `perf stat` counts instructions here (a virtual machine often has no hardware counters)."""
        if not shutil.which("perf"):
            return False, "perf is missing (apt-get install linux-perf)"
        p = run(["perf", "stat", "-x,", "-e", "instructions", "true"], check=False)
        if "<not supported>" in p.stderr or "<not counted>" in p.stderr or p.returncode != 0:
            return False, "perf stat: instructions <not supported> (no hardware counters on this machine)"
        return True, ""

    @staticmethod
    def perf_instructions(pids, seconds):
        """Starts `perf stat -e instructions` on `pids` for `seconds`; returns a function that waits for it and
        gives the count."""
        proc = subprocess.Popen(["perf", "stat", "-x,", "-e", "instructions", "-p", ",".join(map(str, pids)), "--",
                                 "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def result():
            _, err = proc.communicate()
            for line in err.splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[2].startswith("instructions") and fields[0].isdigit():
                    return int(fields[0])
            die(f"perf stat counted no instructions: {err[-400:]}")
        return result

    def floor_rows(self, fmt, verdict):
        f = self.results.get("floor")
        if not f:
            return []
        rows = []
        for k, figures in enumerate(f["rounds"]):
            nginx = figures["nginx"]["server_us"]
            for name, label in (("nginx", f"nginx, the read's {f['body_bytes']}-byte body from a file"),
                                ("healthz", "metricsd /healthz"), ("read", "metricsd, the read (200)"),
                                ("conditional", "metricsd, the conditional read (304)")):
                r = figures[name]
                rows.append((f"floor round {k + 1}: {label}: server CPU per request",
                             f"{r['server_us']:.1f} µs ({r['rps']:,.0f} req/s, p99 {r['p99_ms']:.2f} ms"
                             + (f", database {r['database_us']:.1f} µs" if name in ("read", "conditional") else "")
                             + ")", "", "", "", None))
            for name, limit in (("healthz", 1.3), ("read", 2.5)):
                ratio = figures[name]["server_us"] / nginx
                rows.append((f"  {name} ÷ nginx (server CPU per request)", fmt(ratio, 2), "ratio", f"≤ {limit}",
                             verdict(ratio <= limit), None))
            ok = figures["conditional"]["server_us"] <= figures["read"]["server_us"]
            rows.append(("  conditional read ÷ read (server CPU per request)",
                         fmt(figures["conditional"]["server_us"] / figures["read"]["server_us"], 2), "ratio", "≤ 1",
                         verdict(ok), None))
        supported, why = f["counts"]
        if not supported:
            rows.append(("instructions per request", "not counted", "", "", "", None))
            rows.append((f"  {why}", "", "", "", "", None))
            return rows
        for k, figures in enumerate(f["rounds"]):
            rows.append((f"instructions per request, round {k + 1}: nginx, /healthz, read, conditional read",
                         ", ".join(fmt(figures[name]["instructions"]) for name in ("nginx", "healthz", "read",
                                                                                  "conditional")), "", "", "", None))
        return rows
