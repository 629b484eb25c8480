"""Step pooler: metricsd through PgBouncer in transaction mode against the same server directly."""

import os
import re

from .common import LOG_DIR, PG_CLUSTER, ROOT, die, run, say
from . import common

class PoolerStep:
    """The read and the daily unit's code path through a transaction-mode PgBouncer against direct, in one run."""

    POOLER_USERS = 20000
    POOLER_LINE = re.compile(r"^(\w+)\s+latest reads\s+([0-9.]+) req/s\s+cpu ms/request daemon ([0-9.]+) pooler ([0-9.]+) "
                             r"database ([0-9.]+)\s+recompute-all --wait\s+([0-9.]+) users/s")

    def pooler_cost(self, label, base, via, modes, env_extra, log):
        users = min(self.args.users, self.POOLER_USERS)
        env = dict(os.environ, MODES=modes, **env_extra)
        cmd = [os.path.join(ROOT, "scripts", "pooler-cost"), common.METRICSD, base, str(users), str(int(self.args.duration))]
        p = run(cmd + ([via] if via else []), env=env, check=False)
        with open(log, "a") as f:
            f.write(f"\n$ MODES='{modes}' {' '.join(cmd)} {via or ''}\n{p.stdout}{p.stderr}")
        if p.returncode != 0:
            die(f"pooler: scripts/pooler-cost ({label}) failed (exit {p.returncode}); see {log}")
        rounds = []
        for line in p.stdout.splitlines():
            m = self.POOLER_LINE.match(line.strip())
            if m:
                rounds.append({"mode": m.group(1), "rps": float(m.group(2)), "cpu_daemon_ms": float(m.group(3)),
                               "cpu_pooler_ms": float(m.group(4)), "cpu_database_ms": float(m.group(5)),
                               "users_per_s": float(m.group(6))})
                say(f"  {label}, {m.group(1)}: {line.strip()}")
        if not rounds:
            die(f"pooler: no result from scripts/pooler-cost ({label}); see {log}")
        return rounds

    def pooler(self):
        log = os.path.join(LOG_DIR, "pooler.log")
        bouncer_dir = os.path.join(ROOT, ".local", "bench-pgbouncer")
        port = self.args.port + 5
        base = f"postgresql://postgres@127.0.0.1:{self.args.port}"
        say(f"step pooler: the latest read and recompute-all direct (named, unnamed statements) and through PgBouncer "
            f"in transaction mode on port {port}, {min(self.args.users, self.POOLER_USERS):,} users")
        run([PG_CLUSTER, "pgbouncer", "start", bouncer_dir, str(port), str(self.args.port), "transaction"], log=log)
        try:
            with open(os.path.join(bouncer_dir, "pgbouncer.pid")) as f:
                bouncer_pid = f.read().strip()
            direct = self.pooler_cost("direct", base, None, "named unnamed", {}, log)
            pooled = self.pooler_cost("through PgBouncer", base, f"postgresql://postgres@127.0.0.1:{port}", "auto",
                                      {"BOUNCER_PID": bouncer_pid}, log)
        finally:
            run([PG_CLUSTER, "pgbouncer", "destroy", bouncer_dir], check=False, log=log)
        self.results["pooler"] = {"direct": {r["mode"]: r for r in direct}, "pooled": pooled[0]}

    def pooler_rows(self, fmt, verdict):
        x = self.results.get("pooler")
        if not x:
            return []
        named, unnamed, pooled = x["direct"].get("named"), x["direct"].get("unnamed"), x["pooled"]
        rows = []
        for label, r in (("direct, named statements", named), ("direct, unnamed statements", unnamed),
                         ("through PgBouncer (transaction mode, auto: unnamed)", pooled)):
            if not r:
                continue
            rows.append((f"pooler: the latest read, {label}", fmt(r["rps"]), "req/s", "", "", None))
            rows.append(("  cpu per read: daemon / pooler / database", f"{r['cpu_daemon_ms']:.3f} / {r['cpu_pooler_ms']:.3f} / "
                         f"{r['cpu_database_ms']:.3f}", "ms", "", "", None))
            rows.append(("  recompute-all --wait", fmt(r["users_per_s"]), "users/s", "", "", None))
        if named:
            if unnamed:
                rows.append(("pooler: unnamed ÷ named statements, direct: reads / recompute",
                             f"{unnamed['rps'] / named['rps']:.2f} / {unnamed['users_per_s'] / named['users_per_s']:.2f}",
                             "ratio", "", "", None))
            rows.append(("pooler: through PgBouncer ÷ direct named: reads / recompute",
                         f"{pooled['rps'] / named['rps']:.2f} / {pooled['users_per_s'] / named['users_per_s']:.2f}",
                         "ratio", "", "", None))
        return rows
