"""scripts/bench --growth: the history as it grows, both layouts, under a memory cap."""

import datetime as dt
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from zoneinfo import ZoneInfo

from .common import (BENCH_DIR, CLUSTER_DIR, CpuMeter, Daemon, LATEST_TRIGGER_OFF, LATEST_TRIGGER_ON, LOG_DIR, PG_CLUSTER, ZONES, die, load_mint_token, resident_mb, run, say)
from . import common

GROWTH_DB = "metricsd_bench_growth"
# profile_metrics' tables: its partitions (a build from before them: the one table, a tree of one).
HISTORY_RELS = "relid IN (SELECT relid FROM pg_partition_tree('profile_metrics') WHERE isleaf)"
MONTH_DB = "metricsd_bench_month"
MB = 1024 * 1024
PAGE = 8192


class MemoryCap:
    """A memory cgroup the bench cluster's postgres processes run in: cgroup v1's memory controller
    (memory.limit_in_bytes) or cgroup v2 (memory.max). Its limit caps the server's own memory (shared buffers,
    backends) and the page cache its reads and writes are charged with, so what does not fit is read from disk."""

    def __init__(self, name):
        v1 = "/sys/fs/cgroup/memory"
        if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
            self.version, self.path = 1, os.path.join(v1, name)
        elif os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            self.version, self.path = 2, os.path.join("/sys/fs/cgroup", name)
        else:
            die("no memory cgroup controller (neither /sys/fs/cgroup/memory nor cgroup v2)")
        self.limit = None

    def create(self):
        if os.geteuid() != 0:
            die("--growth caps the server's memory with a cgroup: run it as root")
        if self.version == 2:
            ctl = "/sys/fs/cgroup/cgroup.subtree_control"
            with open(ctl) as f:
                if "memory" not in f.read().split():
                    with open(ctl, "w") as w:
                        w.write("+memory")
        os.makedirs(self.path, exist_ok=True)
        self.set_limit(None)

    def _file(self, name):
        return os.path.join(self.path, name)

    def _write(self, name, value):
        with open(self._file(name), "w") as f:
            f.write(str(value))

    def _read(self, name):
        with open(self._file(name)) as f:
            return f.read()

    def set_limit(self, nbytes):
        if self.version == 1:
            self._write("memory.limit_in_bytes", -1 if nbytes is None else nbytes)
        else:
            self._write("memory.max", "max" if nbytes is None else nbytes)
        self.limit = nbytes

    @property
    def procs(self):
        return self._file("cgroup.procs")

    def pids(self):
        return [int(x) for x in self._read("cgroup.procs").split()]

    def empty(self):
        """Reclaims what is charged to the cgroup (after the server stopped: its page cache)."""
        try:
            if self.version == 1:
                self._write("memory.force_empty", 0)
            else:
                self._write("memory.reclaim", 1 << 40)
        except OSError:
            pass  # v2 answers EAGAIN when it could not reclaim everything; the files' pages are dropped anyway

    def usage(self):
        return int(self._read("memory.usage_in_bytes" if self.version == 1 else "memory.current"))

    def stat(self):
        out = {}
        for line in self._read("memory.stat").splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
        return out

    def describe(self):
        return (f"cgroup {'v1 memory controller' if self.version == 1 else 'v2'} {self.path}, "
                f"{'memory.limit_in_bytes' if self.version == 1 else 'memory.max'}")

    def destroy(self):
        try:
            self.set_limit(None)
            os.rmdir(self.path)
        except OSError:
            pass


def drop_file_cache(directory):
    """Evicts a stopped cluster's files from the page cache (POSIX_FADV_DONTNEED on each file; the clean shutdown
    wrote them out), so the next start reads from disk whatever its memory cap does not hold."""
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


STALL_SECONDS = 0.010  # a gap this long in a spinning thread's clock: every CPU of the machine stopped
QUIET_SECONDS = 5.0     # two and a half periods of the host's free-memory reports without a stall
SETTLE_LIMIT = 180.0


def settle_host():
    """Waits until the machine has run QUIET_SECONDS without a stall of its CPUs (at most SETTLE_LIMIT); returns
    (seconds waited, stalls seen, settled).

    Why: on a virtual machine whose balloon device reports free memory to its host (virtio-balloon free page
    reporting, a batch every 2 s), the host's work on those reports can stop every vCPU at once. A cold start
    frees gigabytes here (the cluster's files dropped from the page cache, its cgroup emptied). On this bench's
    2-CPU VM, after ~4.7 GB were dropped from the page cache, a spinning thread on each CPU saw both stop for
    12-33 ms at the same instants, every 2.1 s, for 8 s (another try saw one such stall); a read measured during
    stalls like these had 1-3 % of its requests wait 20-570 ms. Production servers do not drop their cache before
    serving, so the bench lets those reports pass before it measures; on a machine without them this costs
    QUIET_SECONDS. The host can also take the CPUs later, during a measurement: that shows as steal time, which
    `timed` checks. A spinning thread sees a stall of every CPU as a gap in its own clock (the machine is otherwise
    idle here: the server has just started, nothing runs on it)."""
    t0 = last = quiet_since = time.monotonic()
    stalls = 0
    while True:
        now = time.monotonic()
        if now - last > STALL_SECONDS:
            stalls += 1
            quiet_since = now
        last = now
        if now - quiet_since >= QUIET_SECONDS:
            return now - t0, stalls, True
        if now - t0 >= SETTLE_LIMIT:
            return now - t0, stalls, False


def lsn_bytes(lsn):
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


class LockWaitSampler:
    """The longest any lock request has waited (pg_locks.waitstart), sampled every 20 ms by a thread on one psql
    session from its creation to stop(), and on what: the relation or lock type, the mode, the waiting session's
    application and statement."""

    QUERY = """
        SELECT coalesce(extract(epoch FROM clock_timestamp() - l.waitstart), 0)::float8 || '|' ||
               coalesce(l.relation::regclass::text, l.locktype) || ' ' || l.mode || ' by ' ||
               coalesce(a.application_name, '') || ': ' || left(coalesce(a.query, ''), 60)
        FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE NOT l.granted AND l.waitstart IS NOT NULL
        ORDER BY l.waitstart LIMIT 1"""

    def __init__(self, cluster, db):
        self.waits = {"longest": 0.0, "what": "", "samples": 0}
        self.stopping = threading.Event()
        self.session = cluster.session(db)
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        while not self.stopping.is_set():
            row = self.session.query(self.QUERY)
            self.waits["samples"] += 1
            if row and row[0]:
                seconds, _, what = row[0].partition("|")
                if float(seconds) > self.waits["longest"]:
                    self.waits["longest"], self.waits["what"] = float(seconds), what
            time.sleep(0.02)

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=10)
        self.session.close()
        return self.waits


class Growth:
    """`scripts/bench --growth`: see the header. Uses the Bench's cluster, daemons and timing."""

    def __init__(self, bench):
        self.b = bench
        self.args = bench.args
        self.cluster = bench.cluster
        self.cap = MemoryCap(f"metricsd-bench-{self.args.port}")
        self.users = self.args.users
        self.depths = sorted(self.args.depths)
        self.caps = self.args.cap_mb  # (limit MB, shared_buffers MB), one capped phase each
        self.results = {"depths": {}}
        self.valid = 0
        self.tokens = None
        self.retention_supported = False
        self.partitioned = False  # profile_metrics partitioned by month (set when the growth database is seeded)
        self.ascending_read_index = False  # the readindex step: seed with the read index as before migration 0021
        self.layouts = self.args.layouts
        # Results of the upgrade layout, per depth: before the move (seed, migration, sizes) and after it (the move,
        # sizes). The monthly layout's are in results["depths"].
        self.results["upgrade-before"] = {}
        self.results["upgrade-after"] = {}
        self.prefix = "growth-"  # of the measurements' step names: growth-, growth-upgrade-before-, -after-
        self.settle_seconds = []  # settle_host's wait before each measurement
        self.unsettled = 0

    # -- the server ---------------------------------------------------------------------------------------

    def data_dir(self):
        return os.path.join(CLUSTER_DIR, "data")

    def start(self):
        """Starts the cluster inside the memory cgroup (every postgres process inherits it)."""
        run(["sh", "-c", 'echo $$ > "$0" && exec "$1" start "$2"', self.cap.procs, PG_CLUSTER, CLUSTER_DIR],
            log=os.path.join(LOG_DIR, "pg-cluster.log"))
        pm = self.cluster.postmaster_pid()
        if pm not in self.cap.pids():
            die(f"the postmaster ({pm}) is not in {self.cap.path}")

    @staticmethod
    def shared_buffers_mb(cap):
        return cap[1]

    @staticmethod
    def mode_name(cap):
        """The key of a phase in step names and results: memory, capped192 (MB), capped960sb640."""
        if not cap:
            return "memory"
        return f"capped{cap[0]}" + ("" if cap[1] == default_shared_buffers(cap[0]) else f"sb{cap[1]}")

    @staticmethod
    def mode_label(cap):
        if not cap:
            return "in memory"
        return f"capped {cap[0]} MB" + ("" if cap[1] == default_shared_buffers(cap[0]) else f" (sb {cap[1]})")

    def restart(self, capped, cold, settings=None):
        """Restarts the server: with shared_buffers and the cgroup limit of a cap of `capped` MB (False: the
        cluster's own 256 MB and no limit), and, when `cold`, with its files dropped from the page cache first."""
        conf = {"shared_buffers": f"{self.shared_buffers_mb(capped)}MB" if capped else None}
        conf.update(settings or {})
        for k, v in conf.items():
            if v is None:
                self.cluster.psql("postgres", f"ALTER SYSTEM RESET {k}")
            else:
                self.cluster.psql("postgres", f"ALTER SYSTEM SET {k} = '{v}'")
        self.cluster.stop()
        if cold:
            drop_file_cache(self.data_dir())
            self.cap.empty()
        self.cap.set_limit(capped[0] * MB if capped else None)
        self.start()

    def lift_cap(self):
        """No limit until the next restart (clean-up work between measurements)."""
        self.cap.set_limit(None)

    def psql(self, sql, timeout=7200, db=GROWTH_DB):
        return self.cluster.psql(db, sql, timeout=timeout)

    def value(self, sql, db=GROWTH_DB):
        return self.cluster.value(db, sql)

    # -- seeding ------------------------------------------------------------------------------------------

    def partition_history(self, db, first):
        """When profile_metrics is partitioned by month (migration 0013): its partitions, still empty after the
        migrations, are laid out as a table that has been partitioned all along would have them: one per month
        from `first`'s to two months ahead, before them one for every older date, and the default one. (A build
        from before the partitions keeps one table.)"""
        if self.value("SELECT relkind FROM pg_class WHERE oid = 'profile_metrics'::regclass", db=db) != "p":
            return
        self.partitioned = True
        first = first.replace(day=1)
        name = f"profile_metrics_until_{first.strftime('%Y_%m')}"
        # The read index in the direction the partitioned index has (descending from migration 0021 on), so that
        # the partition's index becomes its part.
        order = self.value("SELECT CASE WHEN indoption[1] & 1 = 1 THEN 'DESC' ELSE 'ASC' END FROM pg_index "
                           "WHERE indexrelid = 'profile_metrics_user_computed_at_idx'::regclass", db=db)
        self.psql(f"""
            BEGIN;
            DO $$
            DECLARE p regclass;
            BEGIN
              FOR p IN SELECT inhrelid::regclass FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = 'profile_metrics'::regclass
                         AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT' LOOP
                EXECUTE format('DROP TABLE %s', p);
              END LOOP;
            END $$;
            CREATE TABLE {name} (LIKE profile_metrics INCLUDING DEFAULTS)
              WITH (autovacuum_vacuum_scale_factor = 0.02);
            ALTER TABLE {name} ADD PRIMARY KEY (id) WITH (fillfactor = 100);
            CREATE UNIQUE INDEX {name}_date_version_user_key ON {name} (metrics_date, version, user_id);
            CREATE INDEX {name}_user_computed_at_idx ON {name} (user_id, computed_at {order});
            ALTER TABLE profile_metrics ATTACH PARTITION {name} FOR VALUES FROM (MINVALUE) TO ('{first.isoformat()}');
            SELECT metricsd_add_partitions((now() + interval '2 months')::date);
            COMMIT;""", db=db)
        leaves = self.value("SELECT count(*) FROM pg_partition_tree('profile_metrics') WHERE isleaf", db=db)
        say(f"  profile_metrics partitioned by month: {leaves} partitions")

    def make_read_index_ascending(self, db):
        """The read index as it was before migration 0021 (ascending, each partition's part named after it), on the
        still empty partitions, and that migration forgotten: the next `metricsd migrate` applies it."""
        self.psql("""
            BEGIN;
            DROP INDEX profile_metrics_user_computed_at_idx;
            CREATE INDEX profile_metrics_user_computed_at_idx ON ONLY profile_metrics (user_id, computed_at);
            DO $$
            DECLARE c record;
            BEGIN
              FOR c IN SELECT i.inhrelid::regclass AS p, k.relname FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
                       WHERE i.inhparent = 'profile_metrics'::regclass LOOP
                EXECUTE format('CREATE INDEX %I ON %s (user_id, computed_at)', c.relname || '_user_computed_at_idx', c.p);
                EXECUTE format('ALTER INDEX profile_metrics_user_computed_at_idx ATTACH PARTITION %I',
                               c.relname || '_user_computed_at_idx');
              END LOOP;
            END $$;
            DELETE FROM metricsd_migrations WHERE name = '0021_read_index_descending.sql';
            COMMIT;""", db=db)

    def seed_people(self, db, users, max_depth, upgrade=False):
        """The users and their settings (the same for every depth), every user in UTC (so one daily unit covers
        all), and two tables the history is generated from: each valid user's values, and each zone's dates.
        `upgrade`: the schema of the release before migration 0017 (migrations up to 0016), whose partitions stay
        as those migrations made them: the history seeded next goes into the old partition. Returns the number of
        valid users."""
        b = self.b
        t0 = time.monotonic()
        b.recreate_database(db, upto="0016" if upgrade else None)
        self.psql("CREATE EXTENSION IF NOT EXISTS pgstattuple; CREATE EXTENSION IF NOT EXISTS pg_prewarm", db=db)
        now = dt.datetime.now(dt.timezone.utc)
        if upgrade:
            self.partitioned = True
        else:
            self.partition_history(db, (now - dt.timedelta(days=max_depth + 3)).date())
            if self.ascending_read_index:
                self.make_read_index_ascending(db)
        users_text, settings_text, valid, bad = self.b.people(users, max_depth, now)
        template = "".join(f"{uid}\t{zone}\t{jitter}\t{bmi}\t{bmr}\t{tdee}\n"
                           for uid, zone, jitter, bmi, bmr, tdee in valid)
        days = []
        for zone, _ in ZONES:
            tz = ZoneInfo(zone)
            d, k = now.astimezone(tz).date(), 0
            while k < max_depth:
                due = dt.datetime(d.year, d.month, d.day, 0, 5, tzinfo=tz).astimezone(dt.timezone.utc)
                if due + dt.timedelta(minutes=11) < now:
                    days.append(f"{zone}\t{k}\t{d.isoformat()}\t{due.strftime('%Y-%m-%d %H:%M:%S')}+00\n")
                    k += 1
                d -= dt.timedelta(days=1)
        script = (
            "SET session_replication_role = replica;\n"  # no triggers: updated_at as seeded, no NOTIFY storm
            "BEGIN;\n"
            "TRUNCATE users, user_settings, profile_metrics, metrics_skips, metrics_acknowledgements CASCADE;\n"
            "COPY users (id, timezone, created_at) FROM STDIN WITH (FREEZE);\n" + users_text + "\\.\n"
            "COPY user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, "
            "onboarding_completed, updated_at) FROM STDIN WITH (FREEZE);\n" + settings_text + "\\.\n"
            "COMMIT;\n"
            f"SELECT setval(pg_get_serial_sequence('users', 'id'), {users});\n"
            "UPDATE users SET timezone = 'UTC' WHERE timezone <> 'UTC';\n"
            "CREATE TABLE bench_growth_template (user_id bigint, zone text, jitter int, bmi numeric(5,1), bmr int,"
            " tdee int);\n"
            "COPY bench_growth_template FROM STDIN;\n" + template + "\\.\n"
            "CREATE INDEX ON bench_growth_template (zone, user_id);\n"
            "CREATE TABLE bench_growth_days (zone text, k int, metrics_date date, due timestamptz);\n"
            "COPY bench_growth_days FROM STDIN;\n" + "".join(days) + "\\.\n"
            "CREATE INDEX ON bench_growth_days (k, due, zone);\n"
            "VACUUM (FREEZE, ANALYZE) users, user_settings, bench_growth_template, bench_growth_days;\n")
        run([self.cluster.psql_bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.cluster.url(db)],
            input_text=script, timeout=3600)
        self.results.setdefault("people", {})[db] = {"users": users, "valid": len(valid),
                                                     "bad": users - len(valid), "bad_kinds": bad,
                                                     "seconds": time.monotonic() - t0}
        say(f"  {users:,} users ({len(valid):,} valid) in {time.monotonic() - t0:.1f} s")
        return len(valid)

    @staticmethod
    def history_query(first_k, last_k):
        """Version-1 rows of every valid user for the dates k days before each zone's newest one, k from last_k
        down to first_k (oldest first), in the order the daily units write them: unit by unit (each zone's local
        date, by the instant its 00:05 fell due), each unit's users by id; computed_at is the due instant plus the
        user's jitter (0-9 minutes)."""
        return f"""COPY (
  SELECT t.user_id, t.bmi, t.bmr, t.tdee, 1, d.metrics_date,
         d.due + make_interval(mins => t.jitter, secs => (t.jitter * 7) % 60)
  FROM (SELECT zone, metrics_date, due FROM bench_growth_days WHERE k BETWEEN {first_k} AND {last_k}
        ORDER BY due, zone) d
  CROSS JOIN LATERAL (SELECT user_id, bmi, bmr, tdee, jitter FROM bench_growth_template x
                      WHERE x.zone = d.zone ORDER BY x.user_id) t
) TO STDOUT"""

    def seed_history(self, depth, previous=0, timeline=None, db=GROWTH_DB, valid=None, newest=0):
        """Grows the history from `previous` to `depth` days per valid user, on a timeline of `timeline` days
        ending today: the table at depth D holds the timeline's oldest D days (in one table dates do not matter to
        what is measured; the order rows arrive in does), or, when the table is partitioned by month, its newest D
        days (see below). The rows are generated by a second backend and piped into
        COPY with the table's indexes in place, so the indexes grow entry by entry in the daily units' order, as
        in production. The first depth goes into the table truncated in the same transaction (COPY FREEZE,
        wal_level = minimal: no WAL, files synced at commit); later depths are appended with full_page_writes
        off and checkpoints held back, then frozen by VACUUM. Shared buffers are 40% of the machine's memory (at
        most 8 GB) meanwhile. `newest`: the k of the newest date seeded (1: the history ends yesterday, so that
        today is the first day after an upgrade's migration)."""
        valid = valid or self.valid
        timeline = timeline or self.depths[-1]
        say(f"growth: {depth} days of history for {valid:,} users (adding {depth - previous} days)")
        t0 = time.monotonic()
        url = self.cluster.url(db)
        columns = "profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)"
        # COPY FREEZE is refused on a partitioned table: its rows are frozen by VACUUM afterwards.
        partitioned = self.value("SELECT relkind FROM pg_class WHERE oid = 'profile_metrics'::regclass", db=db) == "p"
        if partitioned:
            # Partitioned by month, the dates decide where rows go: the table at depth D holds the newest D days
            # (the current month's partition as full as in production at any depth), and a deeper depth adds the
            # older days, which go into older partitions (each partition still filled day by day).
            first_k, last_k, newest_k = previous + newest, depth - 1 + newest, newest
        else:
            first_k, last_k = timeline - depth, timeline - previous - 1
            newest_k = first_k
        # Shared buffers big enough to hold the indexes the seed adds to: every day's rows touch a leaf of each
        # user-leading index per user, and with the cluster's 256 MB those pages would be written out and read
        # back for every day (the seed then waits on the disk, not the CPU).
        with open("/proc/meminfo") as f:
            total_mb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) // 1024
        big = {"shared_buffers": f"{min(8192, total_mb * 2 // 5)}MB"}
        if previous == 0:
            self.restart(capped=False, cold=False,
                         settings={"wal_level": "minimal", "max_wal_senders": "0", **big})
            load_cmds = ["-c", "BEGIN", "-c", "TRUNCATE profile_metrics", "-c", LATEST_TRIGGER_OFF,
                         "-c", f"\\copy {columns} FROM pstdin" + ("" if partitioned else " WITH (FREEZE)"),
                         "-c", LATEST_TRIGGER_ON, "-c", "COMMIT"]
        else:
            self.restart(capped=False, cold=False, settings={
                "full_page_writes": "off", "max_wal_size": "64GB", "checkpoint_timeout": "1h", **big})
            load_cmds = ["-c", "BEGIN", "-c", LATEST_TRIGGER_OFF, "-c", f"\\copy {columns} FROM pstdin",
                         "-c", LATEST_TRIGGER_ON, "-c", "COMMIT"]
        gen = subprocess.Popen([self.cluster.psql_bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url,
                                "-c", "SET work_mem = '64MB'", "-c", self.history_query(first_k, last_k)],
                               stdout=subprocess.PIPE, stderr=open(os.path.join(LOG_DIR, "growth-seed-gen.log"), "w"))
        self.b.children.add(gen)
        load_log = os.path.join(LOG_DIR, "growth-seed-load.log")
        with open(load_log, "w") as log:
            load = subprocess.run([self.cluster.psql_bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url] + load_cmds,
                                  stdin=gen.stdout, stdout=log, stderr=subprocess.STDOUT)
        gen.stdout.close()
        gen.wait()
        self.b.children.discard(gen)
        if gen.returncode != 0 or load.returncode != 0:
            die(f"seeding {depth} days failed; see {load_log} and growth-seed-gen.log")
        t_copy = time.monotonic() - t0
        if previous or partitioned:
            self.psql("VACUUM (FREEZE) profile_metrics", db=db)
        self.psql("CHECKPOINT", db=db)
        self.psql(f"""
            TRUNCATE metrics_acknowledgements, metrics_skips, daily_units, recompute_jobs, work_chunks CASCADE;
            INSERT INTO metrics_acknowledgements (user_id, version, metrics_computed_at, acknowledged_at)
            SELECT t.user_id, 1, c.at, least(now(), c.at + interval '2 hours')
            FROM bench_growth_template t JOIN bench_growth_days d ON d.zone = t.zone AND d.k = {newest_k}
            CROSS JOIN LATERAL (SELECT d.due + make_interval(mins => t.jitter, secs => (t.jitter * 7) % 60) AS at) c
            WHERE t.user_id % 2 = 0""", db=db)
        self.restart(capped=False, cold=False, settings={
            "wal_level": None, "max_wal_senders": None, "full_page_writes": None, "max_wal_size": None,
            "checkpoint_timeout": None})
        self.psql("ANALYZE profile_metrics; ANALYZE metrics_acknowledgements", db=db)
        self.psql("CHECKPOINT", db=db)
        rows = valid * (depth - previous)
        seconds = time.monotonic() - t0
        say(f"  {rows:,} rows in {seconds:.0f} s (COPY {t_copy:.0f} s) = {rows / t_copy:,.0f} rows/s")
        return {"rows": rows, "seconds": seconds, "copy_seconds": t_copy}

    # -- what the table holds -----------------------------------------------------------------------------

    def sizes(self, depth):
        """Bytes on disk per user-day of the heap and of each index; each index's leaf pages, fill and entries
        per leaf (pgstatindex)."""
        # The rows the table holds (an upgrade layout's table after retention ran before its move holds fewer).
        rows = int(self.value("SELECT count(*) FROM profile_metrics")) or self.valid * depth
        out = {"rows": rows, "relations": []}
        # A relation of the history and what it sums: profile_metrics (its partitions' heaps, or its own), its toast,
        # and each index (a partitioned index: its partitions'; an index each partition has of its own, like the
        # key on id of a partitioned table: all of them under one name).
        for line in self.psql("""
                WITH leaves AS (SELECT relid FROM pg_partition_tree('profile_metrics') WHERE isleaf),
                rels AS (
                  SELECT 'profile_metrics' AS name, 'r' AS kind, l.relid AS oid FROM leaves l
                  UNION ALL
                  SELECT 'profile_metrics toast', 't', c.reltoastrelid FROM leaves l JOIN pg_class c ON c.oid = l.relid
                  WHERE c.reltoastrelid <> 0
                  UNION ALL
                  SELECT coalesce(pg_partition_root(i.indexrelid)::text,
                                  CASE WHEN i.indisprimary THEN 'profile_metrics_pkey' ELSE i.indexrelid::regclass::text END),
                         'i', i.indexrelid
                  FROM leaves l JOIN pg_index i ON i.indrelid = l.relid
                )
                SELECT name, kind, sum(pg_relation_size(oid, 'main')),
                       sum(pg_relation_size(oid, 'fsm') + pg_relation_size(oid, 'vm')),
                       min(coalesce(pg_get_indexdef(oid), '')), string_agg(oid::regclass::text, ' ')
                FROM rels GROUP BY name, kind
                ORDER BY kind DESC, name""").splitlines():
            name, kind, main, maps, definition, members = line.split("|", 5)
            rel = {"name": name, "kind": "heap" if kind in ("r", "t") else "index", "bytes": int(main),
                   "map_bytes": int(maps), "definition": definition, "per_user_day": (int(main) + int(maps)) / rows}
            if kind == "i":
                leaf, weighted, level = 0, 0.0, 0
                for member in members.split():
                    l, density, lv = self.psql(
                        f"SELECT leaf_pages, avg_leaf_density, tree_level FROM pgstatindex('{member}')").split("|")
                    leaf += int(l)
                    weighted += int(l) * (0.0 if density == "NaN" else float(density))
                    level = max(level, int(lv))
                rel.update({"leaf_pages": leaf, "leaf_density": weighted / max(1, leaf), "levels": level + 1,
                            "entries_per_leaf": rows / max(1, leaf), "partitions": len(members.split())})
            elif kind == "r":
                rel["rows_per_page"] = rows / max(1, int(main) // PAGE)
            out["relations"].append(rel)
        out["total_per_user_day"] = sum(r["per_user_day"] for r in out["relations"])
        # The latest read's own table (each user's newest row, with its key): bytes per user, not per user-day.
        latest = self.value("SELECT CASE WHEN to_regclass('profile_metrics_latest') IS NOT NULL "
                            "THEN pg_total_relation_size('profile_metrics_latest') END")
        if latest:
            out["latest_per_user"] = int(latest) / self.valid
        return out

    # -- measurements -------------------------------------------------------------------------------------

    def ensure_tokens(self):
        """A token for every valid user (at most 200,000): the reads are spread over all users, so the read's
        working set is the whole table's, not a few thousand users'."""
        if self.tokens:
            return self.tokens
        mint = load_mint_token()
        with open(self.b.secret_file, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
        ids = self.psql("SELECT user_id FROM bench_growth_template ORDER BY random() LIMIT 200000").split()
        now = int(time.time())
        path = os.path.join(BENCH_DIR, "growth-tokens.txt")
        with open(path, "w") as f:
            for uid in ids:
                f.write(mint.mint(secret, {"sub": uid, "iat": now, "exp": now + 86400 * 2}) + "\n")
        self.tokens = (path, self.b.wrk_lua(path))
        return self.tokens

    def prewarm(self):
        self.psql("""WITH t AS (SELECT relid FROM pg_partition_tree('profile_metrics') WHERE isleaf
                               UNION ALL SELECT unnest(ARRAY['users'::regclass, 'user_settings'::regclass,
                                                             'metrics_acknowledgements'::regclass]))
                     SELECT sum(pg_prewarm(c.oid, 'read')) FROM pg_class c
                     WHERE c.oid IN (SELECT relid FROM t)
                        OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT relid FROM t))""")

    def prepare(self, capped):
        def prepare(k):
            if capped:
                self.restart(capped=capped, cold=True)
            elif k == 0:
                self.restart(capped=False, cold=False)
                self.prewarm()
            self.settle()
        return prepare

    def settle(self):
        """Waits out the host's stalls after memory was freed (settle_host); says so when there were any."""
        seconds, stalls, settled = settle_host()
        self.settle_seconds.append(seconds)
        if not settled:
            say(f"  warning: the machine still stalled after {seconds:.0f} s ({stalls} stalls of every CPU of "
                f"≥ {STALL_SECONDS * 1000:.0f} ms); measuring anyway")
            self.unsettled += 1
        elif stalls:
            say(f"  waited {seconds:.0f} s for the host: {stalls} stalls of every CPU of ≥ "
                f"{STALL_SECONDS * 1000:.0f} ms after memory was freed (free-memory reports to a VM's host)")

    def prepare_warm(self, capped):
        """A cold start under the cap, then every valid user's latest row read once (one statement, the read's
        probe per user: of profile_metrics_latest where the schema has it, else of the history's read index): the
        pages the app's reads keep in the cache, where the cap can hold them."""
        def prepare(k):
            self.restart(capped=capped, cold=True)
            if self.value("SELECT to_regclass('profile_metrics_latest') IS NOT NULL") == "t":
                self.psql("""SELECT count(*) FROM bench_growth_template t
                             JOIN profile_metrics_latest l ON l.user_id = t.user_id""")
            else:
                self.psql("""SELECT count(*) FROM bench_growth_template t
                             CROSS JOIN LATERAL (SELECT bmi FROM profile_metrics p WHERE p.user_id = t.user_id
                                                 ORDER BY p.computed_at DESC LIMIT 1) x""")
            self.settle()
        return prepare

    def read(self, step, capped, env=None, path=None, lua_name=None):
        """The latest read (or GET `path`, e.g. the history read) under wrk -t2 -c32 (3 s warm-up, then --duration
        s), tokens of every user."""
        tokens, lua = self.ensure_tokens()
        if path:
            lua = self.b.wrk_lua(tokens, name=lua_name, path=path)
        self.b.mark_daily_done(GROWTH_DB, 1)  # the daemon's scheduler stays idle: nothing writes while it reads

        def attempt(k, meter):
            daemon = Daemon(self.b, f"{step}-{k + 1}", env)
            try:
                url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
                wrk = ["wrk", "-t2", "-c32", "--latency", "-s", lua]
                run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))
                meter.start()
                p = run(wrk + [f"-d{self.args.duration}s", url])
                cpu = meter.stop()
                with open(os.path.join(LOG_DIR, "wrk.log"), "a") as f:
                    f.write(f"[{step}]\n" + p.stdout + p.stderr)
                result = self.b.parse_wrk(p.stdout)
                if result["rps"] is None:
                    die(f"cannot read wrk's output: {p.stdout[-800:]}")
                result["cgroup_bytes"] = self.cap.usage()
                result["_cpu"] = cpu
                return result
            finally:
                daemon.stop()

        return self.b.timed(step, attempt, lambda r: f"{r['rps']:,.0f} req/s, p99 {r['p99_ms']:.2f} ms, "
                                                     f"non-2xx {r['non2xx']}, socket errors {r['socket_errors']}",
                            prepare=self.prepare(capped), attempts=self.args.growth_attempts)

    def history(self, depth, capped):
        """The history read beside the latest read just measured (same depth, same memory): GET
        /v1/profile/metrics/history with its default range (the last 90 days) and with a 730-day range (every
        entry on one page: from = today − 729, limit=731; every user is in UTC), each as the latest read is
        measured; req/s, p99 and the ratio of req/s to the latest read's. Then a 730-day JSON export."""
        mode = self.mode_name(capped)
        latest = self.b.results.get(f"{self.prefix}{depth}-{mode}-read")
        today = dt.datetime.now(dt.timezone.utc).date()
        for span, path in ((90, "/v1/profile/metrics/history"),
                           (730, f"/v1/profile/metrics/history?from={today - dt.timedelta(days=729)}&limit=731")):
            say(f"growth: {depth} days{self.phase_label()}, {self.mode_label(capped)}: history read, {span}-day range")
            r = self.read(f"{self.prefix}{depth}-{mode}-history{span}", capped, path=path, lua_name=f"history{span}.lua")
            if latest and latest.get("rps"):
                r["ratio"] = r["rps"] / latest["rps"]
                say(f"  {r['ratio']:.2f} x the latest read's req/s ({latest['rps']:,.0f})")
        say(f"growth: {depth} days{self.phase_label()}, {self.mode_label(capped)}: a JSON export of every row")
        self.export(f"{self.prefix}{depth}-{mode}-export", capped)

    def export(self, step, capped):
        """GET /v1/profile/metrics/export (JSON) of one user with the whole history, read as fast as it comes, on a
        daemon that served one history read before: its time, bytes and rows, and the daemon's RSS (VmRSS, sampled
        every 5 ms) at its highest during the export less before it."""
        tokens, _ = self.ensure_tokens()
        with open(tokens) as f:
            token = f.readline().strip()
        headers = {"Authorization": f"Bearer {token}"}

        def attempt(k, meter):
            daemon = Daemon(self.b, f"{step}-{k + 1}")
            try:
                base = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics"
                with urllib.request.urlopen(urllib.request.Request(f"{base}/history", headers=headers), timeout=30) as r:
                    r.read()
                rss0 = resident_mb(daemon.proc.pid)
                peak, done = [rss0], threading.Event()

                def sample():
                    while not done.is_set():
                        peak[0] = max(peak[0], resident_mb(daemon.proc.pid))
                        time.sleep(0.005)
                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                meter.start()
                t0 = time.monotonic()
                parts = []
                with urllib.request.urlopen(urllib.request.Request(f"{base}/export", headers=headers), timeout=300) as r:
                    status = r.status
                    while True:
                        chunk = r.read(65536)
                        if not chunk:
                            break
                        parts.append(chunk)
                seconds = time.monotonic() - t0
                cpu = meter.stop()
                done.set()
                sampler.join()
                body = b"".join(parts)
                rows = len(json.loads(body)["data"]["metrics"])
                return {"status": status, "seconds": seconds, "bytes": len(body), "rows": rows, "rss_before_mb": rss0,
                        "rss_growth_mb": peak[0] - rss0, "_cpu": cpu}
            finally:
                daemon.stop()

        return self.b.timed(step, attempt, lambda r: f"{r['rows']:,} rows, {r['bytes'] / 1e6:.2f} MB in "
                                                     f"{r['seconds']:.2f} s, RSS +{r['rss_growth_mb']:.1f} MB "
                                                     f"(from {r['rss_before_mb']:.1f} MB)",
                            prepare=self.prepare(capped), attempts=self.args.growth_attempts)

    def clean_version(self, version):
        """Removes a measurement's rows and work (with the cap lifted: the next measurement restarts cold), then
        vacuums and analyzes every table the measurement and the removal changed. Otherwise autovacuum would do it
        during a later measurement: the current month's partition (a month of rows) crosses its thresholds after
        one or two measurements, and its vacuum or analyze then reads it from disk under the cap beside the reads
        being measured."""
        self.lift_cap()
        self.psql(f"""
            DELETE FROM profile_metrics WHERE version = {version};
            DELETE FROM work_chunks WHERE version = {version};
            DELETE FROM daily_units WHERE version = {version};
            DELETE FROM recompute_jobs WHERE version = {version};
            TRUNCATE metrics_skips""")
        time.sleep(1)  # the statistics of the removal's session reach the shared counters
        changed = self.psql("""SELECT relid::regclass FROM pg_stat_user_tables
                               WHERE n_mod_since_analyze > 0 OR n_dead_tup > 0 OR n_ins_since_vacuum > 0""").split()
        for rel in changed:
            self.psql(f"VACUUM (ANALYZE) {rel}")
        self.psql("CHECKPOINT")

    def daily(self, step, capped, warm=False):
        """One daily unit of every user (all in UTC, METRICSD_DAILY_AT = the current minute, a fresh formula
        version): users/s from the unit's creation to its end, and the WAL it wrote per user. `warm`: after
        every user's latest row was read once under the cap (prepare_warm), not from a cold start."""

        def attempt(k, meter):
            version = 902 + 10 * k
            self.b.mark_daily_done(GROWTH_DB, 1)
            lsn0 = self.value("SELECT pg_current_wal_lsn()")
            daily_at = self.value("SELECT to_char(now() AT TIME ZONE 'UTC', 'HH24:MI')")
            meter.start()
            daemon = Daemon(self.b, f"{step}-{k + 1}",
                            {"METRICSD_TEST_FORMULA_VERSION": str(version), "METRICSD_DAILY_AT": daily_at})
            poll = self.cluster.session(GROWTH_DB)
            try:
                def finished():
                    states = poll.query(f"SELECT state FROM daily_units WHERE version = {version}")
                    return bool(states) and all(s in ("done", "superseded") for s in states) or None
                self.b.wait_for_progress(finished, daemon, poll, f"""
                    SELECT coalesce(sum(users_done + users_skipped), 0) FROM work_chunks
                    WHERE kind = 'daily' AND version = {version}""", "the daily unit")
                cpu = meter.stop()
                lsn1 = poll.query("SELECT pg_current_wal_lsn()")[0]
            finally:
                poll.close()
                daemon.stop()
            row = self.psql(f"""
                SELECT d.users_total, extract(epoch FROM d.finished_at - d.created_at), d.state
                FROM daily_units d WHERE d.version = {version}""").split("|")
            total, seconds, state = int(row[0]), float(row[1]), row[2]
            if state != "done":
                die(f"the daily unit ended {state}")
            wal = lsn_bytes(lsn1) - lsn_bytes(lsn0)
            self.clean_version(version)
            return {"users": total, "seconds": seconds, "users_per_s": total / seconds, "wal_bytes": wal,
                    "wal_per_user": wal / total, "_cpu": cpu}

        return self.b.timed(step, attempt, lambda r: f"{r['users']:,} users in {r['seconds']:.2f} s = "
                                                     f"{r['users_per_s']:,.0f} users/s, WAL "
                                                     f"{r['wal_per_user']:,.0f} bytes/user",
                            prepare=self.prepare_warm(capped) if warm else self.prepare(capped),
                            attempts=self.args.growth_attempts)

    def recompute(self, step, capped):
        """recompute-all of a fresh formula version, timed by `metricsd recompute-all --wait`; WAL per user."""

        def attempt(k, meter):
            version = 901 + 10 * k
            lsn0 = self.value("SELECT pg_current_wal_lsn()")
            result = self.b.recompute_once(GROWTH_DB, version, f"{step}-{k + 1}", meter, compare=False,
                                           prepared=True)
            lsn1 = self.value("SELECT pg_current_wal_lsn()")
            result["wal_per_user"] = (lsn_bytes(lsn1) - lsn_bytes(lsn0)) / max(1, result["done"])
            self.clean_version(version)
            return result

        return self.b.timed(step, attempt, lambda r: f"{r['done'] + r['skipped']:,} users in "
                                                     f"{r['cli_seconds']:.2f} s = {r['users_per_s_cli']:,.0f} "
                                                     f"users/s, WAL {r['wal_per_user']:,.0f} bytes/user",
                            prepare=self.prepare(capped), attempts=self.args.growth_attempts)

    # -- retention ----------------------------------------------------------------------------------------

    def detect_retention(self):
        p = run([common.METRICSD, "help"], check=False)
        self.retention_supported = "METRICSD_RETENTION_DAYS" in (p.stdout + p.stderr)

    def retention(self, depth):
        """METRICSD_RETENTION_DAYS=--retention-days on the deepest table while wrk reads, under the first cap (in
        memory without --cap-mb), from a fresh full pass (earlier runs forgotten): rows removed per second over
        --retention-seconds, the read's p99 beside the read without removal at the same memory, failed requests."""
        days = self.args.retention_days
        step = f"{self.prefix}{depth}-retention"
        capped = self.caps[0] if self.caps else False
        say(f"growth: retention of {days} days on the {depth}-day table{self.phase_label()}, "
            f"{self.mode_label(capped)}, with the latest read under load")
        tokens, lua = self.ensure_tokens()
        self.psql("DELETE FROM work_chunks WHERE kind = 'retention'; DELETE FROM retention_runs")
        if capped:
            self.restart(capped=capped, cold=True)
        else:
            self.restart(capped=False, cold=False)
            self.prewarm()
        self.settle()
        self.b.mark_daily_done(GROWTH_DB, 1)
        before = int(self.value(f"SELECT sum(n_tup_del) FROM pg_stat_user_tables WHERE {HISTORY_RELS}"))
        meter = CpuMeter(self.cluster.postmaster_pid())
        daemon = Daemon(self.b, step, {"METRICSD_RETENTION_DAYS": str(days)})
        try:
            url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
            meter.start()
            t0 = time.monotonic()
            p = run(["wrk", "-t2", "-c32", "--latency", "-s", lua, f"-d{self.args.retention_seconds}s", url])
            seconds = time.monotonic() - t0
            cpu = meter.stop()
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10).read().decode()
        finally:
            daemon.stop()
        with open(os.path.join(LOG_DIR, "wrk.log"), "a") as f:
            f.write(f"[{step}]\n" + p.stdout + p.stderr)
        time.sleep(1)  # the statistics collector's last report
        removed = int(self.value(f"SELECT sum(n_tup_del) FROM pg_stat_user_tables WHERE {HISTORY_RELS}")) \
            - before
        read = self.b.parse_wrk(p.stdout)
        m = re.search(r"^metricsd_retention_rows_removed_total\s+(\S+)", metrics, re.M)
        result = {"days": days, "seconds": seconds, "rows_removed": removed, "rows_per_s": removed / seconds,
                  "daemon_rows_removed": float(m.group(1)) if m else None, "read": read,
                  "mode": self.mode_name(capped)}
        self.b.results[step], self.b.cpu[step] = result, cpu
        say(f"  {removed:,} rows removed in {seconds:.0f} s = {removed / seconds:,.0f} rows/s; read "
            f"{read['rps']:,.0f} req/s, p99 {read['p99_ms']:.2f} ms, non-2xx {read['non2xx']}, "
            f"socket errors {read['socket_errors']}")
        return result

    def month(self):
        """A simulated month after retention: a separate database of --month-users users with retention + 30
        days of history, laid out as in the growth seed; each simulated day j inserts one more day of rows (the
        newest day's, moved j days ahead, in the same order) and runs the daemon with METRICSD_RETENTION_DAYS =
        retention - j (the cutoff day j brings) until its retention work is done, then waits for autovacuum
        (naptime 1 s here) to finish what it started. Prints table size and dead rows per day."""
        days = self.args.retention_days
        users = self.args.month_users
        say(f"growth: a simulated month of {self.args.month_days} days, {users:,} users, retention {days} days")
        self.restart(capped=False, cold=False)
        valid = self.seed_people(MONTH_DB, users, days + 30)
        self.seed_history(days + 30, timeline=days + 30, db=MONTH_DB, valid=valid)
        # One statement per psql -c: several would run as one transaction, where ALTER SYSTEM is refused.
        self.cluster.psql("postgres", "ALTER SYSTEM SET autovacuum_naptime = '1s'")
        self.cluster.psql("postgres", "SELECT pg_reload_conf()")
        b, db = self.b, MONTH_DB
        b.mark_daily_done(db, 1)
        series = []

        def wait_for_vacuum():
            time.sleep(self.args.month_pause)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and self.value(
                    f"SELECT count(*) FROM pg_stat_progress_vacuum WHERE {HISTORY_RELS}",
                    db=db) != "0":
                time.sleep(0.5)

        def snapshot(day, seconds):
            row = self.psql(f"""
                SELECT sum(pg_relation_size(relid)), sum(pg_indexes_size(relid)),
                       sum(n_live_tup), sum(n_dead_tup), sum(autovacuum_count + vacuum_count)
                FROM pg_stat_user_tables WHERE {HISTORY_RELS}""", db=db).split("|")
            x = {"day": day, "heap": int(row[0]), "indexes": int(row[1]), "live": int(row[2]), "dead": int(row[3]),
                 "vacuums": int(row[4]), "retention_seconds": seconds}
            series.append(x)
            say(f"  day {day:>3}: heap {x['heap'] / MB:,.1f} MB, indexes {x['indexes'] / MB:,.1f} MB, live "
                f"{x['live']:,}, dead {x['dead']:,}, vacuums {x['vacuums']}, retention took {seconds:.1f} s")

        try:
            for j in range(0, self.args.month_days + 1):
                if j > 0:
                    self.psql(f"""
                        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                        SELECT p.user_id, p.bmi, p.bmr, p.tdee, p.version, p.metrics_date + {j},
                               p.computed_at + interval '{j} days'
                        FROM profile_metrics p
                        WHERE p.computed_at > now() - interval '1 day' AND p.computed_at <= now()
                        ORDER BY p.computed_at, p.user_id""", db=db)
                t0 = time.monotonic()
                daemon = Daemon(b, f"month-{j}", {"METRICSD_RETENTION_DAYS": str(days - j),
                                                  "DATABASE_URL": self.cluster.url(db)})
                try:
                    deadline = time.monotonic() + 1800
                    while time.monotonic() < deadline:
                        left, runs = self.psql("""
                            SELECT count(*) FILTER (WHERE state IN ('pending', 'running')), count(*)
                            FROM retention_runs""", db=db).split("|")
                        if left == "0" and int(runs) > j:
                            break
                        time.sleep(0.25)
                    else:
                        die("retention did not finish within 30 minutes in the simulated month")
                finally:
                    daemon.stop()
                seconds = time.monotonic() - t0
                wait_for_vacuum()
                snapshot(j, seconds)
        finally:
            self.cluster.psql("postgres", "ALTER SYSTEM RESET autovacuum_naptime")
            self.cluster.psql("postgres", "SELECT pg_reload_conf()")
        self.b.results["growth-month"] = {"users": users, "retention_days": days, "series": series}
        return series

    # -- the run ------------------------------------------------------------------------------------------

    def run(self):
        args = self.args
        self.cap.create()
        say(f"growth: {self.users:,} users, depths {', '.join(map(str, self.depths))} days, layouts "
            f"{', '.join(self.layouts)}; capped phases: "
            + ", ".join(f"{cap[0]} MB (shared_buffers {cap[1]} MB)" for cap in self.caps)
            + f" ({self.cap.describe()}); otherwise shared_buffers 256 MB and no limit")
        self.cluster.stop()
        self.start()
        self.detect_retention()
        if args.month_only:
            if not self.retention_supported or not args.retention_days or not args.month_days:
                die("--month-only needs a binary with retention, --retention-days N and --month-days N")
            self.month()
            self.restart(capped=False, cold=False)
            return
        if "monthly" in self.layouts:
            self.run_monthly()
        if "upgrade" in self.layouts:
            self.run_upgrade()
        if self.retention_supported and args.retention_days and args.month_days:
            self.month()
        self.restart(capped=False, cold=False)

    def phase_label(self):
        return {"growth-upgrade-before-": " (upgrade layout, before the move)",
                "growth-upgrade-after-": " (upgrade layout, after the move)"}.get(self.prefix, "")

    def measure(self, depth):
        """The read, the daily unit, recompute-all in memory and under each cap (and the daily unit after reads,
        capped), under the step names of the current layout and phase (self.prefix)."""
        measures = self.args.growth_measures
        for capped in [False] + self.caps:
            mode, label = self.mode_name(capped), f"{depth} days{self.phase_label()}, {self.mode_label(capped)}"
            say(f"growth: {label}: latest read")
            self.read(f"{self.prefix}{depth}-{mode}-read", capped)
            if "history" in measures and self.prefix == "growth-":
                self.history(depth, capped)
            if "daily" in measures:
                say(f"growth: {label}: daily unit")
                self.daily(f"{self.prefix}{depth}-{mode}-daily", capped)
            if "recompute" in measures:
                say(f"growth: {label}: recompute-all")
                self.recompute(f"{self.prefix}{depth}-{mode}-recompute", capped)
            if capped and "daily" in measures:
                say(f"growth: {label}: daily unit after every user's latest row was read once")
                self.daily(f"{self.prefix}{depth}-{mode}-dailywarm", capped, warm=True)

    def run_monthly(self):
        """The monthly layout: a partition per month from the start (a fresh install), each depth grown from the
        one before."""
        args = self.args
        self.prefix = "growth-"
        self.valid = self.seed_people(GROWTH_DB, self.users, self.depths[-1])
        previous = 0
        for depth in self.depths:
            r = {"seed": self.seed_history(depth, previous)}
            previous = depth
            r["sizes"] = self.sizes(depth)
            say(f"  {r['sizes']['total_per_user_day']:.1f} bytes per user-day: " + ", ".join(
                f"{x['name']} {x['per_user_day']:.1f}" for x in r["sizes"]["relations"]))
            self.results["depths"][depth] = r
            self.measure(depth)
            if depth == self.depths[-1] and self.retention_supported and args.retention_days:
                self.retention(depth)

    def run_upgrade(self):
        """The upgrade layout, each depth from scratch: the schema of the release before migration 0017, its
        history (ending yesterday) seeded into the old partition, then `metricsd migrate`; measured from the first
        day after migrating, before the move (every daemon with METRICSD_HISTORY_MOVE=off), then the move, then
        the same after it. On the deepest table, retention before and after the move."""
        args = self.args
        for depth in self.depths:
            say(f"growth: upgrade layout, {depth} days: the release before, its history, then metricsd migrate")
            self.prefix = "growth-upgrade-before-"
            self.valid = self.seed_people(GROWTH_DB, self.users, depth + 1, upgrade=True)
            r = {"seed": self.seed_history(depth, 0, newest=1)}
            t0 = time.monotonic()
            run([common.METRICSD, "migrate"], env=self.b.daemon_env(0, GROWTH_DB), log=os.path.join(LOG_DIR, "migrate.log"))
            r["migrate_seconds"] = time.monotonic() - t0
            self.psql("ANALYZE profile_metrics")
            self.psql("CHECKPOINT")
            r["old_partition"] = self.value("SELECT source FROM history_move")
            r["sizes"] = self.sizes(depth)
            say(f"  migrated in {r['migrate_seconds']:.1f} s; the old partition: {r['old_partition']}")
            self.results["upgrade-before"][depth] = r
            self.b.phase_env = {"METRICSD_HISTORY_MOVE": "off"}
            try:
                self.measure(depth)
                if depth == self.depths[-1] and self.retention_supported and args.retention_days:
                    self.retention(depth)
            finally:
                self.b.phase_env = {}
            after = {"move": self.move(depth)}
            self.prefix = "growth-upgrade-after-"
            after["sizes"] = self.sizes(depth)
            self.results["upgrade-after"][depth] = after
            self.measure(depth)
            if depth == self.depths[-1] and self.retention_supported and args.retention_days:
                self.retention(depth)

    def move(self, depth):
        """The upgrade layout's move into monthly partitions: one daemon at its defaults (the move on), under the
        first cap (in memory without --cap-mb), while wrk reads; from its start until history_move says done. Its
        time, rows and rows/s; how long the swap held its locks (history_move.swap_lock_ms); the longest any session
        of the database waited for a lock meanwhile (pg_locks.waitstart, sampled every 20 ms) and on what; the
        read's req/s, p99 and failures during the move."""
        step = f"growth-upgrade-{depth}-move"
        capped = self.caps[0] if self.caps else False
        say(f"growth: upgrade layout, {depth} days: the move into monthly partitions, "
            f"{self.mode_label(capped)}, with the latest read under load")
        tokens, lua = self.ensure_tokens()
        self.restart(capped=capped, cold=True)
        self.settle()
        self.b.mark_daily_done(GROWTH_DB, 1)
        sampler = LockWaitSampler(self.cluster, GROWTH_DB)
        meter = CpuMeter(self.cluster.postmaster_pid())
        t0 = time.monotonic()
        daemon = Daemon(self.b, step)
        try:
            url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
            meter.start()
            wrk = subprocess.Popen(["wrk", "-t2", "-c32", "--latency", "-s", lua, "-d3600s", url],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.b.children.add(wrk)
            deadline = time.monotonic() + 4 * 3600
            while self.value("SELECT state FROM history_move") != "done":
                if time.monotonic() > deadline or daemon.proc.poll() is not None or wrk.poll() is not None:
                    wrk.kill()
                    die("the history move did not finish (see the daemon's log)")
                time.sleep(0.5)
            seconds = time.monotonic() - t0
            wrk.send_signal(signal.SIGINT)
            out, _ = wrk.communicate(timeout=60)
            self.b.children.discard(wrk)
            cpu = meter.stop()
        finally:
            waits = sampler.stop()
            daemon.stop()
        with open(os.path.join(LOG_DIR, "wrk.log"), "a") as f:
            f.write(f"[{step}]\n" + out)
        read = self.b.parse_wrk(out)
        rows, months, lock_ms = self.psql("""
            SELECT sum(m.rows_copied), count(*), max(h.swap_lock_ms) FROM history_move h, history_move_months m""").split("|")
        result = {"seconds": seconds, "rows": int(rows), "rows_per_s": int(rows) / seconds, "months": int(months),
                  "swap_lock_ms": float(lock_ms), "longest_lock_wait_s": waits["longest"],
                  "longest_lock_wait": waits["what"], "lock_samples": waits["samples"], "read": read,
                  "mode": self.mode_name(capped), "label": self.mode_label(capped)}
        self.b.results[step], self.b.cpu[step] = result, cpu
        say(f"  {int(rows):,} rows in {int(months)} months moved in {seconds:.0f} s = {result['rows_per_s']:,.0f} rows/s; "
            f"the swap held its locks {float(lock_ms):.0f} ms; longest lock wait {waits['longest'] * 1000:.0f} ms "
            f"({waits['what'] or 'none'}); read {read['rps']:,.0f} req/s, p99 {read['p99_ms']:.2f} ms, "
            f"non-2xx {read['non2xx']}, socket errors {read['socket_errors']}")
        self.lift_cap()
        self.psql("VACUUM (ANALYZE) profile_metrics")
        self.psql("CHECKPOINT")
        return result

    # -- the table ----------------------------------------------------------------------------------------

    def table(self):
        lines = []
        if self.args.month_only:
            lines.extend(self.month_table())
            return "\n".join(lines)
        if "monthly" in self.layouts:
            lines.append("monthly layout: a partition per month from the start (a fresh install)")
            lines.extend(self.layout_table("growth-", self.results["depths"]))
        if "upgrade" in self.layouts:
            if lines:
                lines.append("")
            lines.append("upgrade layout: the history (ending yesterday) seeded into the schema of the release before "
                         "migration 0017, then metricsd migrate;")
            lines.append("measured from the first day after migrating, BEFORE the move (METRICSD_HISTORY_MOVE=off):")
            lines.extend(self.layout_table("growth-upgrade-before-", self.results["upgrade-before"]))
            lines.append("")
            lines.extend(self.move_table())
            lines.append("")
            lines.append("upgrade layout AFTER the move:")
            lines.extend(self.layout_table("growth-upgrade-after-", self.results["upgrade-after"]))
        lines.extend(self.month_table())
        lines.append("")
        lines.extend(self.extrapolation())
        return "\n".join(lines)

    def move_table(self):
        """The upgrade layout's move, per depth: time, rows, the swap's lock time, the longest lock wait, the read."""
        lines = ["the move into monthly partitions (one daemon at its defaults, wrk -c32 reading meanwhile):"]
        for depth in self.depths:
            before = self.results["upgrade-before"].get(depth, {})
            move = self.b.results.get(f"growth-upgrade-{depth}-move")
            if not move:
                continue
            base = self.b.results.get(f"growth-upgrade-before-{depth}-{move['mode']}-read")
            lines.append(f"  {depth} d: migrate {before.get('migrate_seconds', 0):.1f} s; the move {move['seconds']:.0f} s "
                         f"for {move['rows']:,} rows in {move['months']} months = {move['rows_per_s']:,.0f} rows/s; "
                         f"the swap held ACCESS EXCLUSIVE on profile_metrics and users {move['swap_lock_ms']:.0f} ms")
            wait_ok = move["longest_lock_wait_s"] <= 1.0
            lines.append(f"    longest lock wait of any session meanwhile: {move['longest_lock_wait_s'] * 1000:.0f} ms "
                         f"({move['longest_lock_wait'] or 'none'}; {move['lock_samples']} samples)  ≤ 1000 ms  "
                         + ("PASS" if wait_ok else "FAIL"))
            read = move["read"]
            line = (f"    the read meanwhile ({move.get('label', move['mode'])}): {read['rps']:,.0f} req/s, p99 {read['p99_ms']:.2f} ms, "
                    f"failed {read['non2xx'] + read['socket_errors']}")
            if base:
                line += (f"; without the move {base['rps']:,.0f} req/s, p99 {base['p99_ms']:.2f} ms "
                         f"(p99 ratio {read['p99_ms'] / base['p99_ms']:.2f})")
            lines.append(line)
        return lines

    def history_table(self, prefix):
        """The history read and the export per depth and memory (when measured), with the targets at the deepest
        depth: the 90-day read ≥ 0.5 x the latest read's req/s with p99 ≤ 10 ms under each cap, the export's RSS
        growth ≤ 16 MB."""
        r = self.b.results

        def fmt(v, digits=0):
            return "-" if v is None else f"{v:,.{digits}f}"
        head = ("depth", "memory", "latest req/s", "90 d req/s", "p99 ms", "x latest", "730 d req/s", "p99 ms",
                "x latest", "export s", "export MB", "rows", "RSS + MB")
        rows, verdicts = [], []
        for depth in self.depths:
            for cap in [False] + self.caps:
                mode = self.mode_name(cap)
                rd, h90, h730, ex = (r.get(f"{prefix}{depth}-{mode}-{what}")
                                     for what in ("read", "history90", "history730", "export"))
                if not (h90 or h730 or ex):
                    continue
                rows.append((f"{depth} d", self.mode_label(cap), fmt(rd and rd["rps"]),
                             fmt(h90 and h90["rps"]), fmt(h90 and h90["p99_ms"], 2), fmt(h90 and h90.get("ratio"), 2),
                             fmt(h730 and h730["rps"]), fmt(h730 and h730["p99_ms"], 2),
                             fmt(h730 and h730.get("ratio"), 2), fmt(ex and ex["seconds"], 2),
                             fmt(ex and ex["bytes"] / 1e6, 2), fmt(ex and ex["rows"]), fmt(ex and ex["rss_growth_mb"], 1)))
                if depth == self.depths[-1] and cap and h90 and h90.get("ratio") is not None:
                    ok = h90["ratio"] >= 0.5 and h90["p99_ms"] <= 10
                    verdicts.append(f"  {depth} d, {self.mode_label(cap)}: 90-day history {h90['ratio']:.2f} x the "
                                    f"latest read (≥ 0.5), p99 {h90['p99_ms']:.2f} ms (≤ 10): {'PASS' if ok else 'FAIL'}")
                if depth == self.depths[-1] and ex:
                    ok = ex["rss_growth_mb"] <= 16
                    verdicts.append(f"  {depth} d, {self.mode_label(cap)}: export of {ex['rows']:,} rows, RSS "
                                    f"+{ex['rss_growth_mb']:.1f} MB (≤ 16): {'PASS' if ok else 'FAIL'}")
        if not rows:
            return []
        widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
        lines = ["", "history read (GET /v1/profile/metrics/history, default 90-day range and a 730-day range on one "
                     "page; wrk -t2 -c32, tokens of every user) and a JSON export of one user's every row:",
                 "  ".join(h.ljust(widths[i]) for i, h in enumerate(head)), "  ".join("-" * w for w in widths)]
        for row in rows:
            lines.append("  ".join(str(c).rjust(widths[i]) if i >= 2 else str(c).ljust(widths[i])
                                   for i, c in enumerate(row)))
        return lines + verdicts

    def layout_table(self, prefix, depth_results):
        """The growth table of one layout (or phase): its measurements (step names under `prefix`), bytes per
        user-day (`depth_results`: each depth's sizes), and the ratios to the shallowest depth with the targets."""
        r, d30 = self.b.results, self.depths[0]
        lines = []

        def get(depth, mode, what):
            return r.get(f"{prefix}{depth}-{mode}-{what}")

        def fmt(v, digits=0):
            return "-" if v is None else f"{v:,.{digits}f}"

        head = ("depth", "memory", "read req/s", "p99 ms", "non-2xx", "daily users/s", "daily WAL B/user",
                "daily warm users/s", "recompute users/s", "recompute WAL B/user", "bytes/user-day")
        rows = []
        for depth in self.depths:
            sizes = depth_results.get(depth, {}).get("sizes")
            for cap in [False] + self.caps:
                mode = self.mode_name(cap)
                rd, dl, rc = get(depth, mode, "read"), get(depth, mode, "daily"), get(depth, mode, "recompute")
                rows.append((f"{depth} d", self.mode_label(cap),
                             fmt(rd and rd["rps"]), fmt(rd and rd["p99_ms"], 2),
                             "-" if not rd else str(rd["non2xx"] + rd["socket_errors"]),
                             fmt(dl and dl["users_per_s"]), fmt(dl and dl["wal_per_user"]),
                             fmt(get(depth, mode, "dailywarm") and get(depth, mode, "dailywarm")["users_per_s"]),
                             fmt(rc and rc["users_per_s_cli"]), fmt(rc and rc["wal_per_user"]),
                             fmt(sizes and sizes["total_per_user_day"], 1) if mode == "memory" else ""))
        widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
        lines.append("  ".join(h.ljust(widths[i]) for i, h in enumerate(head)))
        lines.append("  ".join("-" * w for w in widths))
        for row in rows:
            lines.append("  ".join(str(c).rjust(widths[i]) if i >= 2 else str(c).ljust(widths[i])
                                   for i, c in enumerate(row)))
        lines.extend(self.history_table(prefix))
        if self.settle_seconds:
            waited = [x for x in self.settle_seconds if x > QUIET_SECONDS + 0.5]
            lines.append(f"before each measurement the bench waited for {QUIET_SECONDS:.0f} s without a stall of every "
                         f"CPU (free-memory reports to a VM's host after a cold start): {len(waited)} of "
                         f"{len(self.settle_seconds)} waited longer, at most {max(self.settle_seconds):.0f} s"
                         + (f"; {self.unsettled} measured unsettled after {SETTLE_LIMIT:.0f} s" if self.unsettled else ""))

        lines.append("")
        lines.append("bytes on disk per user-day (relation size incl. free space map and visibility map ÷ rows):")
        names = []
        for depth in self.depths:
            for rel in depth_results.get(depth, {}).get("sizes", {}).get("relations", []):
                if rel["name"] not in names:
                    names.append(rel["name"])
        head2 = ["relation"] + [f"{d} d" for d in self.depths] + ["leaf fill", "entries/leaf"]
        rows2 = []
        for name in names:
            cells = [name]
            last = None
            for depth in self.depths:
                rel = next((x for x in depth_results.get(depth, {}).get("sizes", {}).get("relations", [])
                            if x["name"] == name), None)
                cells.append(fmt(rel and rel["per_user_day"], 1))
                last = rel or last
            cells.append(f"{last['leaf_density']:.0f} %" if last and "leaf_density" in last else "")
            cells.append(fmt(last and last.get("entries_per_leaf")) if last and "entries_per_leaf" in last else "")
            rows2.append(cells)
        rows2.append(["total"] + [fmt(depth_results.get(d, {}).get("sizes", {}).get("total_per_user_day"), 1)
                                  for d in self.depths] + ["", ""])
        w2 = [max(len(x[i]) for x in [head2] + rows2) for i in range(len(head2))]
        lines.append("  ".join(h.ljust(w2[i]) for i, h in enumerate(head2)))
        for row in rows2:
            lines.append("  ".join(c.rjust(w2[i]) if i else c.ljust(w2[i]) for i, c in enumerate(row)))

        lines.extend(self.layout_checks(prefix, depth_results))
        return lines

    def layout_checks(self, prefix, depth_results):
        """The ratios of a layout's deepest figures to its shallowest, with the targets, and retention's."""
        r, d30 = self.b.results, self.depths[0]
        lines = []

        def get(depth, mode, what):
            return r.get(f"{prefix}{depth}-{mode}-{what}")

        def fmt(v, digits=0):
            return "-" if v is None else f"{v:,.{digits}f}"

        lines.append("")
        lines.append(f"ratios to {d30} days (same memory; targets for the deepest, each cap):")
        deep = self.depths[-1]
        checks = []
        for depth in self.depths[1:]:
            for cap in [False] + self.caps:
                mode, label = self.mode_name(cap), self.mode_label(cap)
                a, z = get(d30, mode, "read"), get(depth, mode, "read")
                if a and z:
                    ratio = z["rps"] / a["rps"]
                    limit = 1.25 * a["p99_ms"] + 1
                    target = depth == deep and bool(cap)
                    checks.append((f"{depth} d {label}: read req/s ÷ {d30} d", f"{ratio:.2f}",
                                   "≥ 0.8" if target else "", ("PASS" if ratio >= 0.8 else "FAIL") if target else ""))
                    checks.append((f"{depth} d {label}: read p99 (limit 1.25 × {a['p99_ms']:.2f} + 1 ms)",
                                   f"{z['p99_ms']:.2f} ms", f"≤ {limit:.2f}" if target else "",
                                   ("PASS" if z["p99_ms"] <= limit else "FAIL") if target else ""))
                a, z = get(d30, mode, "daily"), get(depth, mode, "daily")
                if a and z:
                    ratio = z["users_per_s"] / a["users_per_s"]
                    target = depth == deep and bool(cap)
                    checks.append((f"{depth} d {label}: daily users/s ÷ {d30} d", f"{ratio:.2f}",
                                   "≥ 0.8" if target else "", ("PASS" if ratio >= 0.8 else "FAIL") if target else ""))
                a, z = get(d30, mode, "dailywarm"), get(depth, mode, "dailywarm")
                if a and z:
                    ratio = z["users_per_s"] / a["users_per_s"]
                    target = depth == deep and bool(cap)
                    checks.append((f"{depth} d {label}: daily users/s after reads ÷ {d30} d", f"{ratio:.2f}",
                                   "≥ 0.8" if target else "", ("PASS" if ratio >= 0.8 else "FAIL") if target else ""))
                a, z = get(d30, mode, "recompute"), get(depth, mode, "recompute")
                if a and z:
                    checks.append((f"{depth} d {label}: recompute users/s ÷ {d30} d",
                                   f"{z['users_per_s_cli'] / a['users_per_s_cli']:.2f}", "", ""))
            a = depth_results.get(d30, {}).get("sizes")
            z = depth_results.get(depth, {}).get("sizes")
            if a and z:
                checks.append((f"{depth} d: bytes per user-day ÷ {d30} d",
                               f"{z['total_per_user_day'] / a['total_per_user_day']:.2f}", "", ""))
        ret = r.get(f"{prefix}{deep}-retention")
        if ret:
            base = get(deep, ret.get("mode", "memory"), "read")
            ok_rate = ret["rows_per_s"] >= 20000
            checks.append((f"retention {ret['days']} d on the {deep}-day table, {ret.get('mode', 'memory')}: rows removed/s",
                           fmt(ret["rows_per_s"]), "≥ 20,000", "PASS" if ok_rate else "FAIL"))
            if base:
                ratio = ret["read"]["p99_ms"] / base["p99_ms"]
                checks.append((f"  read p99 meanwhile ÷ read p99 without removal ({ret['read']['p99_ms']:.2f} ms)",
                               f"{ratio:.2f}", "≤ 3", "PASS" if ratio <= 3 else "FAIL"))
            bad = ret["read"]["non2xx"] + ret["read"]["socket_errors"]
            checks.append(("  failed requests meanwhile", str(bad), "0", "PASS" if bad == 0 else "FAIL"))
        w3 = [max(len(c[i]) for c in checks) for i in range(4)] if checks else [0] * 4
        for c in checks:
            lines.append("  " + "  ".join(c[i].ljust(w3[i]) if i != 1 else c[i].rjust(w3[i]) for i in range(4)).rstrip())

        return lines

    def month_table(self):
        lines = []
        month = self.b.results.get("growth-month")
        if month:
            s = month["series"]
            lines.append("")
            lines.append(f"simulated month after retention ({month['users']:,} users, retention {month['retention_days']} "
                         f"days): day, heap MB, indexes MB, live rows, dead rows, vacuums")
            for x in s:
                lines.append(f"  {x['day']:>3}  {x['heap'] / MB:8.1f}  {x['indexes'] / MB:8.1f}  {x['live']:>11,}  "
                             f"{x['dead']:>9,}  {x['vacuums']}")
            first, last = s[0], s[-1]
            growth = (last["heap"] + last["indexes"]) / max(1, first["heap"] + first["indexes"])
            lines.append(f"  size after {len(s) - 1} days ÷ size on day 0: {growth:.3f}")
        return lines

    def extrapolation(self):
        """What the figures come to at 1,000,000 users, from the measured shapes: bytes on disk, the pages the
        latest read and the daily unit need in memory (where the curve bends), WAL per day and the daily unit's
        time."""
        target = 1_000_000
        out = [f"extrapolation to {target:,} users (from the measured shapes; PAGE = 8 KiB):",
               "  disk(U, D) = U × D × b(D), b = the bytes per user-day above (flat in D: every row costs the same);",
               "  hot(U, D) = U × (PAGE × min(1, d ÷ E) + r + l): the pages the daily unit touches; the latest read",
               "    touches only l, its own table's row and key per user (profile_metrics_latest; before it existed the",
               "    read touched what the daily unit does, less l).",
               "    E = entries per leaf of the index (user_id, computed_at DESC): each user's entries lie together, so below",
               "    d = E a leaf holds the newest entries of several users and the whole index is hot; from d = E on,",
               "    every user's newest entries fill a leaf of their own: one leaf per user. d = the days that index",
               "    holds: D in one table; partitioned by month (migration 0013) the daily unit writes only into the",
               "    current month's partition, so d = min(D, 31) < E, whatever the depth. r = the heap bytes of each",
               "    user's newest row and its entries in the date-led indexes (written together each day, so they",
               "    share pages). Where the curve bends: in one table in D at D = E; partitioned, not in D; in U where",
               "    hot(U, D) exceeds the server's cache (shared_buffers + the page cache it may use).",
               "  Within the cache the daily unit runs at memory speed (the in-memory rows); beyond it each user written",
               "  costs a random read of a leaf: throughput ≈ concurrent statements ÷ read latency (the capped rows),",
               "  and in any case its WAL carries a full-page image of that leaf after every checkpoint."]
        # The monthly layout's figures, or the upgrade layout's after its move when only that one ran.
        monthly = "monthly" in self.layouts
        depth_results = self.results["depths"] if monthly else self.results["upgrade-after"]
        prefix = "growth-" if monthly else "growth-upgrade-after-"
        for depth in self.depths:
            sizes = depth_results.get(depth, {}).get("sizes")
            if not sizes:
                continue
            rels = sizes["relations"]
            read_index = next((x for x in rels if x["kind"] == "index" and "entries_per_leaf" in x
                               and re.search(r"\(user_id\b", x["definition"])), None)
            r_bytes = sum(x["per_user_day"] for x in rels
                          if x["kind"] == "heap" or (x["kind"] == "index" and read_index is not x))
            e = read_index["entries_per_leaf"] if read_index else float("inf")
            latest = sizes.get("latest_per_user", 0)
            days = min(depth, 31) if self.partitioned else depth
            hot = PAGE * min(1.0, days / e) + r_bytes + latest
            line = (f"  {depth:>4} d: E = {e:,.0f}, l = {latest:.0f} B, daily unit's hot set {hot / 1024:.2f} KiB/user -> "
                    f"{target:,} users: {hot * target / 1024 ** 3:.1f} GiB hot (the read's: "
                    f"{latest * target / 1024 ** 2:,.0f} MiB), "
                    f"{sizes['total_per_user_day'] * depth * target / 1024 ** 3:,.0f} GiB on disk")
            daily = self.b.results.get(f"{prefix}{depth}-memory-daily")
            if daily:
                line += (f", daily unit {target / daily['users_per_s'] / 60:.1f} min in memory, WAL "
                         f"{daily['wal_per_user'] * target / 1024 ** 3:.1f} GiB per day")
            for cap in self.caps:
                capped = self.b.results.get(f"{prefix}{depth}-{self.mode_name(cap)}-daily")
                if capped:
                    line += f", {target / capped['users_per_s'] / 60:.1f} min at the rate {self.mode_label(cap)}"
            out.append(line)
        return out


def default_shared_buffers(cap_mb):
    """shared_buffers under a memory cap of cap_mb, unless the cap names its own: a third of it."""
    return max(16, cap_mb // 3)
