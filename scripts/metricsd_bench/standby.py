"""Step standby: the latest read from a streaming standby beside the primary alone."""

import os
import time

from .common import (CLK_TCK, CLUSTER_DIR, Daemon, LOG_DIR, PG_CLUSTER, STANDBY_DIR, cluster_jiffies, die, run, say)

class StandbyStep:
    # The index the latest read probes: profile_metrics_latest's key, or the history's on a release before it.
    READ_INDEXES = ("profile_metrics_latest_pkey", "profile_metrics_user_computed_at_idx")

    def standby_postmaster(self):
        with open(os.path.join(STANDBY_DIR, "data", "postmaster.pid")) as f:
            return int(f.readline().strip())

    def standby_psql(self, sql):
        url = f"postgresql://postgres@127.0.0.1:{self.args.port + 1}/{self.db}?sslmode=disable"
        return run([self.cluster.psql_bin, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql]).stdout.strip()

    def read_index_scans(self, psql):
        return int(psql(f"SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
                        f"WHERE indexrelname IN {self.READ_INDEXES}") or 0)

    def standby(self):
        say(f"step standby: the latest read on a streaming standby beside the primary alone "
            f"(wrk -t2 -c32, {self.args.duration} s each)")
        log = os.path.join(LOG_DIR, "pg-cluster.log")
        run([PG_CLUSTER, "destroy", STANDBY_DIR], check=False, log=log)
        t = time.monotonic()
        run([PG_CLUSTER, "standby", STANDBY_DIR, str(self.args.port + 1), CLUSTER_DIR, "async"], log=log)
        say(f"  standby made in {time.monotonic() - t:.0f} s (pg_basebackup of the bench cluster)")
        try:
            tokens_path, count = self.make_tokens()
            if count == 0:
                die("no users with metrics to mint tokens for")
            lua = self.wrk_lua(tokens_path)
            self.mark_daily_done(self.db, 1)
            standby_url = f"postgresql://postgres@127.0.0.1:{self.args.port + 1}/{self.db}?sslmode=disable"
            servers = {"primary": (self.cluster.postmaster_pid, lambda sql: self.cluster.psql(self.db, sql)),
                       "standby": (self.standby_postmaster, self.standby_psql)}

            def one(name, env_extra):
                daemon = Daemon(self, name, env_extra)
                try:
                    url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
                    wrk = ["wrk", "-t2", "-c32", "--latency", "-s", lua]
                    run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))  # warm-up
                    # An idle backend flushes its statistics within 10 s (PGSTAT_IDLE_INTERVAL): wait that long
                    # after the warm-up and after the run, so each count holds exactly the run's scans.
                    time.sleep(11)
                    scans0 = {k: self.read_index_scans(psql) for k, (_, psql) in servers.items()}
                    cpu0 = {k: cluster_jiffies(pid()) for k, (pid, _) in servers.items()}
                    result = self.logged_wrk(wrk + [f"-d{self.args.duration}s", url])
                    cpu1 = {k: cluster_jiffies(pid()) for k, (pid, _) in servers.items()}
                    time.sleep(11)
                    scans1 = {k: self.read_index_scans(psql) for k, (_, psql) in servers.items()}
                    n = result["requests"]
                    result["cpu_us_per_read"] = {k: (cpu1[k] - cpu0[k]) / CLK_TCK / n * 1e6 for k in servers}
                    result["index_scans_per_request"] = {k: (scans1[k] - scans0[k]) / n for k in servers}
                    return result
                finally:
                    daemon.stop()

            def attempt(k, meter):
                meter.other_clusters = [self.standby_postmaster()]
                meter.start()
                alone = one(f"standby-primary-{k + 1}", None)
                on_standby = one(f"standby-read-{k + 1}", {"METRICSD_READ_DATABASE_URL": standby_url})
                cpu = meter.stop()
                return {"primary_only": alone, "on_standby": on_standby, "_cpu": cpu}

            return self.timed("standby", attempt,
                              lambda r: f"primary alone {r['primary_only']['rps']:,.0f} req/s, on the standby "
                                        f"{r['on_standby']['rps']:,.0f} req/s")
        finally:
            run([PG_CLUSTER, "destroy", STANDBY_DIR], check=False, log=log)

    def standby_rows(self, fmt, verdict):
        if "standby" not in self.results:
            return []
        x = self.results["standby"]
        a, b = x["primary_only"], x["on_standby"]
        rows = [("standby: the latest read, primary alone (wrk -t2 -c32)", fmt(a["rps"]), "req/s", "", "", "standby"),
                ("  the same, reads on one standby (METRICSD_READ_DATABASE_URL)", fmt(b["rps"]), "req/s", "", "", None),
                ("  req/s on the standby ÷ primary alone (one machine: the servers share its cores)",
                 fmt(b["rps"] / a["rps"], 2), "ratio", "", "", None),
                ("  p99 latency, primary alone / on the standby", f"{a['p99_ms']:.2f} / {b['p99_ms']:.2f}", "ms", "",
                 "", None)]
        bad = a["non2xx"] + a["socket_errors"] + b["non2xx"] + b["socket_errors"]
        rows.append(("  non-2xx responses + socket errors (both runs)", str(bad),
                     f"of {a['requests'] + b['requests']:,}", "0", verdict(bad == 0), None))
        for label, r in (("primary alone", a), ("on the standby", b)):
            c, s = r["cpu_us_per_read"], r["index_scans_per_request"]
            rows.append((f"  database CPU per read, {label}: primary / standby", f"{c['primary']:.0f} / {c['standby']:.0f}",
                         "µs", "", "", None))
            rows.append((f"  read-index scans per request, {label}: primary / standby",
                         f"{s['primary']:.2f} / {s['standby']:.2f}", "scans", "", "", None))
        moved = a["cpu_us_per_read"]["primary"] - b["cpu_us_per_read"]["primary"]
        rows.append(("  primary CPU per read moved off it by the standby", f"{moved:.0f}", "µs", "> 0",
                     verdict(moved > 0), None))
        return rows
