"""The benchmark: the seed and the default steps (ceiling, http, sqlbound, recompute, daily, startup, rss, tls), the table."""

import datetime as dt
import hashlib
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from zoneinfo import ZoneInfo

from .bulkdelete import BulkDeleteStep
from .common import (ACTIVITY, BAD_KINDS, BAD_SHARE, BENCH_DIR, BenchError, CLUSTER_DIR, CONDITIONAL_USERS, Cluster, CpuMeter, DB, Daemon, GENDERS, GENDER_CONSTANT, LATEST_TRIGGER_OFF, LATEST_TRIGGER_ON, LOG_DIR, MAX_ATTEMPTS, NGINX_EXAMPLE, OTHERS_LIMIT, ROOT, RSS_DB, RssWatcher, SCRATCH, STEAL_LIMIT, TOKENS, UNKNOWN_ZONE, WRK_RANDOM_REQUEST, ZONES, children_cpu_s, die, free_port, latest_metrics_sql, load_mint_token, process_cpu_s, round_half_up, run, say)
from .eventloop import EventLoopLoads
from .floor import FloorStep
from .growth import GROWTH_DB, Growth
from .hostile import HostileClients
from .pooler import PoolerStep
from .readindex import ReadIndexStep
from .standby import StandbyStep
from .tracing import TracingStep
from . import common

class Bench(HostileClients, StandbyStep, EventLoopLoads, BulkDeleteStep, ReadIndexStep, PoolerStep, TracingStep,
            FloorStep):
    def __init__(self, args):
        self.args = args
        self.cluster = Cluster(args.port)
        self.children = set()
        self.results = {}       # step -> figures
        self.cpu = {}           # step -> cpu shares of the reported attempt
        self.attempts = {}      # step -> number of attempts
        self.log_problems = []  # (daemon run, line)
        self.extra_env = dict(kv.split("=", 1) for kv in args.daemon_env)
        self.phase_env = {}  # settings a measurement phase adds to every daemon (growth: the history move off)
        self.secret_file = os.path.join(BENCH_DIR, "jwt-secret")
        self.users = None
        self.db = DB

    # -- environment for metricsd -------------------------------------------------------------------------

    def daemon_env(self, port, db=None):
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("METRICSD_") or k in ("DATABASE_URL", "CREDENTIALS_DIRECTORY",
                                                          "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
                       or k.startswith("PG"))}
        env["DATABASE_URL"] = self.cluster.url(db or self.db)
        env["METRICSD_JWT_SECRET_FILE"] = self.secret_file
        env["METRICSD_LISTEN"] = f"127.0.0.1:{port}"
        env.update(self.extra_env)
        env.update(self.phase_env)
        return env

    def scan_log(self, name, path):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    low = line.lower()
                    # A record's level (text: the word after the time; JSON: "level"), not any word in it: a
                    # request log line of a 4xx is `info` and carries `metricsd.error.code=…`.
                    level = re.match(r"\S+ (warning|error|critical) ", low) or re.search(
                        r'"level":"(warning|error|critical)"', low)
                    if level or low.startswith("error:") or "fatal error" in low or "panic" in low:
                        self.log_problems.append((name, line.rstrip()[:300]))
        except OSError:
            pass

    # -- build, cluster, database -------------------------------------------------------------------------

    def build(self):
        if self.args.skip_build:
            if not os.access(common.METRICSD, os.X_OK):
                die(f"--skip-build: {common.METRICSD} does not exist; build once without --skip-build")
            return
        say("building metricsd (release, --scratch-path .build-bench)")
        t = time.monotonic()
        run(["swift", "build", "-c", "release", "--scratch-path", SCRATCH, "--product", "metricsd"],
            log=os.path.join(LOG_DIR, "build.log"))
        say(f"  built in {time.monotonic() - t:.0f} s")

    def ensure_secret(self):
        if not os.path.exists(self.secret_file):
            with open(self.secret_file, "w") as f:
                f.write(os.urandom(32).hex())
            os.chmod(self.secret_file, 0o600)

    def recreate_database(self, db, upto=None):
        """Drops, creates and migrates `db`: with every migration (`metricsd migrate`), or with those up to `upto`
        (e.g. "0016") only, as an install of the release that ended there has it (`metricsd migrate` applies the
        rest later)."""
        self.cluster.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        self.cluster.psql("postgres", f"CREATE DATABASE {db}")
        if upto:
            self.migrate_files(db, upto)
            return
        env = self.daemon_env(0, db)
        run([common.METRICSD, "migrate"], env=env, log=os.path.join(LOG_DIR, "migrate.log"))

    def migrate_files(self, db, upto):
        """Applies migrations/NNNN_*.sql up to NNNN = `upto` as `metricsd migrate` does: each in one transaction,
        recorded in metricsd_migrations with the SHA-256 of its text (the checksum metricsd compares)."""
        script = ["CREATE TABLE metricsd_migrations (name TEXT PRIMARY KEY, checksum TEXT NOT NULL, "
                  "applied_at TIMESTAMPTZ NOT NULL DEFAULT now());"]
        directory = os.path.join(ROOT, "migrations")
        for name in sorted(os.listdir(directory)):
            if not name.endswith(".sql") or name[:4] > upto:
                continue
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                text = f.read()
            # The build embeds each file as a multi-line string literal, which ends before the file's last newline.
            embedded = text[:-1] if text.endswith("\n") else text
            checksum = hashlib.sha256(embedded.encode("utf-8")).hexdigest()
            script += ["BEGIN;", text, f"INSERT INTO metricsd_migrations (name, checksum) VALUES ('{name}', '{checksum}');",
                       "COMMIT;"]
        run([self.cluster.psql_bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.cluster.url(db)],
            input_text="\n".join(script) + "\n", timeout=600, log=os.path.join(LOG_DIR, "migrate.log"))

    def database_exists(self, db):
        return self.cluster.value("postgres", f"SELECT count(*) FROM pg_database WHERE datname = '{db}'") == "1"

    # -- step 1: seed -------------------------------------------------------------------------------------

    @staticmethod
    def people(users, days, now):
        """The seeded users, as COPY text: users, user_settings, and each valid user's history values.

        Returns (users_text, settings_text, valid, bad_counts); valid holds (user id, zone, jitter, bmi text, bmr,
        tdee) per valid user (bad users have always been skipped: they have no history). `days` only moves
        created_at back far enough for the history."""
        rng = random.Random(8)
        today = now.date()
        names = [z for z, _ in ZONES]
        weights = [w for _, w in ZONES]
        zone_of = rng.choices(names, weights, k=users)
        bad_every = round(1 / BAD_SHARE)
        users_buf, settings_buf = [], []
        valid = []
        bad_counts = {}
        for i in range(users):
            uid = i + 1
            zone = zone_of[i]
            kind = None
            if uid % bad_every == 7 % bad_every:
                kind = BAD_KINDS[(uid // bad_every) % len(BAD_KINDS)]
                bad_counts[kind] = bad_counts.get(kind, 0) + 1
            # Signed up (and settings last changed) before the oldest history row: no settings change is pending.
            created = now - dt.timedelta(days=days + 1 + rng.randrange(400), seconds=rng.randrange(86400))
            tz_name = UNKNOWN_ZONE if kind == "timezone_unknown" else zone
            users_buf.append(f"{uid}\t{tz_name}\t{created.strftime('%Y-%m-%d %H:%M:%S')}+00\n")
            if kind == "no_settings":
                continue
            age = rng.randrange(18, 81)
            dob = today - dt.timedelta(days=age * 365 + age // 4 + rng.randrange(300) + 30)
            gender = rng.choices(GENDERS, [48, 48, 4])[0]
            w = rng.randrange(4500, 14001)   # hundredths of a kg
            h = rng.randrange(1500, 2001)    # tenths of a cm
            activity = rng.choice(list(ACTIVITY))
            onboarded = "t"
            dob_s, gender_s, activity_s = dob.isoformat(), gender, activity
            w_s, h_s = f"{w // 100}.{w % 100:02d}", f"{h // 10}.{h % 10}"
            if kind == "onboarding_incomplete":
                onboarded = "f"
            elif kind == "dob_missing":
                dob_s = "\\N"
            elif kind == "gender_missing":
                gender_s = "\\N"
            elif kind == "weight_missing":
                w_s = "\\N"
            elif kind == "height_missing":
                h_s = "\\N"
            elif kind == "activity_missing":
                activity_s = "\\N"
            elif kind == "height_72":
                h_s = "72.0"
            elif kind == "weight_350":
                w_s = "350.00"
            elif kind == "weight_29.5":
                w_s = "29.50"
            elif kind == "height_251":
                h_s = "251.0"
            elif kind == "age_12":
                dob_s = (today - dt.timedelta(days=12 * 365 + 100)).isoformat()
            elif kind == "age_121":
                dob_s = (today - dt.timedelta(days=121 * 365 + 30 + 100)).isoformat()
            elif kind == "gender_robot":
                gender_s = "robot"
            elif kind == "activity_couch":
                activity_s = "couch"
            updated = created + dt.timedelta(minutes=rng.randrange(1, 600))
            settings_buf.append(f"{uid}\t{dob_s}\t{gender_s}\t{w_s}\t{h_s}\t{activity_s}\t{onboarded}\t"
                                f"{updated.strftime('%Y-%m-%d %H:%M:%S')}+00\n")
            if kind is not None:
                continue
            bmi = round_half_up(w * 100_000, h * h)
            bmr40 = 4 * w + 25 * h - 200 * age + 40 * GENDER_CONSTANT[gender]
            valid.append((uid, zone, uid % 10, f"{bmi // 10}.{bmi % 10}", round_half_up(bmr40, 40),
                          round_half_up(bmr40 * ACTIVITY[activity], 40_000)))
        return "".join(users_buf), "".join(settings_buf), valid, bad_counts

    def seed(self, db, users, days):
        say(f"seeding {users:,} users with {days} days of history into {db}")
        t0 = time.monotonic()
        self.recreate_database(db)
        now = dt.datetime.now(dt.timezone.utc)
        names = [z for z, _ in ZONES]

        # For each zone and jitter minute: the `days` most recent local dates whose 00:05 (+ jitter) has passed,
        # as "date\tcomputed_at\n" (computed_at in UTC).
        day_lines = {}
        for zone in names:
            tz = ZoneInfo(zone)
            local_today = now.astimezone(tz).date()
            per_jitter = []
            for jitter in range(10):
                dates, d = [], local_today
                while len(dates) < days:
                    instant = dt.datetime(d.year, d.month, d.day, 0, 5, tzinfo=tz).astimezone(dt.timezone.utc)
                    instant += dt.timedelta(minutes=jitter, seconds=(jitter * 7) % 60)
                    if instant < now - dt.timedelta(minutes=1):
                        dates.append(f"{d.isoformat()}\t{instant.strftime('%Y-%m-%d %H:%M:%S')}+00\n")
                    d -= dt.timedelta(days=1)
                dates.reverse()
                per_jitter.append(dates)
            day_lines[zone] = per_jitter

        users_text, settings_text, people, bad_counts = self.people(users, days, now)
        valid = [(f"{uid}\t{bmi}\t{bmr}\t{tdee}\t1\t", zone, jitter) for uid, zone, jitter, bmi, bmr, tdee in people]
        users_buf, settings_buf = [users_text], [settings_text]

        t_gen = time.monotonic() - t0
        copy_sql = (
            "SET session_replication_role = replica;\n"   # no triggers: updated_at as seeded, no NOTIFY storm
            "BEGIN;\n"
            "TRUNCATE users, user_settings, profile_metrics, metrics_skips, metrics_acknowledgements CASCADE;\n"
            "COPY users (id, timezone, created_at) FROM STDIN WITH (FREEZE);\n"
        )
        p = subprocess.Popen([self.cluster.psql_bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.cluster.url(db)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.children.add(p)
        out = []
        reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
        reader.start()
        try:
            p.stdin.write(copy_sql)
            p.stdin.write("".join(users_buf))
            p.stdin.write("\\.\nCOPY user_settings (user_id, date_of_birth, gender, current_weight, height, "
                          "activity_level, onboarding_completed, updated_at) FROM STDIN WITH (FREEZE);\n")
            p.stdin.write("".join(settings_buf))
            p.stdin.write("\\.\n" + LATEST_TRIGGER_OFF + "\n")
            # (Not FREEZE: refused on a partitioned table. The VACUUM below freezes the rows.)
            p.stdin.write("COPY profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) "
                          "FROM STDIN;\n")
            # Day by day, every user's row of a day before the next day's: the heap as the daily unit leaves it
            # (one user's history spread over as many pages as days), not each user's rows together.
            for day in range(days):
                for start in range(0, len(valid), 2000):  # streamed: never all history rows in memory
                    p.stdin.write("".join(prefix + day_lines[zone][jitter][day]
                                          for prefix, zone, jitter in valid[start:start + 2000]))
            # half of the valid users acknowledged their latest metrics (the read path's LEFT JOIN finds a row)
            p.stdin.write("\\.\n" + LATEST_TRIGGER_ON + "\n")
            p.stdin.write("INSERT INTO metrics_acknowledgements (user_id, version, metrics_computed_at, "
                          "acknowledged_at) SELECT user_id, 1, max(computed_at), least(now(), max(computed_at) + interval '2 hours') "
                          "FROM profile_metrics WHERE user_id % 2 = 0 GROUP BY user_id;\nCOMMIT;\n")
            p.stdin.write(f"SELECT setval(pg_get_serial_sequence('users', 'id'), {users});\n")
            p.stdin.close()
        except BrokenPipeError:
            pass
        p.wait()
        reader.join()
        self.children.discard(p)
        if p.returncode != 0:
            die(f"seeding failed: {''.join(out)[-2000:]}")
        t_copy = time.monotonic() - t0 - t_gen
        self.cluster.psql(db, "VACUUM (FREEZE, ANALYZE)", timeout=3600)
        self.cluster.psql(db, "CHECKPOINT")
        rows = int(self.cluster.value(db, "SELECT count(*) FROM profile_metrics"))
        total = time.monotonic() - t0
        say(f"  seeded in {total:.1f} s (generate {t_gen:.1f} s, COPY {t_copy:.1f} s, "
            f"VACUUM (FREEZE, ANALYZE) + CHECKPOINT {total - t_gen - t_copy:.1f} s): {users:,} users, "
            f"{len(valid):,} valid, {users - len(valid):,} with bad settings, {rows:,} history rows")
        return {"seconds": total, "users": users, "valid": len(valid), "bad": users - len(valid),
                "history_rows": rows, "bad_kinds": bad_counts}

    # -- shared pieces ------------------------------------------------------------------------------------

    def count_users(self, db):
        return int(self.cluster.value(db, "SELECT count(*) FROM users"))

    def mark_daily_done(self, db, version):
        """Today's daily runs are done for `version` (see the header): the scheduler's catch-up stays idle."""
        self.cluster.psql(db, f"""
            INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total,
                                     created_at, started_at, finished_at)
            SELECT z.timezone,
                   (now() AT TIME ZONE CASE WHEN k.name IS NOT NULL THEN z.timezone ELSE 'UTC' END)::date + 1,
                   {version}, k.name IS NOT NULL, 'done', z.n, now(), now(), now()
            FROM (SELECT timezone, count(*)::int AS n FROM users GROUP BY timezone) z
            LEFT JOIN known_timezones k ON k.name = z.timezone
            ON CONFLICT DO NOTHING""")

    def timed(self, step, attempt_fn, describe, prepare=None, attempts=MAX_ATTEMPTS):
        """Runs attempt_fn(k) until others used at most OTHERS_LIMIT of the machine and the host took at most
        STEAL_LIMIT of it (at most `attempts` attempts); keeps the least disturbed attempt. prepare(k), when
        given, runs before each attempt's CPU meter is made (it may restart the cluster).

        Steal is time the host of a virtual machine ran something else on its CPUs. On this bench's 2-CPU VM it
        came in stalls of every CPU of 10-35 ms, and a read measured meanwhile had 1-3 % of its requests wait
        20-570 ms: 0.9-1.2 % steal over a read that had such a tail, 0.1-0.2 % over those that did not."""
        best = None

        def disturbance(cpu):
            return max(cpu["others"] / OTHERS_LIMIT, cpu["steal"] / STEAL_LIMIT)

        for k in range(attempts):
            if prepare:
                prepare(k)
            meter = CpuMeter(self.cluster.postmaster_pid())
            result = attempt_fn(k, meter)
            cpu = result.pop("_cpu")
            say(f"  {describe(result)}  [cpu: machine {cpu['machine']:.0%}, under test {cpu['ours']:.0%}, "
                f"others {cpu['others']:.0%}, of which the host's steal {cpu['steal']:.1%}]")
            if best is None or disturbance(cpu) < disturbance(best[1]):
                best = (result, cpu)
            self.attempts[step] = k + 1
            if disturbance(cpu) <= 1:
                break
            if k + 1 < attempts:
                say(f"  others used {cpu['others']:.0%} of the machine (limit {OTHERS_LIMIT:.0%}), the host's steal "
                    f"{cpu['steal']:.1%} (limit {STEAL_LIMIT:.1%}): repeating")
        self.results[step], self.cpu[step] = best
        return best[0]

    # -- step 2: database ceiling -------------------------------------------------------------------------

    def ceiling(self):
        n = self.users
        sql = latest_metrics_sql().replace("$1", ":uid")
        script = os.path.join(BENCH_DIR, "latest-metrics.pgbench")
        with open(script, "w") as f:
            f.write(f"\\set uid random(1, {n})\n{sql};\n")
        say(f"step 2: database ceiling (pgbench -M prepared -c 8 -j 2, {self.args.duration} s)")
        base = [os.path.join(self.cluster.bindir(), "pgbench"), "-h", "127.0.0.1", "-p", str(self.cluster.port),
                "-U", "postgres", "-n", "-M", "prepared", "-c", "8", "-j", "2", "-f", script, self.db]
        run(base[:-1] + ["-T", "3", self.db], log=os.path.join(LOG_DIR, "pgbench.log"))  # warm-up

        def attempt(k, meter):
            meter.start()
            load0 = children_cpu_s()
            p = run(base[:-1] + ["-T", str(self.args.duration), self.db])
            load_s = children_cpu_s() - load0
            cpu = meter.stop()
            with open(os.path.join(LOG_DIR, "pgbench.log"), "a") as f:
                f.write(p.stdout + p.stderr)
            m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", p.stdout)
            if not m:
                die(f"cannot read tps from pgbench: {p.stdout[-500:]}")
            lat = re.search(r"latency average = ([\d.]+) ms", p.stdout)
            failed = re.search(r"number of failed transactions: (\d+)", p.stdout)
            done = re.search(r"number of transactions actually processed: (\d+)", p.stdout)
            return {"tps": float(m.group(1)), "latency_avg_ms": float(lat.group(1)) if lat else None,
                    "failed": int(failed.group(1)) if failed else 0,
                    "transactions": int(done.group(1)) if done else None, "load_cpu_s": load_s, "_cpu": cpu}

        return self.timed("ceiling", attempt, lambda r: f"{r['tps']:,.0f} tps")

    # -- step 3: HTTP -------------------------------------------------------------------------------------

    def make_tokens(self, limit=TOKENS):
        """Tokens for `limit` random users with metrics (None: every one of them), one per line."""
        mint = load_mint_token()
        with open(self.secret_file, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
        ids = self.cluster.psql(self.db, f"""
            SELECT u.id FROM users u
            WHERE EXISTS (SELECT 1 FROM profile_metrics pm WHERE pm.user_id = u.id)
            ORDER BY random() {'' if limit is None else f'LIMIT {limit}'}""").split()
        now = int(time.time())
        path = os.path.join(BENCH_DIR, "tokens.txt")
        with open(path, "w") as f:
            for uid in ids:
                f.write(mint.mint(secret, {"sub": uid, "iat": now, "exp": now + 86400}) + "\n")
        return path, len(ids)

    def wrk_lua(self, tokens_path, name="today.lua", limit=None, path="/v1/profile/metrics/today"):
        """GET `path` (default /v1/profile/metrics/today) with a random token of `tokens_path` (its first `limit`) per
        request. Every
        request is formatted once, when wrk starts (as pgbench prepares its statement once): formatting it for each
        request (`wrk.format` in `request()`) cost wrk about a tenth of the read's req/s on these two cores."""
        lua = os.path.join(BENCH_DIR, name)
        with open(lua, "w") as f:
            f.write(f"""-- written by scripts/bench: GET {path} with a random valid token per request
local requests = {{}}
for line in io.lines("{tokens_path}") do
  requests[#requests + 1] = wrk.format("GET", "{path}", {{["Authorization"] = "Bearer " .. line}})
  if {limit or 0} > 0 and #requests >= {limit or 0} then break end
end
"""+WRK_RANDOM_REQUEST)
        return lua

    def conditional_lua(self, tokens_path, port, limit=CONDITIONAL_USERS):
        """The latest read as an app that polls does it: each request sends the ETag of that user's last reply in
        If-None-Match (fetched once per user here, for the first `limit` users), so the daemon answers 304. Its
        figure is compared with the full read of the same users (`wrk_lua(limit=...)`): both draw from users whose
        rows stay cached."""
        pairs = os.path.join(BENCH_DIR, "conditional-tokens.txt")
        first = None
        with open(tokens_path) as f, open(pairs, "w") as out:
            for line in f.readlines()[:limit]:
                token = line.strip()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/profile/metrics/today",
                                             headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    etag = r.headers.get("ETag")
                if not etag:
                    die("GET /v1/profile/metrics/today answered without an ETag")
                first = first or (token, etag)
                out.write(f"{token} {etag}\n")
        # wrk counts only 4xx and 5xx as errors: one request by hand shows the tag is answered with a 304.
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/profile/metrics/today",
                                     headers={"Authorization": f"Bearer {first[0]}", "If-None-Match": first[1]})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                die(f"GET with If-None-Match {first[1]} answered {r.status}, not 304")
        except urllib.error.HTTPError as e:
            if e.code != 304:
                die(f"GET with If-None-Match {first[1]} answered {e.code}, not 304")
        lua = os.path.join(BENCH_DIR, "today-conditional.lua")
        with open(lua, "w") as f:
            f.write(f"""-- written by scripts/bench: GET /v1/profile/metrics/today with If-None-Match (expects 304)
local requests = {{}}
for line in io.lines("{pairs}") do
  local token, tag = line:match("^(%S+) (.+)$")
  requests[#requests + 1] = wrk.format("GET", "/v1/profile/metrics/today",
                                       {{["Authorization"] = "Bearer " .. token, ["If-None-Match"] = tag}})
end
"""+WRK_RANDOM_REQUEST)
        return lua

    @staticmethod
    def parse_wrk(text):
        def ms(value, unit):
            return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]
        out = {}
        m = re.search(r"Requests/sec:\s+([\d.]+)", text)
        out["rps"] = float(m.group(1)) if m else None
        for pct in ("50", "75", "90", "99"):
            m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
            out[f"p{pct}_ms"] = ms(*m.groups()) if m else None
        m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", text)
        out["requests"] = int(m.group(1)) if m else None
        m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
        out["non2xx"] = int(m.group(1)) if m else 0
        m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
        out["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
        return out

    def costed_wrk(self, cmd, daemon_pid):
        """Runs wrk (`cmd`), appends its output to wrk.log and returns its figures, with the CPU seconds the daemon
        (`daemon_cpu_s`, None when it is gone) and wrk itself (`load_cpu_s`) spent meanwhile."""
        daemon0, load0 = process_cpu_s(daemon_pid), children_cpu_s()
        p = run(cmd)
        daemon1, load1 = process_cpu_s(daemon_pid), children_cpu_s()
        with open(os.path.join(LOG_DIR, "wrk.log"), "a") as f:
            f.write(p.stdout + p.stderr)
        result = self.parse_wrk(p.stdout)
        if result["rps"] is None:
            die(f"cannot read wrk's output: {p.stdout[-800:]}")
        result["daemon_cpu_s"] = None if daemon0 is None or daemon1 is None else daemon1 - daemon0
        result["load_cpu_s"] = load1 - load0
        return result

    @staticmethod
    def combine_turns(turns):
        """wrk figures of several runs of one load as one: requests and req/s summed over the runs' time, the worst
        p99, the daemon's CPU per request over all of them."""
        requests = sum(t["requests"] or 0 for t in turns)
        seconds = sum((t["requests"] or 0) / t["rps"] for t in turns if t["rps"])
        cpu = [t.get("daemon_cpu_s") for t in turns]
        return {"rps": requests / seconds if seconds else None, "requests": requests,
                "p50_ms": max(t["p50_ms"] or 0 for t in turns), "p99_ms": max(t["p99_ms"] or 0 for t in turns),
                "non2xx": sum(t["non2xx"] for t in turns), "socket_errors": sum(t["socket_errors"] for t in turns),
                "daemon_cpu_s": None if None in cpu else sum(cpu), "turns": [t["rps"] for t in turns]}

    def http(self):
        say(f"step 3: metricsd HTTP (wrk -t2 -c32 --latency, {self.args.duration} s)")
        # A token for every user with metrics, so that the read draws its users as the ceiling's pgbench does
        # (from all of them), not from a few thousand that stay cached.
        tokens_path, count = self.make_tokens(limit=None)
        if count == 0:
            die("no users with metrics to mint tokens for")
        lua = self.wrk_lua(tokens_path)
        self.mark_daily_done(self.db, 1)

        def attempt(k, meter):
            daemon = Daemon(self, f"http-{k + 1}")
            try:
                # one request by hand: it must be a 200 with metrics
                with open(tokens_path) as f:
                    token = f.readline().strip()
                req = urllib.request.Request(f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today",
                                             headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    body = r.read().decode()
                    if r.status != 200 or '"success":true' not in body.replace(" ", ""):
                        die(f"GET /v1/profile/metrics/today answered {r.status}: {body[:300]}")
                url = f"http://127.0.0.1:{daemon.port}/v1/profile/metrics/today"
                wrk = ["wrk", "-t2", "-c32", "--latency", "-s", lua]
                run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))  # warm-up
                watcher = RssWatcher(daemon.pid)
                meter.start()
                result = self.costed_wrk(wrk + [f"-d{self.args.duration}s", url], daemon.pid)
                cpu = meter.stop()
                rss = watcher.stop()
                result["rss_mb"] = max(rss, daemon.hwm_mb() or 0)
                result["_cpu"] = cpu
                # The HTTP stack's own ceiling on the same daemon: GET /healthz, no token, no database.
                healthz = f"http://127.0.0.1:{daemon.port}/healthz"
                result["healthz"] = self.costed_wrk(
                    ["wrk", "-t2", "-c32", "--latency", f"-d{self.args.duration}s", healthz], daemon.pid)
                # The conditional read (an app polling with the ETag it holds): 304s, same token check and read;
                # and the full read of the same users to compare it with. The two cost nearly the same (a 304
                # saves the body's bytes, not the read), so they run in turns, conditional, full, conditional,
                # full, half the duration each, and each figure is the sum of its two turns: a drift of the
                # machine over the minute then weighs on both alike.
                conditional = self.conditional_lua(tokens_path, daemon.port)
                same_users = self.wrk_lua(tokens_path, name="today-same-users.lua", limit=CONDITIONAL_USERS)
                for lua_file in (conditional, same_users):
                    run(["wrk", "-t2", "-c32", "-s", lua_file, "-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))
                half = max(2, self.args.duration // 2)
                turns = {"conditional": [], "conditional_base": []}
                for _ in range(2):
                    for key, lua_file in (("conditional", conditional), ("conditional_base", same_users)):
                        turns[key].append(self.costed_wrk(
                            ["wrk", "-t2", "-c32", "--latency", "-s", lua_file, f"-d{half}s", url], daemon.pid))
                for key, both in turns.items():
                    result[key] = self.combine_turns(both)
            finally:
                daemon.stop()
            # The same read with a request log line for every request (METRICSD_REQUEST_LOG=all), to a file.
            logged = Daemon(self, f"http-log-all-{k + 1}", {"METRICSD_REQUEST_LOG": "all"})
            try:
                url = f"http://127.0.0.1:{logged.port}/v1/profile/metrics/today"
                run(["wrk", "-t2", "-c32", "-s", lua, "-d3s", url], log=os.path.join(LOG_DIR, "wrk.log"))
                result["log_all"] = self.costed_wrk(
                    ["wrk", "-t2", "-c32", "--latency", "-s", lua, f"-d{self.args.duration}s", url], logged.pid)
            finally:
                logged.stop()
            return result

        return self.timed("http", attempt,
                          lambda r: f"{r['rps']:,.0f} req/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                                    f"non-2xx {r['non2xx']}, socket errors {r['socket_errors']}, "
                                    f"peak RSS {r['rss_mb']:.1f} MB; /healthz {r['healthz']['rps']:,.0f} req/s; "
                                    f"request log all {r['log_all']['rps']:,.0f} req/s")

    # -- tls: metricsd's TLS, plain HTTP, nginx's TLS in front ----------------------------------------------

    def certificate(self):
        cert, key = os.path.join(BENCH_DIR, "tls.crt"), os.path.join(BENCH_DIR, "tls.key")
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key,
             "-out", cert])
        return cert, key

    def start_nginx(self, upstream_port, cert, key):
        """nginx with the shipped example (certificate, ports and server_name replaced), in the foreground."""
        if not shutil.which("nginx") and not os.path.exists("/usr/sbin/nginx"):
            die("nginx is missing: apt-get install nginx")
        prefix = os.path.join(BENCH_DIR, "nginx")
        os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
        port = free_port()
        with open(NGINX_EXAMPLE) as f:
            site = f.read()
        site = (site.replace("/etc/letsencrypt/live/api.example.com/fullchain.pem", cert)
                .replace("/etc/letsencrypt/live/api.example.com/privkey.pem", key)
                .replace("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream_port};")
                .replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
                .replace("listen [::]:443 ssl;\n", "")
                .replace("server_name api.example.com;", "server_name localhost;"))
        with open(os.path.join(prefix, "metricsd-site.conf"), "w") as f:
            f.write(site)
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"daemon off;\nworker_processes 2;\npid {prefix}/nginx.pid;\nerror_log {prefix}/logs/error.log;\n"
                    f"events {{ worker_connections 1024; }}\n"
                    f"http {{ access_log off; include {prefix}/metricsd-site.conf; }}\n")
        return self.run_nginx(prefix, conf, port), port

    def run_nginx(self, prefix, conf, port):
        """nginx in the foreground with `conf`, once it accepts connections on `port` (10 s at most)."""
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        proc = subprocess.Popen([nginx, "-p", prefix, "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.children.add(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return proc
            except OSError:
                if proc.poll() is not None:
                    die(f"nginx exited with {proc.returncode}; see {prefix}/logs/error.log")
                time.sleep(0.1)
        die("nginx did not listen within 10 s")

    def logged_wrk(self, cmd):
        """Runs wrk (`cmd`), appends its output to wrk.log and returns its parsed figures (dies when it cannot)."""
        p = run(cmd)
        with open(os.path.join(LOG_DIR, "wrk.log"), "a") as f:
            f.write(p.stdout + p.stderr)
        result = self.parse_wrk(p.stdout)
        if result["rps"] is None or not result["requests"]:
            die(f"cannot read wrk's output: {p.stdout[-800:]}")
        return result

    def tls(self):
        say(f"step tls: the latest read over plain HTTP, metricsd's TLS, and nginx's TLS in front "
            f"(wrk -t2 -c32 --latency, {self.args.duration} s each)")
        tokens_path, count = self.make_tokens()
        if count == 0:
            die("no users with metrics to mint tokens for")
        lua = self.wrk_lua(tokens_path)
        self.mark_daily_done(self.db, 1)
        cert, key = self.certificate()

        def read(url):
            wrk = ["wrk", "-t2", "-c32", "--latency", "-s", lua]
            run(wrk + ["-d3s", url], log=os.path.join(LOG_DIR, "wrk-tls.log"))  # warm-up (and the handshakes)
            p = run(wrk + [f"-d{self.args.duration}s", url])
            with open(os.path.join(LOG_DIR, "wrk-tls.log"), "a") as f:
                f.write(url + "\n" + p.stdout + p.stderr)
            result = self.parse_wrk(p.stdout)
            if result["rps"] is None:
                die(f"cannot read wrk's output: {p.stdout[-800:]}")
            return result

        def attempt(k, meter):
            out = {}
            meter.start()
            plain = Daemon(self, f"tls-plain-{k + 1}", {"METRICSD_TRUSTED_PROXIES": "127.0.0.1"})
            try:
                out["plain"] = read(f"http://127.0.0.1:{plain.port}/v1/profile/metrics/today")
                nginx, port = self.start_nginx(plain.port, cert, key)
                try:
                    out["nginx"] = read(f"https://127.0.0.1:{port}/v1/profile/metrics/today")
                finally:
                    nginx.terminate()
                    nginx.wait()
                    self.children.discard(nginx)
            finally:
                plain.stop()
            tls = Daemon(self, f"tls-{k + 1}", {"METRICSD_TLS": "public", "METRICSD_TLS_CERTIFICATE_FILE": cert,
                                                "METRICSD_TLS_KEY_FILE": key})
            try:
                out["tls"] = read(f"https://127.0.0.1:{tls.port}/v1/profile/metrics/today")
            finally:
                tls.stop()
            out["_cpu"] = meter.stop()
            return out

        return self.timed("tls", attempt,
                          lambda r: "; ".join(f"{name} {r[name]['rps']:,.0f} req/s, p99 {r[name]['p99_ms']:.2f} ms, "
                                              f"errors {r[name]['non2xx'] + r[name]['socket_errors']}"
                                              for name in ("plain", "tls", "nginx")))

    # -- step 4: the set-based SQL bound ------------------------------------------------------------------

    @staticmethod
    def sql_bound_statement(version):
        """Every valid user's metrics for their current local date, in SQL alone: the daemon's integer
        formulas (weight in hundredths of a kg, height in tenths of a cm, BMR in 1/40 kcal) on numeric,
        round() halves away from zero like MetricsFormula.roundHalfUp, and the daemon's validity rules."""
        return f"""
INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
SELECT v.id, round(v.w * 100000 / (v.h * v.h)) / 10, round(v.bmr40 / 40), round(v.bmr40 * v.f / 40000),
       {version}, v.d, date_trunc('milliseconds', now())
FROM (
  SELECT x.id, x.d, x.w, x.h, x.f, 4 * x.w + 25 * x.h - 200 * x.age + 40 * x.s AS bmr40
  FROM (
    SELECT u.id, l.d, s.current_weight * 100 AS w, s.height * 10 AS h,
           CASE s.gender WHEN 'male' THEN 5 WHEN 'female' THEN -161 ELSE -78 END AS s,
           CASE s.activity_level WHEN 'sedentary' THEN 1200 WHEN 'lightly_active' THEN 1375
                WHEN 'moderately_active' THEN 1550 WHEN 'very_active' THEN 1725 ELSE 1900 END AS f,
           extract(year FROM l.d) - extract(year FROM s.date_of_birth)
             - CASE WHEN (extract(month FROM l.d), extract(day FROM l.d))
                         < (extract(month FROM s.date_of_birth), extract(day FROM s.date_of_birth))
                    THEN 1 ELSE 0 END AS age
    FROM users u
    JOIN known_timezones k ON k.name = u.timezone
    JOIN user_settings s ON s.user_id = u.id
    CROSS JOIN LATERAL (SELECT (now() AT TIME ZONE k.name)::date AS d) l  -- k.name: only known zones
    WHERE s.onboarding_completed AND s.date_of_birth IS NOT NULL
      AND s.gender IN ('male', 'female', 'other')
      AND s.activity_level IN ('sedentary', 'lightly_active', 'moderately_active', 'very_active',
                               'extremely_active')
      AND s.current_weight BETWEEN 30 AND 300 AND s.height BETWEEN 100 AND 250
  ) x
  WHERE x.age BETWEEN 13 AND 120
) v
ORDER BY v.id
ON CONFLICT (user_id, metrics_date, version) DO NOTHING"""

    def sqlbound(self):
        say("step 4: write bound (one set-based INSERT … SELECT, version 900)")
        version = 900
        self.cluster.psql(self.db, f"DELETE FROM profile_metrics WHERE version = {version}")

        def attempt(k, meter):
            self.cluster.psql(self.db, "CHECKPOINT")
            meter.start()
            t = time.monotonic()
            out = self.cluster.psql(self.db, self.sql_bound_statement(version), timeout=3600)
            seconds = time.monotonic() - t
            cpu = meter.stop()
            rows = int(self.cluster.value(self.db, f"SELECT count(*) FROM profile_metrics WHERE version = {version}"))
            self.cluster.psql(self.db, f"""
                DROP TABLE IF EXISTS bench_sql_bound;
                CREATE TABLE bench_sql_bound AS
                  SELECT user_id, bmi, bmr, tdee, metrics_date FROM profile_metrics WHERE version = {version};
                DELETE FROM profile_metrics WHERE version = {version}""")
            self.cluster.psql(self.db, "VACUUM (ANALYZE) profile_metrics", timeout=3600)
            return {"seconds": seconds, "rows": rows, "users_per_s": self.users / seconds, "_cpu": cpu}

        return self.timed("sqlbound", attempt,
                          lambda r: f"{r['rows']:,} rows in {r['seconds']:.2f} s = {r['users_per_s']:,.0f} users/s")

    # -- step 5: recompute-all ----------------------------------------------------------------------------

    def recompute_once(self, db, version, name, meter, compare=True, prepared=False):
        """Starts a daemon with formula `version`, triggers recompute-all --wait, waits, stops the daemon.
        `prepared`: the caller already removed earlier rows of `version` (no VACUUM or CHECKPOINT here)."""
        if not prepared:
            self.cluster.psql(db, f"DELETE FROM profile_metrics WHERE version = {version}; TRUNCATE metrics_skips")
            self.cluster.psql(db, "VACUUM (ANALYZE) profile_metrics", timeout=3600)
        self.mark_daily_done(db, version)
        if not prepared:
            self.cluster.psql(db, "CHECKPOINT")
        users = self.count_users(db)
        daemon = Daemon(self, name, {"METRICSD_TEST_FORMULA_VERSION": str(version), "DATABASE_URL": self.cluster.url(db)})
        try:
            watcher = RssWatcher(daemon.pid)
            env = dict(daemon.env)
            env.pop("NOTIFY_SOCKET", None)
            cli_log = open(os.path.join(LOG_DIR, f"recompute-cli-{name}.log"), "w")
            poll = self.cluster.session(db)
            meter.start()
            t = time.monotonic()
            cli = subprocess.Popen([common.METRICSD, "recompute-all", "--wait"], env=env, stdout=cli_log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.children.add(cli)
            try:
                self.wait_for_progress(cli.poll, daemon, poll, f"""
                    SELECT coalesce(sum(c.users_done + c.users_skipped), 0) FROM recompute_jobs j
                    JOIN work_chunks c ON c.job_id = j.id WHERE j.version = {version}""", "recompute-all")
            finally:
                if cli.poll() is None:
                    cli.kill()
                cli.wait()
                self.children.discard(cli)
                cli_log.close()
                poll.close()
            cli_seconds = time.monotonic() - t
            cpu = meter.stop()
            if cli.returncode != 0:
                die(f"metricsd recompute-all --wait exited with {cli.returncode}; see {cli_log.name}")
            rss = max(watcher.stop(), daemon.hwm_mb() or 0)
        finally:
            daemon.stop()
        row = self.cluster.psql(db, f"""
            SELECT j.state, j.users_total, coalesce(sum(c.users_done), 0), coalesce(sum(c.users_skipped), 0),
                   extract(epoch FROM j.finished_at - j.created_at), extract(epoch FROM j.finished_at - j.started_at),
                   count(c.id)
            FROM recompute_jobs j LEFT JOIN work_chunks c ON c.job_id = j.id
            WHERE j.version = {version} GROUP BY j.id ORDER BY j.id DESC LIMIT 1""").split("|")
        state, total, done, skipped, seconds, from_start, chunks = row
        if state != "done":
            die(f"recompute job for version {version} ended {state}")
        seconds = float(seconds)
        skips = int(self.cluster.value(db, "SELECT count(*) FROM metrics_skips"))
        reasons = dict(tuple(line.split("|")) for line in self.cluster.psql(db, """
            SELECT code, count(*) FROM metrics_skips, unnest(reason_codes) AS code GROUP BY code ORDER BY 2 DESC
            """).splitlines() if line)
        rows = int(self.cluster.value(db, f"SELECT count(*) FROM profile_metrics WHERE version = {version}"))
        result = {"version": version, "seconds": seconds, "seconds_from_start": float(from_start),
                  "cli_seconds": cli_seconds, "users": users, "done": int(done), "skipped": int(skipped),
                  "chunks": int(chunks), "rows": rows, "users_per_s": (int(done) + int(skipped)) / seconds,
                  "users_per_s_cli": (int(done) + int(skipped)) / cli_seconds,
                  "skip_records": skips, "skip_reasons": reasons, "rss_mb": rss, "_cpu": cpu}
        if compare:
            mismatches = self.cluster.value(db, f"""
                SELECT count(*) FROM bench_sql_bound b
                FULL JOIN (SELECT * FROM profile_metrics WHERE version = {version}) p USING (user_id)
                WHERE b.user_id IS NULL OR p.user_id IS NULL
                   OR (b.bmi, b.bmr, b.tdee, b.metrics_date) IS DISTINCT FROM (p.bmi, p.bmr, p.tdee, p.metrics_date)
                """) if self.table_exists(db, "bench_sql_bound") else None
            result["mismatches_vs_sql"] = None if mismatches is None else int(mismatches)
        return result

    STALL_SECONDS = 120

    def wait_for_progress(self, finished, daemon, poll, progress_sql, what):
        """Waits until finished() is not None; fails when the daemon exits or no user is processed for
        STALL_SECONDS (a hung daemon must not hang the benchmark)."""
        last, last_change = None, time.monotonic()
        while finished() is None:
            if daemon.proc.poll() is not None:
                die(f"metricsd ({daemon.name}) exited with {daemon.proc.returncode} during {what}; "
                    f"see {daemon.log_path}")
            progress = poll.query(progress_sql)
            if progress != last:
                last, last_change = progress, time.monotonic()
            elif time.monotonic() - last_change > self.STALL_SECONDS:
                die(f"{what} made no progress for {self.STALL_SECONDS} s (stuck at {last[0] if last else '?'} "
                    f"users; metricsd pid {daemon.pid}); see {daemon.log_path}")
            time.sleep(0.25)

    def table_exists(self, db, name):
        return self.cluster.value(db, f"SELECT to_regclass('{name}') IS NOT NULL") == "t"

    def recompute(self):
        say("step 5: metricsd recompute-all (fresh formula version)")

        def attempt(k, meter):
            return self.recompute_once(self.db, 901 + 10 * k, f"recompute-{k + 1}", meter)

        return self.timed("recompute", attempt,
                          lambda r: f"version {r['version']}: {r['done']:,} done + {r['skipped']:,} skipped in "
                                    f"{r['seconds']:.2f} s = {r['users_per_s']:,.0f} users/s "
                                    f"({r['chunks']} chunks, {r['skip_records']:,} skip records, "
                                    f"peak RSS {r['rss_mb']:.1f} MB, "
                                    f"differences from the SQL bound: {r.get('mismatches_vs_sql')})")

    # -- step 6: the daily path ---------------------------------------------------------------------------

    def daily(self):
        say("step 6: daily path (all users in UTC, one unit due now)")
        db = self.db
        self.cluster.psql(db, """
            DROP TABLE IF EXISTS bench_user_timezones;
            CREATE TABLE bench_user_timezones AS SELECT id, timezone FROM users;
            -- Without the zone-change trigger: it would stamp every user's settings as changed (and NOTIFY each),
            -- and the daemon would recompute them all alongside the unit being measured.
            SET session_replication_role = replica;
            UPDATE users SET timezone = 'UTC' WHERE timezone <> 'UTC';""", timeout=3600)
        try:
            self.cluster.psql(db, "VACUUM (ANALYZE) users", timeout=3600)

            def attempt(k, meter):
                version = 902 + 10 * k
                self.cluster.psql(db, f"""
                    DELETE FROM profile_metrics WHERE version = {version};
                    DELETE FROM daily_units WHERE version = {version};
                    TRUNCATE metrics_skips""")
                self.cluster.psql(db, "VACUUM (ANALYZE) profile_metrics", timeout=3600)
                self.cluster.psql(db, "CHECKPOINT")
                # The next minute (at least 8 s away): the daemon is up and idle when the unit falls due, so the
                # due instant -> last row figure is what an operator sees.
                daily_at = self.cluster.value(db, """
                    SELECT to_char(date_trunc('minute', now() AT TIME ZONE 'UTC' + interval '8 seconds')
                                   + interval '1 minute', 'HH24:MI')""")
                # The dates whose daily time has already passed are done: otherwise the scheduler's catch-up would
                # start yesterday's unit at once (due a day ago), and the unit measured would not be the one that
                # falls due at daily_at while the daemon idles.
                self.cluster.psql(db, f"""
                    INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total,
                                             created_at, started_at, finished_at)
                    SELECT 'UTC', d::date, {version}, true, 'done', 0, now(), now(), now()
                    FROM generate_series((now() AT TIME ZONE 'UTC')::date - 2, (now() AT TIME ZONE 'UTC')::date,
                                         interval '1 day') d
                    WHERE (d::date + '{daily_at}'::time) AT TIME ZONE 'UTC' <= now()
                    ON CONFLICT DO NOTHING""")
                env = {"METRICSD_TEST_FORMULA_VERSION": str(version), "METRICSD_DAILY_AT": daily_at}
                if self.args.daily_tick:
                    env["METRICSD_TICK_SECONDS"] = str(self.args.daily_tick)
                daemon = Daemon(self, f"daily-{k + 1}", env)
                # The CPU shares are those of the unit's work: from just before it falls due, not of the wait.
                wait = float(self.cluster.value(db, f"""
                    SELECT extract(epoch FROM min(t) - now())
                    FROM (SELECT ((now() AT TIME ZONE 'UTC')::date + k + '{daily_at}'::time) AT TIME ZONE 'UTC' AS t
                          FROM generate_series(0, 1) k) due
                    WHERE t > now() - interval '1 minute'"""))
                time.sleep(max(0.0, wait - 0.5))
                meter.start()
                poll = self.cluster.session(db)
                try:
                    watcher = RssWatcher(daemon.pid)
                    def finished():
                        states = poll.query(f"SELECT state FROM daily_units WHERE version = {version} "
                                            "AND users_total > 0")
                        return bool(states) and all(s in ("done", "superseded") for s in states) or None
                    self.wait_for_progress(finished, daemon, poll, f"""
                        SELECT coalesce(sum(users_done + users_skipped), 0) FROM work_chunks
                        WHERE kind = 'daily' AND version = {version}""", "the daily unit")
                    cpu = meter.stop()
                    rss = max(watcher.stop(), daemon.hwm_mb() or 0)
                finally:
                    poll.close()
                    daemon.stop()
                row = self.cluster.psql(db, f"""
                    SELECT d.timezone, d.local_date, d.state, d.users_total,
                           extract(epoch FROM d.finished_at - d.created_at),
                           extract(epoch FROM d.finished_at) - {daemon.wall_exec},
                           coalesce(sum(c.users_done), 0), coalesce(sum(c.users_skipped), 0), count(c.id),
                           extract(epoch FROM max(c.finished_at) - d.due_at)
                    FROM daily_units d
                    LEFT JOIN work_chunks c ON c.kind = 'daily' AND c.timezone = d.timezone
                                           AND c.local_date = d.local_date AND c.version = d.version
                    WHERE d.version = {version} AND d.users_total > 0
                    GROUP BY d.timezone, d.local_date, d.version""").splitlines()
                if len(row) != 1:
                    die(f"expected one daily unit for version {version}, found: {row}")
                zone, date, state, total, seconds, exec_to_done, done, skipped, chunks, due_seconds = row[0].split("|")
                if state != "done":
                    die(f"the daily unit ended {state}")
                seconds = float(seconds)
                skips = int(self.cluster.value(db, "SELECT count(*) FROM metrics_skips"))
                return {"version": version, "zone": zone, "date": date, "daily_at": daily_at,
                        "users": int(total), "done": int(done), "skipped": int(skipped), "chunks": int(chunks),
                        "seconds": seconds, "exec_to_done": float(exec_to_done), "users_per_s": int(total) / seconds,
                        "due_seconds": float(due_seconds), "users_per_s_due": int(total) / float(due_seconds),
                        "skip_records": skips, "rss_mb": rss, "_cpu": cpu}

            return self.timed("daily", attempt,
                              lambda r: f"unit {r['zone']} {r['date']} (daily at {r['daily_at']}): {r['done']:,} done + "
                                        f"{r['skipped']:,} skipped in {r['seconds']:.2f} s = "
                                        f"{r['users_per_s']:,.0f} users/s; due -> last row {r['due_seconds']:.2f} s "
                                        f"({r['chunks']} chunks; exec -> done "
                                        f"{r['exec_to_done']:.2f} s; peak RSS {r['rss_mb']:.1f} MB)")
        finally:
            self.cluster.psql(db, """
                SET session_replication_role = replica;
                UPDATE users u SET timezone = b.timezone FROM bench_user_timezones b
                WHERE b.id = u.id AND u.timezone IS DISTINCT FROM b.timezone;
                DROP TABLE bench_user_timezones;""", timeout=3600)
            self.cluster.psql(db, "VACUUM (ANALYZE) users", timeout=3600)

    # -- step 7: start-up ---------------------------------------------------------------------------------

    def startup(self):
        runs = self.args.startup_runs
        say(f"step 7: start-up, exec -> READY=1 (median of {runs})")
        self.mark_daily_done(self.db, 1)

        def attempt(k, meter):
            times = []
            meter.start()
            for i in range(runs):
                daemon = Daemon(self, f"startup-{k + 1}-{i + 1}")
                times.append(daemon.ready_seconds)
                daemon.stop()
            cpu = meter.stop()
            return {"median_ms": statistics.median(times) * 1000, "min_ms": min(times) * 1000,
                    "max_ms": max(times) * 1000, "runs": runs, "_cpu": cpu}

        return self.timed("startup", attempt,
                          lambda r: f"median {r['median_ms']:.0f} ms (min {r['min_ms']:.0f}, max {r['max_ms']:.0f})")

    # -- rss: recompute-all of many users -----------------------------------------------------------------

    def rss(self):
        n = self.args.rss_users
        say(f"rss: recompute-all of {n:,} users (database {RSS_DB})")
        self.results["rss_seed"] = self.seed(RSS_DB, n, self.args.rss_days)

        def attempt(k, meter):
            return self.recompute_once(RSS_DB, 901 + 10 * k, f"rss-{k + 1}", meter, compare=False)

        try:
            return self.timed("rss", attempt,
                              lambda r: f"{r['done'] + r['skipped']:,} users in {r['seconds']:.1f} s = "
                                        f"{r['users_per_s']:,.0f} users/s, peak RSS {r['rss_mb']:.1f} MB")
        finally:
            self.cluster.psql("postgres", f"DROP DATABASE IF EXISTS {RSS_DB} WITH (FORCE)")

    # -- step 8: the table --------------------------------------------------------------------------------

    TARGET_RATIO = 0.85

    def cpu_budget_rows(self, ceiling, h, transactions, per_tx, per_read):
        """CPU per request of each party (the daemon, the database, the load generator) for the ceiling, the read
        and /healthz, all measured in this run; and what that leaves the daemon for a read at the target ratio.

        On this machine the load generator, the database and metricsd share the same cores, so the read's req/s is
        the cores' time divided by the three parties' CPU per read. At 0.85 × the ceiling the three may spend at
        most cores ÷ (0.85 × tps) together; less the database's and wrk's measured cost per read, that is the
        daemon's budget, beside what the daemon spends on a /healthz (no token, no database, a smaller reply),
        which a read also has to do."""
        rows = []
        z = h.get("healthz", {})
        needed = (h.get("daemon_cpu_s"), h.get("load_cpu_s"), z.get("daemon_cpu_s"), z.get("load_cpu_s"),
                  z.get("requests"), ceiling.get("load_cpu_s"))
        if any(v is None for v in needed) or not h.get("requests") or not transactions:
            return rows
        read_daemon = h["daemon_cpu_s"] / h["requests"] * 1e6
        read_load = h["load_cpu_s"] / h["requests"] * 1e6
        healthz_daemon = z["daemon_cpu_s"] / z["requests"] * 1e6
        healthz_load = z["load_cpu_s"] / z["requests"] * 1e6
        pgbench = ceiling["load_cpu_s"] / transactions * 1e6
        rows.append(("  CPU per request, metricsd / database / load generator: the read (wrk)",
                     f"{read_daemon:.1f} / {per_read:.1f} / {read_load:.1f}", "µs", "", "", None))
        rows.append(("    GET /healthz (wrk, no token, no database)", f"{healthz_daemon:.1f} / 0 / {healthz_load:.1f}",
                     "µs", "", "", None))
        rows.append(("    the ceiling's statement (pgbench)", f"- / {per_tx:.1f} / {pgbench:.1f}", "µs", "", "", None))
        cores = os.cpu_count() or 1
        budget = cores * 1e6 / (self.TARGET_RATIO * ceiling["tps"]) - per_read - read_load
        rows.append((f"  metricsd's CPU budget per read for {self.TARGET_RATIO} × the ceiling on {cores} shared cores "
                     f"(its cost for a /healthz)", f"{budget:.1f} ({healthz_daemon:.1f})", "µs", "", "", None))
        return rows

    def table(self):
        r, c = self.results, self.cpu
        rows = []  # figure, value, unit, target, verdict, step (for cpu)

        def fmt(v, digits=0):
            if v is None:
                return "-"
            return f"{v:,.{digits}f}"

        def verdict(ok):
            return "PASS" if ok else "FAIL"

        def cpu_seconds(step):
            """CPU time the processes under test used in the step (all cores), per 1,000 users."""
            x = c.get(step)
            return None if x is None else x["ours"] * x["seconds"] * (os.cpu_count() or 1)

        n = self.users
        if "seed" in r:
            x = r["seed"]
            rows.append((f"seed: {x['users']:,} users ({x['bad']:,} bad), {x['history_rows']:,} history rows",
                         fmt(x["seconds"], 1), "s", "", "", None))
        if "ceiling" in r:
            rows.append(("DB ceiling: pgbench latest-metrics, prepared, 8 clients", fmt(r["ceiling"]["tps"]), "tx/s",
                         "", "", "ceiling"))
        if "tls" in r:
            t = r["tls"]
            base = t["plain"]["rps"] or 1
            for name, label in (("plain", "latest read, plain HTTP to metricsd"), ("tls", "latest read, HTTPS to metricsd (METRICSD_TLS)"),
                                ("nginx", "latest read, HTTPS to nginx before plain metricsd")):
                x = t[name]
                rows.append((f"tls: {label}, wrk -t2 -c32", fmt(x["rps"]), "req/s", "", "", "tls" if name == "plain" else None))
                rows.append((f"  p50 / p99 latency", f"{fmt(x['p50_ms'], 2)} / {fmt(x['p99_ms'], 2)}", "ms", "", "", None))
                rows.append((f"  ÷ plain HTTP", fmt(x["rps"] / base, 2), "×", "", "", None))
                bad = x["non2xx"] + x["socket_errors"]
                rows.append(("  non-2xx responses + socket errors", str(bad), f"of {x['requests']:,}", "0", verdict(bad == 0), None))
        if "http" in r:
            h = r["http"]
            rows.append(("metricsd HTTP: wrk -t2 -c32, random valid JWT, request log default", fmt(h["rps"]), "req/s",
                         "", "", "http"))
            rows.append(("  p50 latency", fmt(h["p50_ms"], 2), "ms", "", "", None))
            rows.append(("  p99 latency", fmt(h["p99_ms"], 2), "ms", "≤ 5", verdict(h["p99_ms"] <= 5), None))
            bad = h["non2xx"] + h["socket_errors"]
            rows.append(("  non-2xx responses + socket errors", f"{h['non2xx']} + {h['socket_errors']}",
                         f"of {h['requests']:,}", "0", verdict(bad == 0), None))
            rows.append(("  peak RSS under HTTP load", fmt(h["rss_mb"], 1), "MB", "≤ 150", verdict(h["rss_mb"] <= 150),
                         None))
            if "healthz" in h:
                z = h["healthz"]
                rows.append(("  HTTP stack ceiling: GET /healthz (no auth, no database)", fmt(z["rps"]), "req/s", "",
                             "", None))
                rows.append(("  read req/s ÷ HTTP stack ceiling", fmt(h["rps"] / z["rps"], 2), "ratio", "", "", None))
            if "conditional" in h:
                cond = h["conditional"]
                # Results kept from before the same-users run compare with the read of all users.
                base = h.get("conditional_base", h)
                rows.append((f"  conditional read: If-None-Match with the current ETag (304, no body), {CONDITIONAL_USERS:,} users",
                             fmt(cond["rps"]), "req/s", "", "", None))
                if "conditional_base" in h:
                    rows.append((f"  full read of the same {CONDITIONAL_USERS:,} users", fmt(base["rps"]), "req/s", "", "", None))
                # A 304 saves the body's bytes, not the read: the two loads cost nearly the same, and which one wins
                # a run is within the machine's noise. The verdict is that the conditional read is not measurably
                # slower: at least the full read's figure, less the spread between the two turns of one load (how
                # much the same load moved within this minute).
                ratio = cond["rps"] / base["rps"]
                has_turns = bool(cond.get("turns") and base.get("turns"))
                spread = max((max(t) - min(t)) / (sum(t) / len(t)) for t in (cond["turns"], base["turns"])) if has_turns else 0.0
                rows.append(("  conditional ÷ full read (the same users; two turns each, in turns)", fmt(ratio, 3),
                             "ratio", f"≥ {1 - spread:.3f}", verdict(ratio >= 1 - spread), None))
                if has_turns:
                    rows.append(("    req/s of each turn: conditional / full",
                                 ", ".join(f"{a:,.0f} / {b:,.0f}" for a, b in zip(cond["turns"], base["turns"])),
                                 "req/s", "", "", None))
                    rows.append(("    the target: 1.0 less the larger spread between the turns of one load",
                                 f"{spread:.1%}", "", "", "", None))
                if cond.get("daemon_cpu_s") is not None and base.get("daemon_cpu_s") is not None and cond["requests"] and base["requests"]:
                    rows.append(("    metricsd's CPU per request: conditional / full",
                                 f"{cond['daemon_cpu_s'] / cond['requests'] * 1e6:.1f} / {base['daemon_cpu_s'] / base['requests'] * 1e6:.1f}",
                                 "µs", "", "", None))
            if "log_all" in h:
                a = h["log_all"]
                rows.append(("  the same read, METRICSD_REQUEST_LOG=all (a line per request)", fmt(a["rps"]), "req/s",
                             "", "", None))
                rows.append(("  its cost: req/s lost to the request log", f"{(1 - a['rps'] / h['rps']):.0%}", "", "", "",
                             None))
            if "ceiling" in r:
                ratio = h["rps"] / r["ceiling"]["tps"]
                rows.append(("HTTP req/s ÷ DB ceiling (the same users, drawn from all of them, on both sides)",
                             fmt(ratio, 2), "ratio", f"≥ {self.TARGET_RATIO}", verdict(ratio >= self.TARGET_RATIO), None))
                # The database's own CPU per read on each side (the bench cluster's processes, from /proc): steadier
                # than req/s on a shared machine, and what a read costs the database server through metricsd.
                ceiling_cpu, http_cpu = c.get("ceiling"), c.get("http")
                if ceiling_cpu and http_cpu and h.get("requests"):
                    transactions = r["ceiling"].get("transactions") or r["ceiling"]["tps"] * ceiling_cpu["seconds"]
                    per_tx = ceiling_cpu["database_s"] / max(1, transactions) * 1e6
                    per_read = http_cpu["database_s"] / max(1, h["requests"]) * 1e6
                    rows.append(("  database CPU per read: pgbench's single-user statement / through metricsd",
                                 f"{per_tx:.1f} / {per_read:.1f}", "µs", "", "", None))
                    rows.extend(self.cpu_budget_rows(r["ceiling"], h, transactions, per_tx, per_read))
        if "sqlbound" in r:
            s = r["sqlbound"]
            rows.append((f"SQL bound: one INSERT … SELECT, {n:,} users", fmt(s["users_per_s"]), "users/s", "", "",
                         "sqlbound"))
            rows.append(("  its duration", fmt(s["seconds"], 2), "s", "", "", None))
            rows.append(("  CPU used by the processes under test", fmt(cpu_seconds("sqlbound"), 1), "CPU-s", "", "",
                         None))
        if "recompute" in r:
            x = r["recompute"]
            rows.append((f"recompute-all, {x['users']:,} users (`recompute-all --wait`, wall time)",
                         fmt(x["users_per_s_cli"]), "users/s", "", "", "recompute"))
            rows.append(("  its wall time (job created -> done by the database clock)",
                         f"{x['cli_seconds']:.2f} ({x['seconds']:.2f})", "s", "", "", None))
            rows.append(("  CPU used by the processes under test", fmt(cpu_seconds("recompute"), 1), "CPU-s", "", "",
                         None))
            rows.append(("  users skipped / skip records written", f"{x['skipped']:,} / {x['skip_records']:,}", "users",
                         "", "", None))
            if x.get("mismatches_vs_sql") is not None:
                rows.append(("  users whose values differ from the SQL bound's", fmt(x["mismatches_vs_sql"]), "users",
                             "0", verdict(x["mismatches_vs_sql"] == 0), None))
            rows.append((f"  peak RSS during recompute-all of {x['users']:,}", fmt(x["rss_mb"], 1), "MB", "≤ 150",
                         verdict(x["rss_mb"] <= 150), None))
            if "sqlbound" in r:
                ratio = x["users_per_s_cli"] / r["sqlbound"]["users_per_s"]
                rows.append(("recompute users/s ÷ SQL bound", fmt(ratio, 2), "ratio", "≥ 1.0", verdict(ratio >= 1.0),
                             None))
        if "daily" in r:
            d = r["daily"]
            rows.append((f"daily unit, {d['users']:,} users in {d['zone']} (created -> done)", fmt(d["users_per_s"]),
                         "users/s", "", "", "daily"))
            rows.append(("  its duration (exec -> done)", f"{d['seconds']:.2f} ({d['exec_to_done']:.2f})", "s", "", "",
                         None))
            rows.append(("  CPU used by the processes under test (from the due instant)", fmt(cpu_seconds("daily"), 1), "CPU-s",
                         "", "", None))
            rows.append(("  peak RSS during the daily unit", fmt(d["rss_mb"], 1), "MB", "≤ 150",
                         verdict(d["rss_mb"] <= 150), None))
            rows.append(("  due instant -> last row committed (as an operator sees it)", fmt(d["due_seconds"], 2), "s",
                         "", "", None))
            if "recompute" in r:
                ratio = d["users_per_s"] / r["recompute"]["users_per_s_cli"]
                rows.append(("daily users/s ÷ recompute users/s", fmt(ratio, 2), "ratio", "≥ 0.9", verdict(ratio >= 0.9),
                             None))
                ratio = d["users_per_s_due"] / r["recompute"]["users_per_s_cli"]
                rows.append(("  the same from the due instant (users ÷ due -> last row)", fmt(ratio, 2), "ratio", "≥ 0.9",
                             verdict(ratio >= 0.9), None))
        if "startup" in r:
            s = r["startup"]
            rows.append((f"start-up: exec -> READY=1, median of {s['runs']}", fmt(s["median_ms"]), "ms", "≤ 1000",
                         verdict(s["median_ms"] <= 1000), "startup"))
        if "rss" in r:
            x = r["rss"]
            rows.append((f"peak RSS during recompute-all of {x['users']:,} users", fmt(x["rss_mb"], 1), "MB", "≤ 150",
                         verdict(x["rss_mb"] <= 150), "rss"))
            rows.append(("  its rate", fmt(x["users_per_s"]), "users/s", "", "", None))

        rows += self.hostile_rows(fmt, verdict)
        rows += self.standby_rows(fmt, verdict)
        rows += self.eventloop_rows(fmt, verdict)
        rows += self.bulkdelete_rows(fmt, verdict)
        rows += self.readindex_rows(fmt, verdict)
        rows += self.pooler_rows(fmt, verdict)
        rows += self.tracing_rows(fmt, verdict)
        rows += self.floor_rows(fmt, verdict)

        header = ("figure", "value", "unit", "target", "result", "cpu: machine/under test/others (runs)")
        lines = []
        for fig, val, unit, target, res, step in rows:
            cpu = ""
            if step and step in c:
                s = c[step]
                cpu = f"{s['machine']:.0%} / {s['ours']:.0%} / {s['others']:.0%} ({self.attempts.get(step, 1)})"
            lines.append((fig, val, unit, target, res, cpu))
        widths = [max(len(x[i]) for x in [header] + lines) for i in range(6)]
        out = []
        sep = "  "
        out.append(sep.join(header[i].ljust(widths[i]) for i in range(6)).rstrip())
        out.append(sep.join("-" * widths[i] for i in range(6)))
        for line in lines:
            cells = [line[0].ljust(widths[0]), line[1].rjust(widths[1])] + \
                    [line[i].ljust(widths[i]) for i in range(2, 6)]
            out.append(sep.join(cells).rstrip())
        return "\n".join(out)

    # -- driver -------------------------------------------------------------------------------------------

    def main(self, steps):
        os.makedirs(LOG_DIR, exist_ok=True)
        started = time.monotonic()
        self.build()
        self.ensure_secret()
        say(f"cluster {os.path.relpath(CLUSTER_DIR, ROOT)} on 127.0.0.1:{self.cluster.port}")
        self.cluster.create_and_start()
        growth = None
        failure = None
        try:
            if self.args.growth:
                growth = Growth(self)
                self.db = GROWTH_DB
                try:
                    growth.run()
                except (BenchError, KeyboardInterrupt) as e:
                    failure = e  # the table of what was measured is still printed (and saved) below
                steps = set()
            if "seed" in steps:
                self.results["seed"] = self.seed(DB, self.args.users, self.args.days)
            needs_db = steps & {"ceiling", "http", "sqlbound", "recompute", "daily", "startup", "standby"}
            if needs_db:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                run([common.METRICSD, "migrate"], env=self.daemon_env(0), log=os.path.join(LOG_DIR, "migrate.log"))
                self.users = self.count_users(DB)
                say(f"{self.users:,} users in {DB}")
            for step, fn in (("ceiling", self.ceiling), ("http", self.http), ("sqlbound", self.sqlbound),
                             ("recompute", self.recompute), ("daily", self.daily), ("startup", self.startup),
                             ("standby", self.standby)):
                if step in steps:
                    fn()
            if "rss" in steps:
                if not self.args.rss_users:
                    die("the rss step needs --rss-users N")
                self.rss()
            if "tls" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                if not self.users:
                    self.users = self.count_users(DB)
                self.tls()
            if "hostile" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                self.hostile()
            if "eventloop" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                self.eventloop()
            if "bulkdelete" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                run([common.METRICSD, "migrate"], env=self.daemon_env(0), log=os.path.join(LOG_DIR, "migrate.log"))
                self.users = self.users or self.count_users(DB)
                self.bulkdelete()
            if "readindex" in steps:
                self.users = self.args.users
                self.readindex()
            if "pooler" in steps:
                self.pooler()
            if "tracing" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                run([common.METRICSD, "migrate"], env=self.daemon_env(0), log=os.path.join(LOG_DIR, "migrate.log"))
                self.tracing()
            if "floor" in steps:
                if not self.database_exists(DB):
                    die(f"database {DB} does not exist: run step 1 (seed) first, with --keep to reuse it")
                run([common.METRICSD, "migrate"], env=self.daemon_env(0), log=os.path.join(LOG_DIR, "migrate.log"))
                self.floor()
        finally:
            for p in list(self.children):
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if self.args.keep:
                say(f"keeping the cluster (stopped): {os.path.relpath(CLUSTER_DIR, ROOT)}")
                self.cluster.stop()
            else:
                say("destroying the bench cluster")
                self.cluster.destroy()
            if growth:
                growth.cap.destroy()
        elapsed = time.monotonic() - started
        table = growth.table() if growth else self.table()
        cfg = "default configuration" if not self.extra_env else \
            "NOT the default configuration: " + " ".join(f"{k}={v}" for k, v in self.extra_env.items())
        what = []
        if growth and self.args.month_only:
            what.append(f"growth: the simulated month only ({self.args.month_users:,} users, retention "
                        f"{self.args.retention_days} days, {self.args.month_days} days)")
        elif growth:
            what.append(f"growth: {self.args.users:,} users at {', '.join(map(str, growth.depths))} days of history "
                        f"({' and '.join(growth.layouts)} layout), "
                        f"{self.args.duration} s reads; capped: "
                        + ", ".join(f"{cap[0]} MB (shared_buffers {cap[1]} MB)" for cap in growth.caps)
                        + f" ({growth.cap.describe()})")
        elif self.users or "seed" in steps:
            what.append(f"{self.users or self.args.users:,} users"
                        + (f", {self.args.days} days of history" if "seed" in steps else "")
                        + f", {self.args.duration} s runs")
        if "rss" in self.results:
            what.append(f"rss step: {self.args.rss_users:,} users, {self.args.rss_days} day(s) of history")
        head = (f"metricsd benchmark: {'; '.join(what)}; {os.cpu_count()} CPUs, {cfg}; "
                f"total {elapsed / 60:.1f} min\n"
                f"command: {' '.join(['scripts/bench'] + sys.argv[1:])}")
        print()
        print(head)
        print(table)
        if self.log_problems:
            print(f"\nmetricsd logged {len(self.log_problems)} warning/error line(s) (logs in "
                  f"{os.path.relpath(LOG_DIR, ROOT)}), first ones:")
            for name, line in self.log_problems[:10]:
                print(f"  [{name}] {line}")
        else:
            print("\nmetricsd logged no warnings or errors.")
        if failure:
            print(f"\nthe run stopped early: {failure or 'interrupted'}")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        with open(os.path.join(BENCH_DIR, f"results-{stamp}.json"), "w") as f:
            json.dump({"command": sys.argv, "results": self.results, "growth": growth.results if growth else None, "cpu": self.cpu, "attempts": self.attempts,
                       "log_problems": self.log_problems, "elapsed_seconds": elapsed}, f, indent=2, default=str)
        with open(os.path.join(BENCH_DIR, f"results-{stamp}.txt"), "w") as f:
            f.write(head + "\n" + table + "\n")
        if failure:
            raise failure


# ----------------------------------------------------------------------------------------------------------
# growth mode: the same users at several history depths, in memory and with the server's memory capped
