"""Step readindex: the read index migration on a live history, its lock time and size."""

import os
import re
import threading
import time

from .common import CLUSTER_DIR, DB, LOG_DIR, run, say
from .growth import GROWTH_DB, Growth
from . import common

class ReadIndexStep:
    """The migration that makes the read index descending, on a history of --users users × --days days laid out
    in monthly partitions as the daily units leave it: how long each of its statements takes, how long a writer
    and a reader of the history wait meanwhile, and the bytes per user-day of the read index before (ascending,
    grown entry by entry), right after (each part built at once) and grown entry by entry when descending."""

    MIGRATION = "0021_read_index_descending.sql"

    def readindex(self):
        g = Growth(self)
        g.cap.create()
        self.db = GROWTH_DB
        try:
            say(f"step readindex: {self.args.users:,} users × {self.args.days} days, the read index ascending as "
                "before the migration")
            out = {"users": self.args.users, "days": self.args.days}
            g.ascending_read_index = True
            g.valid = g.seed_people(GROWTH_DB, self.args.users, self.args.days)
            out["seed"] = g.seed_history(self.args.days, timeline=self.args.days)
            out["before"] = g.sizes(self.args.days)
            out["migration"] = self.readindex_migrate(g)
            out["after"] = g.sizes(self.args.days)
            say("step readindex: the same history grown entry by entry with the read index descending")
            g.ascending_read_index = False
            g.seed_people(GROWTH_DB, self.args.users, self.args.days)
            g.seed_history(self.args.days, timeline=self.args.days)
            out["grown"] = g.sizes(self.args.days)
            self.results["readindex"] = out
        finally:
            self.db = DB
            g.restart(capped=False, cold=False)
            g.cap.destroy()

    # The migrator's own statements around a migration's (taking its turn, reading and recording what is applied).
    MIGRATOR_STATEMENTS = ("SELECT pg_try_advisory_lock", "SELECT pg_advisory_unlock", "SELECT to_regclass",
                           "SELECT name, checksum", "SELECT encode(sha256", "INSERT INTO metricsd_migrations",
                           "CREATE TABLE IF NOT EXISTS metricsd_migrations")

    def readindex_migrate(self, g):
        """`metricsd migrate` (the read index migration alone is pending) while a writer inserts a row through
        profile_metrics and a reader asks for a user's newest row, each in a loop: each statement's time from the
        server's log (log_min_duration_statement = 0 for the migrator's session, through PGOPTIONS), the longest
        wait of each probe."""
        log = os.path.join(LOG_DIR, "readindex-migrate.log")
        env = self.daemon_env(0, GROWTH_DB)
        env["PGOPTIONS"] = "-c jit=off -c log_min_duration_statement=0"
        server_log = os.path.join(CLUSTER_DIR, "log", "postgresql.log")
        probes = {"write": ("INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) "
                            "SELECT t.user_id, 22.0, 1500, 2000, 100000 + {i}, current_date, now() "
                            "FROM bench_growth_template t ORDER BY t.user_id LIMIT 1"),
                  "read": ("SELECT p.id FROM profile_metrics p JOIN (SELECT user_id FROM bench_growth_template "
                           "ORDER BY user_id DESC LIMIT 1) t ON p.user_id = t.user_id ORDER BY p.computed_at DESC LIMIT 1")}
        stop, worst = threading.Event(), {}

        def probe(name, sql):
            session, i, slowest = self.cluster.session(GROWTH_DB), 0, 0.0
            while not stop.is_set():
                t = time.monotonic()
                session.query(sql.format(i=i))
                slowest = max(slowest, time.monotonic() - t)
                i += 1
                time.sleep(0.01)
            session.close()
            worst[name] = {"slowest_s": slowest, "statements": i}

        threads = [threading.Thread(target=probe, args=item) for item in probes.items()]
        for t in threads:
            t.start()
        time.sleep(1)
        offset = os.path.getsize(server_log)
        t0 = time.monotonic()
        try:
            run([common.METRICSD, "migrate"], env=env, log=log)
        finally:
            seconds = time.monotonic() - t0
            time.sleep(1)
            stop.set()
            for t in threads:
                t.join()
        statements = self.logged_statements(server_log, offset)
        self.cluster.psql(GROWTH_DB, "DELETE FROM profile_metrics WHERE version >= 100000")
        for x in statements:
            say(f"  {x['seconds']:8.3f} s  {x['statement'][:100]}")
        say(f"  migration {seconds:.1f} s; slowest probe: write {worst['write']['slowest_s'] * 1000:.0f} ms, "
            f"read {worst['read']['slowest_s'] * 1000:.0f} ms")
        return {"seconds": seconds, "statements": statements, "probes": worst}

    def logged_statements(self, server_log, offset):
        """The statements the server logged with their durations from `offset` on (a statement's text goes on over
        the lines indented with a tab), named by their first line of code, the migrator's own left out."""
        found = []
        with open(server_log, errors="replace") as f:
            f.seek(offset)
            for line in f:
                m = re.search(r"duration: ([0-9.]+) ms\s+(?:statement|execute [^:]*): (.*)", line)
                if m:
                    found.append({"lines": [m.group(2)], "seconds": float(m.group(1)) / 1000})
                elif line.startswith("\t") and found:
                    found[-1]["lines"].append(line.strip())
        statements = []
        for x in found:
            code = [l.strip() for l in x["lines"] if l.strip() and not l.strip().startswith("--")]
            if code and not code[0].startswith(self.MIGRATOR_STATEMENTS):
                statements.append({"statement": code[0], "text": " ".join(code), "seconds": x["seconds"]})
        return statements

    # What a statement of the migration does: by how it starts, and for a DO block by what it runs.
    STATEMENT_KINDS = (("CREATE INDEX CONCURRENTLY", "", "CREATE INDEX CONCURRENTLY of a partition's part (SHARE UPDATE EXCLUSIVE on it)"),
                       ("ALTER INDEX", "ATTACH PARTITION", "ALTER INDEX … ATTACH PARTITION"),
                       ("ALTER INDEX", "RENAME TO", "ALTER INDEX … RENAME TO (SHARE UPDATE EXCLUSIVE on the index)"),
                       ("DO", "ON ONLY", "CREATE INDEX … ON ONLY profile_metrics (SHARE on the parent)"),
                       ("DO", "DROP INDEX", "DROP INDEX of the ascending one (ACCESS EXCLUSIVE on the table and partitions)"),
                       ("CREATE OR REPLACE FUNCTION metricsd_add_partitions", "", "metricsd_add_partitions replaced"),
                       ("SELECT", "", "a query generating statements"), ("WITH", "", "a query generating statements"))

    def statement_kind(self, statement):
        text = statement["text"]
        return next((label for start, phrase, label in self.STATEMENT_KINDS if text.startswith(start) and phrase in text),
                    " ".join(statement["statement"].split()[:4]))

    def readindex_rows(self, fmt, verdict):
        x = self.results.get("readindex")
        if not x:
            return []
        m = x["migration"]
        rows = [(f"read index migration on {x['users']:,} users × {x['days']} days, metricsd migrate",
                 fmt(m["seconds"], 1), "s", "", "", None)]
        kinds = {}
        for s in m["statements"]:
            k = kinds.setdefault(self.statement_kind(s), [0, 0.0, 0.0])
            k[0] += 1
            k[1] += s["seconds"]
            k[2] = max(k[2], s["seconds"])
        for kind, (count, total, slowest) in kinds.items():
            rows.append((f"  {kind} … ({count}×): total / slowest", f"{fmt(total, 2)} / {fmt(slowest, 3)}", "s",
                         "", "", None))
        for name in ("write", "read"):
            p = m["probes"][name]
            rows.append((f"  slowest {name} of the history meanwhile (a statement every 10 ms, {p['statements']:,} in all)",
                         fmt(p["slowest_s"] * 1000), "ms", "", "", None))

        def read_index(sizes):
            return next(r for r in sizes["relations"] if r["name"] == "profile_metrics_user_computed_at_idx")

        for key, label in (("before", "ascending, grown entry by entry (before)"),
                           ("after", "descending, each part built at once (right after)"),
                           ("grown", "descending, grown entry by entry")):
            r = read_index(x[key])
            rows.append((f"read index {label}: bytes per user-day (leaf fill)",
                         f"{fmt(r['per_user_day'], 1)} ({r['leaf_density']:.0f} %)", "B", "", "", None))
            rows.append((f"  the whole history, heap and indexes", fmt(x[key]["total_per_user_day"], 1), "B", "", "", None))
        return rows
