"""Step eventloop: what each kind of request costs the event loop."""

import base64
import json
import os
import re
import subprocess
import threading
import time

from .common import BENCH_DIR, Daemon, LOG_DIR, die, load_mint_token, run, say, timed_get

EVENTLOOP_TOKENS = 500
# NIO's event-loop threads: those of MultiThreadedEventLoopGroup.singleton (the server's), or of a group of its own.
EVENT_LOOP_THREADS = ("NIO-SGLTN", "NIO-ELT")


def mint_asymmetric_tokens(alg, ids, key_path, tokens_path):
    """Tokens for `ids` signed with a fresh key of `alg` (ES256 or EdDSA), in the header form the GTSD API writes;
    the public key goes to key_path (PEM). Needs python3-cryptography."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
    mint = load_mint_token()
    key = ec.generate_private_key(ec.SECP256R1()) if alg == "ES256" else ed25519.Ed25519PrivateKey.generate()
    with open(key_path, "wb") as f:
        f.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo))
    now = int(time.time())
    with open(tokens_path, "w") as f:
        for uid in ids:
            signing_input = (mint.b64url(mint.compact_json({"alg": alg, "typ": "JWT"})) + "."
                             + mint.b64url(mint.compact_json({"sub": uid, "iat": now, "exp": now + 86400})))
            if alg == "ES256":
                r, s_ = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
                signature = r.to_bytes(32, "big") + s_.to_bytes(32, "big")
            else:
                signature = key.sign(signing_input.encode())
            f.write(signing_input + "." + mint.b64url(signature) + "\n")


def thread_cpu_ms(perf_output):
    """`perf stat --per-thread -e task-clock` output -> {thread name: CPU ms} (threads of one name summed)."""
    out = {}
    for line in perf_output.splitlines():
        m = re.match(r"\s*(.+)-(\d+)\s+([\d,.]+)\s+msec\s+task-clock", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3).replace(",", ""))
    return out


class EventLoopLoads:
    """The `eventloop` step, mixed into Bench: one daemon per key kind (the HS256 secret, plus an ES256 or an
    EdDSA public key), and for each load a `wrk -t1 -c16` run of --duration seconds with `perf stat --per-thread
    -e task-clock` on the daemon beside it: requests/s, p99, the CPU its event-loop threads (NIO-SGLTN-*) and its
    other threads spent per request, and the slowest of the GET /healthz probes (a fresh connection every 20 ms)
    beside it. Loads: /healthz, /metrics, /openapi.yaml, the latest read with an HS256, ES256 and EdDSA token, a
    404 flood (unknown route) and a 401 flood (a token with a wrong signature), the last two logging a request
    log line each (METRICSD_REQUEST_LOG=errors, the default). With --perf-record, each run is also recorded by
    `perf record -g` (logs/perf-<load>.data; `perf report -i …`)."""

    def eventloop(self):
        say(f"step eventloop: event-loop CPU per request by kind of request (wrk -t1 -c16, {self.args.duration} s each)")
        self.mark_daily_done(self.db, 1)
        hs_path, count = self.make_tokens()
        if count == 0:
            die("no users with metrics to mint tokens for")
        with open(hs_path) as f:
            hs_tokens = [line.strip() for line in f][:EVENTLOOP_TOKENS]
        ids = [json.loads(base64.urlsafe_b64decode(t.split(".")[1] + "=" * (-len(t.split(".")[1]) % 4)))["sub"]
               for t in hs_tokens]
        bad_signature = hs_tokens[0][:-4] + ("AAAA" if not hs_tokens[0].endswith("AAAA") else "BBBB")
        results = {}
        for alg in ("ES256", "EdDSA"):
            key_path = os.path.join(BENCH_DIR, f"jwt-{alg}.pem")
            tokens_path = os.path.join(BENCH_DIR, f"tokens-{alg}.txt")
            mint_asymmetric_tokens(alg, ids, key_path, tokens_path)
            daemon = Daemon(self, f"eventloop-{alg}", {"METRICSD_JWT_PUBLIC_KEY_FILE": key_path})
            try:
                loads = [(f"latest read, {alg} token", "/v1/profile/metrics/today",
                          self.wrk_lua(tokens_path, f"today-{alg}.lua"))]
                if alg == "ES256":  # the rest once, on the first daemon
                    loads = [("/healthz", "/healthz", None), ("/metrics", "/metrics", None),
                             ("/openapi.yaml", "/openapi.yaml", None),
                             ("latest read, HS256 token", "/v1/profile/metrics/today", self.wrk_lua(hs_path, "today-HS256.lua"))] + loads + [
                        ("404 flood (unknown route)", "/nowhere", None),
                        ("401 flood (wrong signature)", "/v1/profile/metrics/today", self.header_lua(bad_signature))]
                for name, path, lua in loads:
                    results[name] = self.eventloop_load(daemon, name, path, lua)
            finally:
                daemon.stop()
        self.results["eventloop"] = results
        return results

    def header_lua(self, token):
        lua = os.path.join(BENCH_DIR, "bad-token.lua")
        with open(lua, "w") as f:
            f.write(f'wrk.headers["Authorization"] = "Bearer {token}"\n')
        return lua

    def eventloop_load(self, daemon, name, path, lua):
        url = f"http://127.0.0.1:{daemon.port}{path}"
        wrk = ["wrk", "-t1", "-c16", "--latency"] + (["-s", lua] if lua else [])
        run(wrk + ["-d2s", url], log=os.path.join(LOG_DIR, "wrk-eventloop.log"))  # warm-up
        seconds = self.args.duration
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        stat = subprocess.Popen(["perf", "stat", "--per-thread", "-e", "task-clock", "-p", str(daemon.pid), "--",
                                 "sleep", str(seconds + 1)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        record = None
        if self.args.perf_record:
            record = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-p", str(daemon.pid), "-o",
                                       os.path.join(LOG_DIR, f"perf-{slug}.data"), "--", "sleep", str(seconds + 1)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = threading.Event()
        probes = []

        def prober():
            while not stop.is_set():
                probes.append(timed_get(daemon.port, "/healthz"))
                time.sleep(0.02)

        thread = threading.Thread(target=prober, daemon=True)
        thread.start()
        p = run(wrk + [f"-d{seconds}s", url])
        stop.set()
        thread.join()
        perf_out = stat.communicate()[0]
        if record:
            record.wait()
        with open(os.path.join(LOG_DIR, "wrk-eventloop.log"), "a") as f:
            f.write(f"== {name}\n" + p.stdout + p.stderr + perf_out)
        w = self.parse_wrk(p.stdout)
        cpu = thread_cpu_ms(perf_out)
        requests = (w["requests"] or 0) + len(probes)
        loop_ms = sum(v for k, v in cpu.items() if k.startswith(EVENT_LOOP_THREADS))
        other_ms = sum(v for k, v in cpu.items() if not k.startswith(EVENT_LOOP_THREADS))
        latencies = sorted(t for _, t in probes)
        result = {"rps": w["rps"], "p99_ms": w["p99_ms"], "requests": requests, "non2xx": w["non2xx"],
                  "loop_us_per_request": 1000 * loop_ms / requests if requests else None,
                  "other_us_per_request": 1000 * other_ms / requests if requests else None,
                  "healthz_max_ms": 1000 * latencies[-1] if latencies else None,
                  "healthz_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
                  "healthz_probes": len(latencies), "healthz_failures": sum(1 for st, _ in probes if st != 200)}
        say(f"  {name}: {w['rps']:,.0f} req/s, p99 {w['p99_ms']:.2f} ms; event loop {result['loop_us_per_request']:.1f} µs "
            f"and other threads {result['other_us_per_request']:.1f} µs of CPU per request; /healthz beside it: max "
            f"{result['healthz_max_ms']:.1f} ms of {len(latencies)}")
        return result

    def eventloop_rows(self, fmt, verdict):
        e = self.results.get("eventloop")
        if not e:
            return []
        rows = [("event loop: CPU per request on the event-loop threads / other threads (wrk -t1 -c16)", "", "µs", "", "",
                 None)]
        base = e.get("/healthz", {}).get("loop_us_per_request")
        for name, x in e.items():
            ratio = f" ({x['loop_us_per_request'] / base:.1f} x /healthz)" if base else ""
            rows.append((f"  {name}: {x['rps']:,.0f} req/s, p99 {x['p99_ms']:.2f} ms{ratio}",
                         f"{x['loop_us_per_request']:.1f} / {x['other_us_per_request']:.1f}", "µs", "", "", None))
            rows.append((f"    slowest /healthz probe beside it (of {x['healthz_probes']}; p99 {x['healthz_p99_ms']:.1f} ms)",
                         fmt(x["healthz_max_ms"], 1), "ms", "", "", None))
        return rows


# ----------------------------------------------------------------------------------------------------------
# the benchmark

# ----------------------------------------------------------------------------------------------------------
# step standby: the latest read from a streaming standby beside the primary alone
