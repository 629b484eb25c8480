"""Paths, constants and the parts every step uses: commands, /proc CPU accounting, the bench cluster, psql, the daemon as systemd runs it."""

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import types


# scripts/metricsd_bench/common.py -> the checkout
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DIR = os.path.join(ROOT, ".local", "bench")
LOG_DIR = os.path.join(BENCH_DIR, "logs")
CLUSTER_DIR = os.path.join(ROOT, ".local", "bench-pg")
PG_CLUSTER = os.path.join(ROOT, "scripts", "pg-cluster")
SCRATCH = os.path.join(ROOT, ".build-bench")
METRICSD = os.path.join(SCRATCH, "release", "metricsd")
DB = "metricsd_bench"
RSS_DB = "metricsd_bench_rss"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The conditional read and the full read it is compared with draw from the same first users of the token file.
CONDITIONAL_USERS = 2000
# A bulk load switches off the trigger that keeps profile_metrics_latest (each user's newest row) for the rows it
# copies, and refills that table once afterwards: one probe per user instead of a sort of every loaded row. A
# database of a release without the table is loaded as before.
LATEST_TRIGGER_OFF = ("DO $$ BEGIN IF to_regclass('profile_metrics_latest') IS NOT NULL THEN "
                      "ALTER TABLE profile_metrics DISABLE TRIGGER metricsd_latest_inserted; END IF; END $$;")
LATEST_TRIGGER_ON = ("DO $$ BEGIN IF to_regclass('profile_metrics_latest') IS NOT NULL THEN "
                     "PERFORM metricsd_latest_rebuild(); "
                     "ALTER TABLE profile_metrics ENABLE ALWAYS TRIGGER metricsd_latest_inserted; END IF; END $$;")
# The end of every wrk script that sends one of `requests` (formatted when wrk starts) at random: each thread seeds
# its own generator, so the two threads do not send the same sequence.
WRK_RANDOM_REQUEST = """local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end
function init(args)
  math.randomseed(os.time() * 1000 + (id or 0) * 7919)
end
function request()
  return requests[math.random(#requests)]
end
"""
OTHERS_LIMIT = 0.10  # repeat a timed step when other processes used more than this share of the machine
STEAL_LIMIT = 0.005  # or when the host took more than this share of it (steal time of a virtual machine)
MAX_ATTEMPTS = 3
TOKENS = 4000

STEP_NAMES = ["seed", "ceiling", "http", "sqlbound", "recompute", "daily", "startup", "table", "rss", "hostile", "tls",
              "standby", "eventloop", "bulkdelete", "readindex", "pooler", "tracing", "floor"]
NGINX_EXAMPLE = os.path.join(ROOT, "systemd", "examples", "nginx-metricsd.conf")
STANDBY_DIR = os.path.join(ROOT, ".local", "bench-pg-standby")

# (zone, weight): where the users of a consumer health app live, roughly; ~55 zones including the
# unusual offsets (+05:45, +12:45/+13:45, +14, -12, -03:30, 30-minute DST) and DST changes at midnight.
ZONES = [
    ("America/New_York", 12), ("America/Chicago", 6), ("America/Denver", 2), ("America/Phoenix", 1),
    ("America/Los_Angeles", 8), ("America/Anchorage", 0.5), ("Pacific/Honolulu", 0.5), ("America/Toronto", 3),
    ("America/Halifax", 0.5), ("America/St_Johns", 0.3), ("America/Mexico_City", 3), ("America/Bogota", 1),
    ("America/Sao_Paulo", 4), ("America/Argentina/Buenos_Aires", 2), ("America/Santiago", 1),
    ("America/Havana", 0.3), ("America/Caracas", 0.5), ("Atlantic/Azores", 0.1), ("Europe/London", 6),
    ("Europe/Dublin", 1), ("Europe/Lisbon", 1), ("Europe/Madrid", 3), ("Europe/Paris", 4), ("Europe/Berlin", 5),
    ("Europe/Rome", 3), ("Europe/Amsterdam", 2), ("Europe/Warsaw", 2), ("Europe/Istanbul", 2),
    ("Europe/Moscow", 3), ("Africa/Casablanca", 1), ("Africa/Lagos", 2), ("Africa/Cairo", 2),
    ("Africa/Johannesburg", 1), ("Africa/Nairobi", 1), ("Asia/Jerusalem", 1), ("Asia/Beirut", 0.3),
    ("Asia/Tehran", 1), ("Asia/Dubai", 2), ("Asia/Karachi", 2), ("Asia/Kolkata", 8), ("Asia/Kathmandu", 0.5),
    ("Asia/Dhaka", 1), ("Asia/Bangkok", 2), ("Asia/Jakarta", 3), ("Asia/Singapore", 2), ("Asia/Manila", 2),
    ("Asia/Shanghai", 3), ("Asia/Seoul", 2), ("Asia/Tokyo", 4), ("Australia/Perth", 1),
    ("Australia/Adelaide", 0.5), ("Australia/Sydney", 3), ("Australia/Lord_Howe", 0.1), ("Pacific/Auckland", 1),
    ("Pacific/Chatham", 0.1), ("Pacific/Kiritimati", 0.1), ("Etc/GMT+12", 0.05), ("UTC", 1),
]
UNKNOWN_ZONE = "Mars/Olympus_Mons"

# Every kind of bad settings the typed columns can hold (a malformed number or date cannot be stored).
BAD_KINDS = [
    "no_settings", "onboarding_incomplete", "dob_missing", "gender_missing", "weight_missing",
    "height_missing", "activity_missing", "height_72", "weight_350", "weight_29.5", "height_251", "age_12",
    "age_121", "gender_robot", "activity_couch", "timezone_unknown",
]
BAD_SHARE = 0.02
GENDERS = ["female", "male", "other"]
GENDER_CONSTANT = {"male": 5, "female": -161, "other": -78}
ACTIVITY = {"sedentary": 1200, "lightly_active": 1375, "moderately_active": 1550, "very_active": 1725,
            "extremely_active": 1900}


# ----------------------------------------------------------------------------------------------------------
# small helpers

def say(message):
    print(f"bench: {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


def die(message):
    raise BenchError(message)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, log=None, check=True, env=None, input_text=None, timeout=None):
    """Runs a command; its output goes to `log` (a path) or is returned."""
    if log:
        with open(log, "a") as f:
            f.write(f"\n$ {' '.join(cmd)}\n")
            f.flush()
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, input=input_text, text=True,
                               timeout=timeout)
        if check and p.returncode != 0:
            die(f"{' '.join(cmd[:3])} … failed (exit {p.returncode}); see {log}")
        return p
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, input=input_text, timeout=timeout)
    if check and p.returncode != 0:
        die(f"{' '.join(cmd[:4])} … failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return p


def load_mint_token():
    """scripts/mint-token's code (the token logic the demo and tests use), imported as a module."""
    path = os.path.join(ROOT, "scripts", "mint-token")
    with open(path) as f:
        source = f.read()
    module = types.ModuleType("mint_token")
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)  # no __pycache__ next to the script
    return module


def latest_metrics_sql():
    """SQL.latestMetrics, verbatim from the source."""
    path = os.path.join(ROOT, "Sources", "MetricsdReads", "SQL+Serving.swift")
    with open(path) as f:
        text = f.read()
    m = re.search(r'static let latestMetrics = """\n(.*?)\n\s*"""', text, re.S)
    if not m:
        die(f"cannot find `static let latestMetrics` in {path}")
    lines = m.group(1).split("\n")
    indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
    return "\n".join(l[indent:] for l in lines)


def round_half_up(n, d):
    q = (2 * abs(n) + d) // (2 * d)
    return -q if n < 0 else q


# ----------------------------------------------------------------------------------------------------------
# CPU accounting from /proc

def read_proc_table(only=None):
    """pid -> (ppid, jiffies of the process and its reaped children)."""
    table = {}
    for name in ([str(only)] if only else os.listdir("/proc")):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(")") + 2:].split()
        # fields after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
        table[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]))
    return table


def process_cpu_s(pid):
    """CPU seconds a live process has used (all its threads), or None when it is gone."""
    entry = read_proc_table(only=pid).get(pid)
    return None if entry is None else entry[1] / CLK_TCK


def children_cpu_s():
    """CPU seconds of this script's reaped children: a delta around `run()` is that command's own CPU."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def descendants(table, root, exclude=()):
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        for c in children.get(pid, []):
            if c in exclude:
                continue
            out.append(c)
            stack.append(c)
    return out


def machine_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait, steal


class CpuMeter:
    """CPU used while a step runs: the machine, the processes under test, and everybody else.

    Processes under test: the bench cluster's postmaster and its children (exited backends are counted
    through the postmaster's cutime/cstime), those of `other_clusters` (the standby step's standby) and this
    script's own tree (itself, reaped children through
    RUSAGE_CHILDREN, live children such as metricsd, wrk and pgbench with their own reaped children).
    """

    def __init__(self, postmaster_pid):
        self.postmaster = postmaster_pid
        self.other_clusters = []  # postmaster pids of further clusters under test (a standby)

    def _scan(self):
        # The postmaster first, then its children: a backend reaped between the two reads is missed (counted
        # neither alive nor in the postmaster's cutime) but never counted twice; _ours takes the larger of
        # two scans, so a reap during one scan does not lose its time.
        pm = read_proc_table(only=self.postmaster).get(self.postmaster)
        table = read_proc_table()
        total = 0
        if pm is not None:
            total += pm[1]
            total += sum(table[p][1] for p in descendants(table, self.postmaster) if p in table)
        total += sum(cluster_jiffies(pid, table) for pid in self.other_clusters)
        me = os.getpid()
        mine = descendants(table, me, exclude={self.postmaster})
        total += sum(table[p][1] for p in mine if p in table)
        ru_self = resource.getrusage(resource.RUSAGE_SELF)
        ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += round((ru_self.ru_utime + ru_self.ru_stime + ru_kids.ru_utime + ru_kids.ru_stime) * CLK_TCK)
        return total

    def ours(self):
        return max(self._scan(), self._scan())

    def start(self):
        self.t0 = time.monotonic()
        self.m0 = machine_jiffies()
        self.o0 = self.ours()
        self.d0 = cluster_jiffies(self.postmaster)  # the bench cluster alone: the database's CPU

    def stop(self):
        busy1, total1, steal1 = machine_jiffies()
        time.sleep(0.05)  # let the postmaster reap backends that were just disconnecting
        o1 = self.ours()
        d1 = cluster_jiffies(self.postmaster)
        dtot = max(1, total1 - self.m0[1])
        busy = (busy1 - self.m0[0]) / dtot
        ours = min(busy, max(0.0, (o1 - self.o0) / dtot))
        return {"machine": busy, "ours": ours, "others": max(0.0, busy - ours), "steal": (steal1 - self.m0[2]) / dtot,
                "seconds": time.monotonic() - self.t0, "database_s": max(0, d1 - self.d0) / CLK_TCK}


class RssWatcher:
    """Polls a process's VmRSS every 100 ms (a cross-check; VmHWM at the end is the figure)."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_kb = 0
        self.hwm_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                text = f.read()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            elif line.startswith("VmHWM:"):
                self.hwm_kb = max(self.hwm_kb, int(line.split()[1]))

    def _run(self):
        while not self._stop.wait(0.1):
            self._read()

    def stop(self):
        self._read()
        self._stop.set()
        self._thread.join()
        return max(self.hwm_kb, self.peak_kb) / 1024.0


# ----------------------------------------------------------------------------------------------------------
# the cluster

class Cluster:
    def __init__(self, port):
        self.port = port
        self.psql_bin = os.path.join(self.bindir(), "psql")

    @staticmethod
    def bindir():
        p = run([PG_CLUSTER, "bindir"])
        return p.stdout.strip()

    def url(self, db):
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}?sslmode=disable"

    def create_and_start(self):
        run([PG_CLUSTER, "create", CLUSTER_DIR, str(self.port)], log=os.path.join(LOG_DIR, "pg-cluster.log"))
        run([PG_CLUSTER, "start", CLUSTER_DIR], log=os.path.join(LOG_DIR, "pg-cluster.log"))

    def exists(self):
        return os.path.exists(os.path.join(CLUSTER_DIR, "data", "PG_VERSION"))

    def postmaster_pid(self):
        with open(os.path.join(CLUSTER_DIR, "data", "postmaster.pid")) as f:
            return int(f.readline().strip())

    def psql(self, db, sql, check=True, timeout=None):
        p = run([self.psql_bin, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", self.url(db), "-c", sql],
                check=check, timeout=timeout)
        return p.stdout.strip()

    def value(self, db, sql):
        return self.psql(db, sql).split("\n")[0]

    def session(self, db):
        return PsqlSession(self.psql_bin, self.url(db))

    def stop(self):
        run([PG_CLUSTER, "stop", CLUSTER_DIR], check=False, log=os.path.join(LOG_DIR, "pg-cluster.log"))

    def destroy(self):
        run([PG_CLUSTER, "destroy", CLUSTER_DIR], check=False, log=os.path.join(LOG_DIR, "pg-cluster.log"))


class PsqlSession:
    """One psql connection for polling (a new psql per poll would cost the machine more than the poll)."""

    def __init__(self, psql_bin, url):
        self.proc = subprocess.Popen([psql_bin, "-X", "-q", "-At", "-d", url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def query(self, sql):
        self.proc.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo __bench_end__\n")
        self.proc.stdin.flush()
        lines = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                die("the polling psql session ended: " + "".join(lines)[-500:])
            if line.rstrip("\n") == "__bench_end__":
                return lines
            lines.append(line.rstrip("\n"))

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


# ----------------------------------------------------------------------------------------------------------
# metricsd processes

class Daemon:
    """`metricsd serve` started as systemd would: NOTIFY_SOCKET, and timed from exec to READY=1."""

    def __init__(self, bench, name, env_extra=None):
        self.bench = bench
        self.name = name
        self.port = free_port()
        self.log_path = os.path.join(LOG_DIR, f"metricsd-{name}.log")
        sock_path = os.path.join(BENCH_DIR, f"notify-{os.getpid()}.sock")
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(sock_path)
        self.sock_path = sock_path
        env = bench.daemon_env(self.port)
        env["NOTIFY_SOCKET"] = sock_path
        env.update(env_extra or {})
        self.env = env
        self.log = open(self.log_path, "w")
        self.t_exec = time.monotonic()
        self.wall_exec = time.time()
        self.proc = subprocess.Popen([METRICSD, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        bench.children.add(self.proc)
        self.notifications = 0
        self.ready_seconds = self._wait_ready()
        # Keep reading, as systemd does: sd_notify blocks the sender once 10 datagrams are queued
        # (net.unix.max_dgram_qlen), and metricsd sends a STATUS= line per chunk.
        self._draining = True
        self._drain_thread = threading.Thread(target=self._drain, daemon=True)
        self._drain_thread.start()

    def _drain(self):
        self.sock.settimeout(0.2)
        while self._draining:
            try:
                self.sock.recv(4096)
                self.notifications += 1
            except socket.timeout:
                continue
            except OSError:
                return

    def _wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                self.bench.children.discard(self.proc)
                die(f"metricsd ({self.name}) sent no READY=1 within {timeout} s; see {self.log_path}")
            self.sock.settimeout(min(0.2, left))
            try:
                data = self.sock.recv(4096).decode("utf-8", "replace")
            except socket.timeout:
                if self.proc.poll() is not None:
                    die(f"metricsd ({self.name}) exited with {self.proc.returncode} before READY=1; "
                        f"see {self.log_path}")
                continue
            self.notifications += 1
            if "READY=1" in data.split("\n"):
                return time.monotonic() - self.t_exec

    @property
    def pid(self):
        return self.proc.pid

    def hwm_mb(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return None

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.bench.children.discard(self.proc)
        self.log.close()
        self._draining = False
        self._drain_thread.join()
        self.sock.close()
        if os.path.exists(self.sock_path):
            os.unlink(self.sock_path)
        self.bench.scan_log(self.name, self.log_path)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ----------------------------------------------------------------------------------------------------------
# hostile clients (step hostile): what misbehaving clients cost the daemon and everyone else

def raise_open_files():
    """Lifts this process's (and its children's) open-file limit to the hard limit: 1,000+ sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def resident_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def open_server_connections(port):
    """Connections the server on 127.0.0.1:port still holds open (its sockets in ESTABLISHED or CLOSE_WAIT)."""
    suffix = f":{port:04X}"
    count = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[1].endswith(suffix) and fields[3] in ("01", "08"):
                count += 1
    return count


def accept_queue(port):
    """Connections waiting in the listener's accept queue (rx_queue of its LISTEN row)."""
    suffix = f":{port:04X}"
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[1].endswith(suffix) and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    return None


def timed_get(port, path, timeout=5.0):
    """One GET on a fresh connection: (status, seconds) or (None, seconds) when there is no whole answer."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
        return status, time.monotonic() - t0
    except OSError:
        return None, time.monotonic() - t0


def cluster_jiffies(postmaster_pid, table=None):
    """CPU jiffies of a cluster: its postmaster, every live child (backends, walsender/walreceiver, startup) and the
    children it reaped (cutime/cstime)."""
    table = table if table is not None else read_proc_table()
    if postmaster_pid not in table:
        return 0
    return table[postmaster_pid][1] + sum(table[p][1] for p in descendants(table, postmaster_pid) if p in table)
