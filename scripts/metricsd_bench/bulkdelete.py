"""Step bulkdelete: bulk deletes of newest rows and of users, linear or not."""

import re

from .common import DB, die, run, say

class BulkDeleteStep:
    """One statement that deletes many users' rows, as an operator's clean-up or a batch erasure does, at three
    sizes: is its cost per user the same at 200,000 users as at 5,000 (the latest table's trigger looked at every
    pair of rows and grew with the square of the users)?"""

    BULK_SIZES = (5000, 20000, 200000)  # fewer when the seed has fewer users with metrics
    BULK_SHAPES = (
        ("newest", "every user's newest row",
         "DELETE FROM profile_metrics p USING profile_metrics_latest l "
         "WHERE l.user_id <= {bound} AND p.id = l.metrics_id AND p.metrics_date = l.metrics_date"),
        ("all", "every row of the users (left with none)",
         "DELETE FROM profile_metrics WHERE user_id <= {bound}"),
        ("users", "the users themselves (the cascade to their rows)", "DELETE FROM users WHERE id <= {bound}"),
    )

    def bulk_measure(self, statement, trigger=True):
        """Runs `statement` in a transaction that is rolled back (the next one finds the same table, vacuumed of what
        the rolled-back one left): its time as the client sees it, and the part spent in the latest table's delete
        trigger (pg_stat_xact_user_functions); with `trigger` false, with that trigger switched off inside the
        transaction: what the statement costs without the latest table."""
        self.cluster.psql(DB, "VACUUM profile_metrics")
        off = "" if trigger else "ALTER TABLE profile_metrics DISABLE TRIGGER metricsd_latest_deleted;\n"
        script = ("SET track_functions = 'pl';\nBEGIN;\n" + off + "\\timing on\n" + statement + ";\n\\timing off\n"
                  "SELECT 'trigger ' || coalesce(sum(total_time), 0) FROM pg_stat_xact_user_functions "
                  "WHERE funcname = 'metricsd_latest_deleted';\nROLLBACK;\n")
        out = run([self.cluster.psql_bin, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", self.cluster.url(DB)],
                  input_text=script).stdout
        ms = re.search(r"^Time: ([0-9.]+) ms", out, re.M)
        spent = re.search(r"^trigger ([0-9.]+)", out, re.M)
        if not ms or not spent:
            die(f"bulkdelete: unexpected psql output: {out[-500:]}")
        return float(ms.group(1)) / 1000, float(spent.group(1)) / 1000

    def bulkdelete(self):
        with_rows = int(self.cluster.value(DB, "SELECT count(*) FROM profile_metrics_latest"))
        sizes = sorted({min(n, with_rows) for n in self.BULK_SIZES})
        say(f"step bulkdelete: one statement deleting the rows of {', '.join(f'{n:,}' for n in sizes)} users "
            f"({with_rows:,} with metrics), each in a transaction rolled back; the faster of two runs, and once "
            "without the latest table's delete trigger")
        self.cluster.psql(DB, "ANALYZE")
        out = {"sizes": sizes, "with_rows": with_rows}
        for shape, _, template in self.BULK_SHAPES:
            out[shape] = {}
            for n in sizes:
                bound = self.cluster.value(DB, f"SELECT user_id FROM profile_metrics_latest ORDER BY user_id OFFSET {n - 1} LIMIT 1")
                users = int(self.cluster.value(DB, f"SELECT count(*) FROM users WHERE id <= {bound}"))
                rows = n if shape == "newest" else int(
                    self.cluster.value(DB, f"SELECT count(*) FROM profile_metrics WHERE user_id <= {bound}"))
                statement = template.format(bound=bound)
                seconds, trigger = min(self.bulk_measure(statement) for _ in range(2))
                bare, _ = self.bulk_measure(statement, trigger=False)
                out[shape][n] = {"seconds": seconds, "trigger_seconds": trigger, "bare_seconds": bare,
                                 "users": users, "rows": rows}
                say(f"  {shape}, {n:,} users ({rows:,} rows): {seconds:.2f} s, {seconds / users * 1e6:.1f} µs per user "
                    f"(trigger {trigger / users * 1e6:.1f}; without it {bare / users * 1e6:.1f})")
        self.results["bulkdelete"] = out

    def bulkdelete_rows(self, fmt, verdict):
        x = self.results.get("bulkdelete")
        if not x:
            return []
        rows = []
        first, last = x["sizes"][0], x["sizes"][-1]

        def per_user(m, key):
            return m[key] / m["users"] * 1e6

        for shape, label, _ in self.BULK_SHAPES:
            r = x[shape]
            for n in x["sizes"]:
                m = r[n]
                rows.append((f"bulk delete of {label}, {n:,} users ({m['rows']:,} rows), one statement",
                             fmt(m["seconds"], 2), "s", "", "", None))
                rows.append(("  per user: in all / in the latest table's trigger / the statement without that trigger",
                             f"{fmt(per_user(m, 'seconds'), 1)} / {fmt(per_user(m, 'trigger_seconds'), 1)} / "
                             f"{fmt(per_user(m, 'bare_seconds'), 1)}", "µs", "", "", None))
            if last != first:
                a, b = r[first], r[last]
                ratio = per_user(b, "seconds") / per_user(a, "seconds")
                rows.append((f"  per user at {last:,} ÷ per user at {first:,}: the statement", fmt(ratio, 2), "ratio",
                             "≤ 2", verdict(ratio <= 2), None))
                ratio = per_user(b, "trigger_seconds") / max(1e-9, per_user(a, "trigger_seconds"))
                rows.append(("    the latest table's trigger alone", fmt(ratio, 2), "ratio", "≤ 2", verdict(ratio <= 2), None))
                ratio = per_user(b, "bare_seconds") / per_user(a, "bare_seconds")
                rows.append(("    the statement without that trigger", fmt(ratio, 2), "ratio", "", "", None))
        return rows
