"""The command line of scripts/bench."""

import argparse
import os
import re
import signal
import sys

from .common import BENCH_DIR, BenchError, STEP_NAMES
from .core import Bench
from .growth import default_shared_buffers
from .hostile import HOSTILE_PARTS
from . import common


def parse_caps(text):
    """--cap-mb: a list of caps, each `MB` (shared_buffers a third of it) or `MB:SB` (shared_buffers SB MB)."""
    caps = []
    for part in text.split(","):
        limit, _, sb = part.partition(":")
        caps.append((int(limit), int(sb) if sb else default_shared_buffers(int(limit))))
    return caps


GROWTH_MEASURES = ("history", "daily", "recompute")


def parse_growth_measures(text):
    """--growth-measures: which of history, daily and recompute each depth and memory measures besides the latest
    read (comma-separated; default all)."""
    measures = {x.strip() for x in text.split(",") if x.strip()}
    if not measures <= set(GROWTH_MEASURES):
        raise argparse.ArgumentTypeError(f"--growth-measures takes some of {','.join(GROWTH_MEASURES)}, got '{text}'")
    return measures


def parse_layouts(text):
    """--layouts: monthly, upgrade or both (comma-separated)."""
    layouts = [x.strip() for x in text.split(",") if x.strip()]
    if not layouts or not set(layouts) <= {"monthly", "upgrade"}:
        raise argparse.ArgumentTypeError(f"--layouts takes monthly, upgrade or both, got '{text}'")
    return [x for x in ("monthly", "upgrade") if x in layouts]


def parse_steps(text):
    if not text:
        return None
    steps = set()
    for part in text.split(","):
        part = part.strip().lower()
        if re.fullmatch(r"\d+-\d+", part):
            a, b = map(int, part.split("-"))
            for i in range(a, b + 1):
                if 1 <= i <= 8:
                    steps.add(STEP_NAMES[i - 1])
        elif part.isdigit() and 1 <= int(part) <= 8:
            steps.add(STEP_NAMES[int(part) - 1])
        elif part in STEP_NAMES:
            steps.add(part)
        else:
            raise argparse.ArgumentTypeError(f"unknown step '{part}' (1-8 or {', '.join(STEP_NAMES)})")
    return steps


def main(doc):
    """Runs scripts/bench; `doc` is its usage text (the launcher's docstring)."""
    parser = argparse.ArgumentParser(prog="scripts/bench", usage=argparse.SUPPRESS, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--only", type=parse_steps)
    parser.add_argument("--rss-users", type=int)
    parser.add_argument("--rss-days", type=int, default=1)
    parser.add_argument("--startup-runs", type=int, default=5)
    parser.add_argument("--daily-tick", type=float)
    parser.add_argument("--daemon-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--port", type=int, default=55450)
    parser.add_argument("--growth", action="store_true")
    parser.add_argument("--depths", type=lambda t: [int(x) for x in t.split(",")], default=[30, 365, 730])
    parser.add_argument("--cap-mb", type=parse_caps)
    parser.add_argument("--growth-attempts", type=int, default=3)
    parser.add_argument("--month-only", action="store_true")
    parser.add_argument("--layouts", type=parse_layouts, default=["monthly", "upgrade"])
    parser.add_argument("--growth-measures", type=parse_growth_measures, default=set(GROWTH_MEASURES))
    parser.add_argument("--retention-days", type=int, default=400)
    parser.add_argument("--retention-seconds", type=int, default=60)
    parser.add_argument("--month-days", type=int, default=30)
    parser.add_argument("--month-users", type=int, default=20000)
    parser.add_argument("--month-pause", type=float, default=3)
    parser.add_argument("--hostile-seconds", type=int, default=60)
    parser.add_argument("--hostile-parts", type=lambda t: set(t.split(",")), default=set(HOSTILE_PARTS))
    parser.add_argument("--never-read-rounds", type=int, default=3)
    parser.add_argument("--perf-record", action="store_true")
    parser.add_argument("--binary", metavar="PATH")
    args = parser.parse_args()
    if args.binary:
        common.METRICSD = os.path.abspath(args.binary)
        args.skip_build = True
    if args.growth:
        if not any(a == "--users" or a.startswith("--users=") for a in sys.argv[1:]):
            args.users = 100_000
        if args.cap_mb is None:
            mb = max(128, round(args.users * 192 / 20000))
            args.cap_mb = [(mb, default_shared_buffers(mb))]
        if min(args.depths) < 1 or min(cap[0] for cap in args.cap_mb) < 64:
            parser.error("--depths ≥ 1, --cap-mb ≥ 64")
    if args.users < 100 or args.days < 1 or args.duration < 1:
        parser.error("--users ≥ 100, --days ≥ 1, --duration ≥ 1")
    if not args.hostile_parts <= set(HOSTILE_PARTS) or args.never_read_rounds < 1:
        parser.error(f"--hostile-parts takes some of {','.join(HOSTILE_PARTS)}; --never-read-rounds ≥ 1")
    for kv in args.daemon_env:
        if "=" not in kv:
            parser.error(f"--daemon-env expects KEY=VALUE, got {kv!r}")
    steps = args.only or set(STEP_NAMES[:8]) | {"hostile", "standby"} | ({"rss"} if args.rss_users else set())
    os.makedirs(BENCH_DIR, exist_ok=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    bench = Bench(args)
    try:
        bench.main(steps)
    except BenchError as e:
        print(f"scripts/bench: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("scripts/bench: interrupted", file=sys.stderr)
        sys.exit(130)
