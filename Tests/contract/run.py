#!/usr/bin/env python3
"""Contract and fuzz harness for metricsd's HTTP API.

Runs the real daemon against a database of its own and checks every response against the OpenAPI
document in Sources/MetricsdDaemon/Resources/openapi.yaml:

  a. contract checks: hand-written requests producing every documented status of every operation,
     plus hostile inputs; each response is validated (status documented for the operation, content
     type, headers, body schema, X-Request-Id round trip) and checked for meaning (idempotent
     acknowledgement, job ids, ...);
  b. fuzz: schemathesis (pinned, installed into a venv) driven by the document, bounded and seeded,
     with every recorded exchange re-validated here as well;
  c. SIGTERM, exit status 0, database dropped.

Environment:
  METRICSD_BINARY             path of the built metricsd (required unless --self-test)
  METRICSD_TEST_DATABASE_URL  libpq URI of a PostgreSQL 15 server where the user may create databases
  METRICSD_PG_BIN             directory of psql (default /usr/lib/postgresql/15/bin)
  METRICSD_TEST_TMP           where temporary files go (default: the system's temp directory)
  METRICSD_CONTRACT_VENV      the venv with the pinned packages (default <repo>/.local/venv-contract)
  METRICSD_CONTRACT_BULK_USERS  extra valid users inserted before the recompute checks (default 10000)
  METRICSD_CONTRACT_FUZZ_JOBS   schemathesis runs at once (default: 2, or 1 on a one-core machine)

Usage: python3 Tests/contract/run.py [--self-test] [--skip-fuzz] [--fuzz-examples N] [--no-venv]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC_PATH = REPO / "Sources" / "MetricsdDaemon" / "Resources" / "openapi.yaml"

# Every package of the harness's venv, pinned (schemathesis and openapi-spec-validator with their dependencies,
# as resolved together on Debian 12 / CPython 3.11).
PINS = """
schemathesis==4.32.5
openapi-spec-validator==0.9.0
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.18
charset-normalizer==3.5.2
click==8.5.1
graphql-core==3.3.2
harfile==0.6.0
hypothesis==6.170.15
hypothesis-graphql==0.13.5
idna==3.20
iniconfig==2.3.1
jsonschema==4.26.0
jsonschema-path==0.5.0
jsonschema-specifications==2025.9.1
jsonschema_rs==0.60.3
lazy-object-proxy==1.13.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
openapi-schema-validator==0.9.0
packaging==26.3
pathable==0.6.0
pluggy==1.7.0
pydantic==2.14.3
pydantic-settings==2.16.3
pydantic_core==2.50.4
Pygments==2.21.0
pyrate-limiter==4.5.1
pytest==9.2.0
python-dotenv==1.2.4
PyYAML==6.0.3
referencing==0.37.0
requests==2.34.2
rfc3339-validator==0.1.4
rich==15.0.0
rpds-py==2026.9.1
six==1.17.0
sortedcontainers==2.4.0
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9
""".split()

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
STALE_MESSAGE = "Your metrics have been updated. Please refresh and try again."
FUZZ_SEED = 20251029
MIN_FUZZ_REQUESTS = 2000
FUZZ_BUDGET_SECONDS = 270  # all schemathesis runs together
BODY_LIMIT = 16 * 1024

# Text that must never appear in an error body: SQL, stacks, paths, library internals.
LEAK_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bselect\b.+\bfrom\b",
        r"\binsert\s+into\b",
        r"\bupdate\s+\w+\s+set\b",
        r"\bdelete\s+from\b",
        r"\bERROR:\s",
        r"SQLSTATE",
        r"\blibpq\b",
        r"\.swift\b",
        r"Fatal error",
        r"Stack trace|Backtrace|\bat 0x[0-9a-f]+",
        r"/(?:home|root|usr|opt|work|tmp|var)/",
        r"Sources/",
    )
]


def log(line: str = "") -> None:
    print(line, flush=True)


def excerpt(data: bytes | str | None, limit: int = 300) -> str:
    if data is None:
        return "<none>"
    if isinstance(data, bytes):
        text = data.decode("utf-8", errors="replace")
    else:
        text = data
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


# ----------------------------------------------------------------------------------------------------------------
# venv bootstrap


def venv_dir() -> Path:
    if os.environ.get("METRICSD_CONTRACT_VENV"):
        return Path(os.environ["METRICSD_CONTRACT_VENV"])
    return REPO / ".local" / "venv-contract"


def ensure_venv() -> Path:
    """Creates (or reuses) the venv with the pinned packages and returns its python."""
    base = venv_dir()
    base.parent.mkdir(parents=True, exist_ok=True)
    python = base / "bin" / "python"
    want = "\n".join(PINS) + "\n"
    marker = base / "metricsd-contract-requirements.txt"
    with open(str(base) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and marker.exists() and marker.read_text() == want:
            ok = subprocess.run([str(python), "-c", "import schemathesis, openapi_spec_validator"], capture_output=True)
            if ok.returncode == 0:
                return python
        if python.exists() and subprocess.run([str(python), "-c", "pass"], capture_output=True).returncode != 0:
            shutil.rmtree(base)
        started = time.monotonic()
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
        requirements = base / "requirements-pinned.txt"
        requirements.write_text(want)
        log(f"contract: installing {len(PINS)} pinned packages (schemathesis 4.32.5) into {base} …")
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input",
             "--quiet", "-r", str(requirements)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode != 0:
            log(result.stdout[-4000:])
            log(result.stderr[-4000:])
            raise SystemExit("contract: FAIL could not install the pinned packages from PyPI (see pip's output above)")
        marker.write_text(want)
        log(f"contract: venv ready in {time.monotonic() - started:.1f} s")
    return python


# ----------------------------------------------------------------------------------------------------------------
# JWT (HS256, stdlib only)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_jwt(secret: bytes, claims: dict, header: dict | None = None, sign: bool = True) -> str:
    header = header if header is not None else {"alg": "HS256", "typ": "JWT"}
    signing_input = (b64url(json.dumps(header, separators=(",", ":")).encode())
                     + "." + b64url(json.dumps(claims, separators=(",", ":")).encode()))
    if not sign:
        return signing_input + "."
    signature = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def user_claims(user_id, lifetime: int = 3600, **extra) -> dict:
    now = int(time.time())
    claims = {"sub": str(user_id) if isinstance(user_id, int) else user_id, "iat": now, "exp": now + lifetime}
    claims.update(extra)
    return claims


# ----------------------------------------------------------------------------------------------------------------
# The contract: the OpenAPI document and validation of responses against it

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def strict_json(data: bytes):
    """json.loads that rejects NaN/Infinity and duplicate keys, which JSON clients choke on."""

    def constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    def pairs(items):
        result = {}
        for key, value in items:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    return json.loads(data.decode("utf-8"), parse_constant=constant, object_pairs_hook=pairs)


def parse_media_type(value: str) -> tuple[str, dict]:
    parts = [p.strip() for p in value.split(";")]
    params = {}
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            params[k.strip().lower()] = v.strip().strip('"')
    return parts[0].lower(), params


class Operation:
    def __init__(self, method: str, template: str, spec: dict, pointer: str):
        self.method = method.upper()
        self.template = template
        self.spec = spec
        self.pointer = pointer
        self.operation_id = spec.get("operationId", f"{self.method} {template}")
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        self.regex = re.compile("^" + pattern + "$")

    def __repr__(self):
        return f"{self.operation_id} ({self.method} {self.template})"


class Contract:
    BASE = "urn:metricsd:openapi"

    def __init__(self, path: Path):
        import yaml
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        self.path = path
        self.text = path.read_bytes()
        self.doc = yaml.safe_load(self.text)
        self.registry = Registry().with_resource(
            self.BASE, Resource.from_contents(self.doc, default_specification=DRAFT202012))
        self.operations: list[Operation] = []
        for template, item in self.doc["paths"].items():
            for method in HTTP_METHODS:
                if method in item:
                    pointer = "/paths/" + self.escape(template) + "/" + method
                    self.operations.append(Operation(method, template, item[method], pointer))
        self._validators = {}

    @staticmethod
    def escape(token: str) -> str:
        return token.replace("~", "~0").replace("/", "~1")

    def validate_document(self) -> None:
        from openapi_spec_validator import validate

        validate(self.doc)

    def at(self, pointer: str):
        node = self.doc
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            node = node[int(token)] if isinstance(node, list) else node[token]
        return node

    def resolve(self, node, pointer: str):
        """Follows local $refs; returns the target and its JSON pointer."""
        for _ in range(20):
            if not (isinstance(node, dict) and "$ref" in node):
                return node, pointer
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"non-local $ref {ref}")
            pointer = ref[1:]
            node = self.at(pointer)
        raise ValueError(f"$ref loop at {pointer}")

    def route(self, method: str, path: str):
        """(operation or None, methods documented for the path or None when the path is unknown)."""
        path = urllib.parse.urlsplit(path).path
        matching = [op for op in self.operations if op.regex.match(path)]
        if not matching:
            return None, None
        # A literal template beats a templated one (/v1/admin/recompute vs /v1/admin/recompute/{id}).
        matching.sort(key=lambda op: op.template.count("{"))
        fewest = matching[0].template.count("{")
        candidates = [op for op in matching if op.template.count("{") == fewest]
        allowed = sorted({op.method for op in candidates})
        for op in candidates:
            if op.method == method.upper():
                return op, allowed
        return None, allowed

    def operation(self, operation_id: str) -> Operation:
        for op in self.operations:
            if op.operation_id == operation_id:
                return op
        raise KeyError(operation_id)

    def schema_validator(self, pointer: str):
        from jsonschema import Draft202012Validator

        if pointer not in self._validators:
            fragment = urllib.parse.quote(pointer, safe="/~")
            schema = {"$ref": f"{self.BASE}#{fragment}"}
            self._validators[pointer] = Draft202012Validator(
                schema, registry=self.registry, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return self._validators[pointer]

    def response_spec(self, method: str, path: str, status: int):
        """The response object that governs (method, path, status): (label, response, pointer, problems)."""
        op, allowed = self.route(method, path)
        if op is not None:
            responses = op.spec.get("responses", {})
            key = str(status)
            if key not in responses:
                key = f"{str(status)[0]}XX" if f"{str(status)[0]}XX" in responses else "default"
            if key not in responses:
                return (op.operation_id, None, None,
                        [f"status {status} is not documented for {op.operation_id} "
                         f"(documented: {', '.join(sorted(responses))})"])
            response, pointer = self.resolve(responses[key], op.pointer + "/responses/" + key)
            return op.operation_id, response, pointer, []
        if allowed is None:
            label, component = "unknown route", "NotFound"
            expected = 404
        else:
            label, component = f"wrong method (path allows {', '.join(allowed)})", "MethodNotAllowed"
            expected = 405
        pointer = "/components/responses/" + component
        problems = [] if status == expected else [f"{label}: expected {expected} ({component}), got {status}"]
        return label, self.at(pointer), pointer, problems

    def check_response(self, method: str, path: str, status: int, headers: dict, body: bytes,
                       sent_request_id: str | None = None):
        """Validates one response; returns (label, parsed body or None, list of violations)."""
        label, response, pointer, problems = self.response_spec(method, path, status)
        parsed = None
        # X-Request-Id on every response, whatever the documentation of the status says.
        request_ids = headers.get("x-request-id", [])
        if len(request_ids) != 1:
            problems.append(f"header X-Request-Id: expected exactly one, got {len(request_ids)} ({request_ids})")
        else:
            rid = request_ids[0]
            if not REQUEST_ID_RE.match(rid):
                problems.append(f"header X-Request-Id {rid!r} does not match {REQUEST_ID_RE.pattern}")
            if sent_request_id is not None:
                if REQUEST_ID_RE.match(sent_request_id):
                    if rid != sent_request_id:
                        problems.append(f"header X-Request-Id: sent {sent_request_id!r}, got back {rid!r}")
                elif rid == sent_request_id:
                    problems.append(f"header X-Request-Id: the malformed id {sent_request_id!r} was echoed back")
        if response is None:
            return label, parsed, problems
        # Documented headers.
        for name, header in (response.get("headers") or {}).items():
            header, _ = self.resolve(header, pointer + "/headers/" + self.escape(name))
            values = headers.get(name.lower(), [])
            if not values:
                if header.get("required"):
                    problems.append(f"header {name}: required by {pointer} but missing")
                continue
            schema = header.get("schema", {})
            value = values[0]
            if schema.get("type") == "integer":
                try:
                    value = int(value)
                except ValueError:
                    problems.append(f"header {name}: {values[0]!r} is not an integer")
                    continue
            from jsonschema import Draft202012Validator

            for error in Draft202012Validator(schema).iter_errors(value):
                problems.append(f"header {name}: {error.message} (rule {error.validator!r})")
        # Content type and body.
        content = response.get("content") or {}
        if not content:
            if body:
                problems.append(f"{pointer} documents no body, got {excerpt(body, 120)}")
            return label, parsed, problems
        received = headers.get("content-type", [])
        if not received:
            problems.append(f"Content-Type missing; documented: {', '.join(content)}")
            return label, parsed, problems
        got_type, got_params = parse_media_type(received[0])
        media_key = None
        for key in content:
            want_type, want_params = parse_media_type(key)
            if want_type == got_type and all(got_params.get(k) == v for k, v in want_params.items()):
                media_key = key
                break
        if media_key is None:
            problems.append(f"Content-Type {received[0]!r} is not documented ({', '.join(content)})")
            return label, parsed, problems
        charset = got_params.get("charset", "utf-8").lower()
        if charset not in ("utf-8", "utf8"):
            problems.append(f"Content-Type charset {charset!r}: expected utf-8")
        try:
            if got_type == "application/json" or got_type.endswith("+json"):
                parsed = strict_json(body)
            elif got_type in ("application/yaml", "text/yaml", "application/x-yaml"):
                import yaml

                parsed = yaml.safe_load(body.decode("utf-8"))
            else:
                parsed = body.decode("utf-8")
        except Exception as error:  # noqa: BLE001 - any parse failure is a violation
            problems.append(f"body is not valid {got_type}: {error}; body: {excerpt(body)}")
            return label, None, problems
        media = content[media_key]
        if "schema" in media:
            schema_pointer = pointer + "/content/" + self.escape(media_key) + "/schema"
            problems.extend(self.schema_problems(schema_pointer, parsed))
        return label, parsed, problems

    def schema_problems(self, schema_pointer: str, instance) -> list[str]:
        from jsonschema.exceptions import best_match

        node = self.at(schema_pointer)
        name = node["$ref"] if isinstance(node, dict) and "$ref" in node else "#" + schema_pointer
        problems = []
        errors = sorted(self.schema_validator(schema_pointer).iter_errors(instance), key=lambda e: list(e.path))
        for error in errors[:6]:
            detail = error
            rule = "/".join(str(p) for p in error.schema_path)
            if error.context:  # oneOf/anyOf: name the branch error that fits best
                detail = best_match(error.context)
                rule += " -> " + "/".join(str(p) for p in detail.schema_path)
                problems.append(f"body violates {name} at {error.json_path}: {error.validator} failed; closest "
                                f"branch: at {detail.json_path}: {detail.message} (rule: {rule})")
                continue
            problems.append(f"body violates {name} at {detail.json_path}: {detail.message} (rule: {rule})")
        if len(errors) > 6:
            problems.append(f"… and {len(errors) - 6} more schema errors")
        return problems


# ----------------------------------------------------------------------------------------------------------------
# HTTP client


class Response:
    def __init__(self, status: int, headers: dict, body: bytes, elapsed: float):
        self.status = status
        self.headers = headers
        self.body = body
        self.elapsed = elapsed
        self.json = None

    def header(self, name: str):
        values = self.headers.get(name.lower())
        return values[0] if values else None


def http_request(port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None,
                 timeout: float = 30.0, chunked: bool = False) -> Response:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        headers = dict(headers or {})
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        elif body is not None:
            headers["Content-Length"] = str(len(body))
        for name, value in headers.items():
            connection.putheader(name, value)
        try:
            connection.endheaders()
            if body is not None:
                # Send in pieces and stop as soon as the server has answered (a 413 before the whole body).
                step = 16384
                for start in range(0, len(body), step):
                    piece = body[start:start + step]
                    if chunked:
                        piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                    connection.send(piece)
                    if len(body) > step and select.select([connection.sock], [], [], 0)[0]:
                        break
                else:
                    if chunked:
                        connection.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) before reading everything; read its answer below
        raw = connection.getresponse()
        data = raw.read()
        collected: dict[str, list[str]] = {}
        for name, value in raw.getheaders():
            collected.setdefault(name.lower(), []).append(value)
        return Response(raw.status, collected, data, time.monotonic() - started)
    finally:
        connection.close()


# ----------------------------------------------------------------------------------------------------------------
# Results


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.exercised: set[tuple[str, int]] = set()

    def record(self, ok: bool, line: str, details: list[str] | None = None) -> bool:
        if ok:
            self.passed += 1
            log(f"PASS {line}")
        else:
            self.failed += 1
            log(f"FAIL {line}")
            for detail in details or []:
                log(f"       - {detail}")
            self.failures.append(line + ("" if not details else ": " + "; ".join(details[:3])))
        return ok

    def note(self, line: str) -> None:
        self.notes.append(line)
        log(f"NOTE {line}")


# ----------------------------------------------------------------------------------------------------------------
# Offline self-test: the document and the harness's own pieces


def sample_job(**overrides) -> dict:
    job = {"id": 3, "version": 1, "state": "running", "usersTotal": 100, "usersExamined": 42, "usersWritten": 30,
           "usersAlreadyCurrent": 10, "usersSkipped": 2,
           "percent": 40.0, "ratePerSecond": 1234.5, "etaSeconds": 0.05, "createdAt": "2025-11-02T09:00:00.000Z",
           "startedAt": "2025-11-02T09:00:00.120Z", "finishedAt": None, "lastError": None}
    job.update(overrides)
    return job


def sample_today(**data_overrides) -> dict:
    data = {"metrics": {"bmi": 24.5, "bmr": 1650, "tdee": 2475, "computedAt": "2025-10-29T14:30:45.123Z",
                        "version": 1},
            "explanations": {"bmi": "Your BMI is 24.5.", "bmr": "About 1650 kcal.", "tdee": "About 2475 kcal."},
            "acknowledged": False, "acknowledgement": None}
    data.update(data_overrides)
    return {"success": True, "data": data}


def self_test(contract: Contract, results: Results) -> None:
    log("== self-test: the document and the harness (no daemon) ==")
    try:
        contract.validate_document()
        results.record(True, f"document {DOC_PATH.relative_to(REPO)} is valid OpenAPI {contract.doc['openapi']}")
    except Exception as error:  # noqa: BLE001
        results.record(False, "document is valid OpenAPI 3.1", [str(error)[:2000]])
        return
    expected_ops = {("GET", "/v1/profile/metrics/today"), ("POST", "/v1/profile/metrics/acknowledge"),
                    ("GET", "/v1/profile/metrics/history"), ("GET", "/v1/profile/metrics/export"),
                    ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.yaml"), ("GET", "/metrics"),
                    ("POST", "/v1/admin/recompute"), ("GET", "/v1/admin/recompute"),
                    ("GET", "/v1/admin/recompute/{id}"), ("POST", "/v1/admin/recompute/{id}/cancel")}
    have = {(op.method, op.template) for op in contract.operations}
    results.record(have == expected_ops, "document has exactly the 12 designed operations",
                   [f"missing {sorted(expected_ops - have)}", f"unexpected {sorted(have - expected_ops)}"])
    for name in ("ErrorBody", "TodayResponse", "HistoryResponse", "ExportResponse", "AcknowledgeRequest", "AcknowledgeResponse", "Health", "Readiness",
                 "RecomputeJob", "RecomputeTriggerResponse", "RecomputeJobResponse", "RecomputeJobList"):
        results.record(name in contract.doc["components"]["schemas"], f"components/schemas/{name} exists")

    rid = {"x-request-id": ["abc-123"]}
    json_ct = {"content-type": ["application/json; charset=utf-8"]}
    loc = {"location": ["/v1/admin/recompute/3"]}

    def case(title, method, path, status, body, headers=None, expect_ok=True, expect_text=None, sent=None):
        hdrs = dict(rid)
        hdrs.update(json_ct if headers is None else headers)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        _, _, problems = contract.check_response(method, path, status, hdrs, raw, sent_request_id=sent)
        if expect_ok:
            results.record(not problems, f"self-test accepts {title}", problems)
        else:
            found = any(expect_text in p for p in problems) if expect_text else bool(problems)
            results.record(found, f"self-test rejects {title}" + (f" ({expect_text})" if expect_text else ""),
                           problems or ["no violation reported"])

    today = "/v1/profile/metrics/today"
    ack = "/v1/profile/metrics/acknowledge"
    # The latest read's caching headers: private, revalidated, a strong tag, varying with the token.
    personal = dict(json_ct, **{"cache-control": ["private, no-cache"], "etag": ['"0123456789abcdef"'],
                                "vary": ["Authorization"]})
    case("a today body, not acknowledged", "GET", today, 200, sample_today(), headers=personal)
    case("a today body, acknowledged", "GET", today, 200, sample_today(
        acknowledged=True, acknowledgement={"acknowledgedAt": "2025-10-29T14:31:02.481Z", "version": 1}),
        headers=personal)
    case("a today body without its caching headers", "GET", today, 200, sample_today(),
         expect_ok=False, expect_text="header Cache-Control: required")
    case("a today body with a weak tag", "GET", today, 200, sample_today(),
         headers=dict(personal, etag=['W/"0123456789abcdef"']), expect_ok=False, expect_text="ETag")
    case("today with acknowledgement omitted", "GET", today, 200,
         {"success": True, "data": {k: v for k, v in sample_today()["data"].items() if k != "acknowledgement"}},
         expect_ok=False, expect_text="'acknowledgement' is a required property")
    bad = sample_today()
    bad["data"]["computedAt"] = "2025-10-29T14:30:45.123Z"  # the seed 001 shape: computedAt at the top level
    case("today with computedAt at the top level (seed 001 mismatch)", "GET", today, 200, bad,
         expect_ok=False, expect_text="Additional properties are not allowed")
    bad = sample_today()
    bad["data"]["metrics"]["computedAt"] = "2025-10-29T14:30:45Z"
    case("today with a date without milliseconds", "GET", today, 200, bad, expect_ok=False, expect_text="pattern")
    bad = sample_today()
    bad["data"]["metrics"]["bmr"] = 1650.5
    case("today with a fractional bmr", "GET", today, 200, bad, expect_ok=False, expect_text="integer")
    case("today acknowledged:true with a null acknowledgement", "GET", today, 200,
         sample_today(acknowledged=True), expect_ok=False, expect_text="oneOf")
    case("today with NaN", "GET", today, 200, b'{"success": true, "data": {"metrics": {"bmi": NaN}}}',
         expect_ok=False, expect_text="non-standard JSON constant")
    case("today with a duplicate key", "GET", today, 200, b'{"success": true, "success": true}',
         expect_ok=False, expect_text="duplicate key")
    case("a 404 error body", "GET", today, 404,
         {"error": "no metrics: height 72 cm is outside 100–250 cm", "statusCode": 404, "code": "metrics.settings_invalid"})
    case("a 401 error body with a token code", "GET", today, 401,
         {"error": "token expired", "statusCode": 401, "code": "token.expired"})
    case("an error body whose statusCode differs from the status", "GET", today, 404,
         {"error": "x", "statusCode": 400, "code": "route.not_found"}, expect_ok=False, expect_text="404 was expected")
    case("an error body with an extra property", "GET", today, 401,
         {"error": "x", "statusCode": 401, "code": "token.expired", "stack": "…"}, expect_ok=False,
         expect_text="Additional properties")
    case("an error body with an empty message", "GET", today, 401, {"error": "", "statusCode": 401, "code": "token.expired"},
         expect_ok=False, expect_text="should be non-empty")
    case("an error body without its code", "GET", today, 401, {"error": "token expired", "statusCode": 401},
         expect_ok=False, expect_text="'code' is a required property")
    case("an error body whose code belongs to another status (a 404 code on a 401)", "GET", today, 401,
         {"error": "x", "statusCode": 401, "code": "route.not_found"}, expect_ok=False, expect_text="is not one of")
    case("an error body with an unknown code", "GET", today, 404,
         {"error": "x", "statusCode": 404, "code": "metrics.gone"}, expect_ok=False, expect_text="is not one of")
    case("an error body with a malformed code", "GET", today, 404,
         {"error": "x", "statusCode": 404, "code": "Route Not Found"}, expect_ok=False, expect_text="pattern")
    case("an undocumented status (today 400)", "GET", today, 400,
         {"error": "x", "statusCode": 400, "code": "request.invalid_body"},
         expect_ok=False, expect_text="status 400 is not documented for getTodayMetrics")
    case("an error as text/plain", "GET", today, 401, b"Unauthorized", headers={"content-type": ["text/plain"]},
         expect_ok=False, expect_text="Content-Type 'text/plain' is not documented")
    case("a response without X-Request-Id", "GET", "/healthz", 200, {"status": "ok"},
         headers={"content-type": ["application/json"], "x-request-id": []}, expect_ok=False,
         expect_text="expected exactly one")
    case("a client X-Request-Id not echoed", "GET", "/healthz", 200, {"status": "ok"}, sent="mine-1",
         expect_ok=False, expect_text="sent 'mine-1'")
    case("the acknowledge 200 body", "POST", ack, 200, {"success": True, "data": {
        "acknowledged": True, "acknowledgement": {"acknowledgedAt": "2025-10-29T14:31:02.481Z", "version": 1}}})
    case("an acknowledge 200 with acknowledged:false", "POST", ack, 200, {"success": True, "data": {
        "acknowledged": False, "acknowledgement": {"acknowledgedAt": "2025-10-29T14:31:02.481Z", "version": 1}}},
         expect_ok=False, expect_text="True was expected")
    case("an acknowledge 413", "POST", ack, 413, {"error": "too large", "statusCode": 413, "code": "request.body_too_large"})
    case("an acknowledge 503 of a database that went away", "POST", ack, 503,
         {"error": "database unavailable, retry shortly", "statusCode": 503, "code": "database.connection_lost"},
         headers={**json_ct, "retry-after": ["1"]})
    case("a 503 of too many connections", "GET", today, 503,
         {"error": "server busy: too many connections, retry shortly", "statusCode": 503,
          "code": "server.too_many_connections"}, headers={**json_ct, "retry-after": ["1"]})
    case("readiness 200", "GET", "/readyz", 200, {"status": "ready", "database": "ok", "schema": "current",
                                                   "reason": None})
    case("readiness 200 saying not_ready", "GET", "/readyz", 200, {"status": "not_ready", "database": "ok",
                                                                   "schema": "behind", "reason": "x"},
         expect_ok=False, expect_text="'ready' was expected")
    case("readiness 503", "GET", "/readyz", 503, {"status": "not_ready", "database": "unreachable",
                                                   "schema": "unknown", "reason": "connection refused"})
    def trigger(created, job, nothing=False):
        return {"success": True, "data": {"created": created, "nothingToDo": nothing, "message": "m", "job": job}}

    case("a trigger 202", "POST", "/v1/admin/recompute", 202,
         trigger(True, sample_job(state="pending", startedAt=None)), headers={**json_ct, **loc})
    case("a trigger 202 without Location", "POST", "/v1/admin/recompute", 202,
         trigger(True, sample_job()), expect_ok=False, expect_text="header Location: required")
    case("a trigger 202 without a job", "POST", "/v1/admin/recompute", 202,
         trigger(True, None), headers={**json_ct, **loc}, expect_ok=False, expect_text="None is not of type")
    case("a trigger 200 with created:true", "POST", "/v1/admin/recompute", 200,
         trigger(True, sample_job()), headers={**json_ct, **loc}, expect_ok=False, expect_text="False was expected")
    case("a trigger 200 with nothing to do and no job yet", "POST", "/v1/admin/recompute", 200,
         trigger(False, None, nothing=True))
    case("a trigger 200 with nothing to do and the finished job", "POST", "/v1/admin/recompute", 200,
         trigger(False, sample_job(state="done", percent=100, finishedAt="2025-11-02T09:01:00.000Z"), nothing=True),
         headers={**json_ct, **loc})
    case("a trigger 200 without nothingToDo", "POST", "/v1/admin/recompute", 200,
         {"success": True, "data": {"created": False, "message": "m", "job": None}}, expect_ok=False,
         expect_text="'nothingToDo' is a required property")
    case("a job with percent 140", "GET", "/v1/admin/recompute/3", 200,
         {"success": True, "data": {"job": sample_job(percent=140)}}, expect_ok=False, expect_text="maximum")
    case("a job without lastError", "GET", "/v1/admin/recompute/3", 200,
         {"success": True, "data": {"job": {k: v for k, v in sample_job().items() if k != "lastError"}}},
         expect_ok=False, expect_text="'lastError' is a required property")
    case("a job in an unknown state", "GET", "/v1/admin/recompute/3", 200,
         {"success": True, "data": {"job": sample_job(state="paused")}}, expect_ok=False, expect_text="enum")
    case("a job list", "GET", "/v1/admin/recompute", 200,
         {"success": True, "data": {"jobs": [sample_job(id=4), sample_job(state="done", finishedAt=
                                                                          "2025-11-02T09:01:00.000Z")]}})
    case("a cancel 200", "POST", "/v1/admin/recompute/3/cancel", 200,
         {"success": True, "data": {"job": sample_job(state="cancelled", finishedAt="2025-11-02T09:01:00.000Z")}})
    case("a cancel 200 whose job is still running", "POST", "/v1/admin/recompute/3/cancel", 200,
         {"success": True, "data": {"job": sample_job()}}, expect_ok=False, expect_text="'cancelled' was expected")
    case("a cancel 409", "POST", "/v1/admin/recompute/3/cancel", 409,
         {"error": "finished", "statusCode": 409, "code": "job.finished"})
    case("an unknown route 404", "GET", "/v2/nope", 404, {"error": "Not found", "statusCode": 404, "code": "route.not_found"})
    case("an unknown route answered 200", "GET", "/v2/nope", 200, {"status": "ok"}, expect_ok=False,
         expect_text="expected 404")
    case("a wrong-method 405", "DELETE", "/healthz", 405,
         {"error": "Method not allowed", "statusCode": 405, "code": "method.not_allowed"},
         headers={**json_ct, "allow": ["GET"]})
    case("a wrong-method 405 without Allow", "DELETE", "/healthz", 405,
         {"error": "Method not allowed", "statusCode": 405, "code": "method.not_allowed"}, expect_ok=False,
         expect_text="header Allow")
    case("/metrics text", "GET", "/metrics", 200, b"# TYPE up gauge\nup 1\n",
         headers={"content-type": ["text/plain; version=0.0.4; charset=utf-8"]})
    case("/metrics without the version parameter", "GET", "/metrics", 200, b"up 1\n",
         headers={"content-type": ["text/plain"]}, expect_ok=False, expect_text="is not documented")
    case("/openapi.yaml", "GET", "/openapi.yaml", 200, contract.text,
         headers={"content-type": ["application/yaml"], "etag": ['"0123456789abcdef"']})
    route_cases = [("GET", "/v1/admin/recompute", "listRecomputeJobs"),
                   ("GET", "/v1/admin/recompute/12", "getRecomputeJob"),
                   ("GET", "/v1/admin/recompute/abc?x=1", "getRecomputeJob"),
                   ("POST", "/v1/admin/recompute/12/cancel", "cancelRecomputeJob")]
    for method, path, want in route_cases:
        op, _ = contract.route(method, path)
        results.record(op is not None and op.operation_id == want, f"self-test routes {method} {path} to {want}",
                       [f"got {op}"])

    # JWT minting: recompute the HMAC independently and decode the parts.
    secret = b"0123456789abcdef0123456789abcdef"
    token = mint_jwt(secret, {"sub": "42", "exp": 2000000000})
    head, payload, signature = token.split(".")
    recomputed = hmac.new(secret, f"{head}.{payload}".encode(), hashlib.sha256).digest()
    problems = []
    if "=" in token:
        problems.append("padding in token")
    if b64url_decode(signature) != recomputed:
        problems.append("signature mismatch")
    if json.loads(b64url_decode(head)) != {"alg": "HS256", "typ": "JWT"}:
        problems.append(f"header {b64url_decode(head)!r}")
    if json.loads(b64url_decode(payload)) != {"sub": "42", "exp": 2000000000}:
        problems.append(f"payload {b64url_decode(payload)!r}")
    # RFC 7515 appendix A.1's HS256 example, recomputed with this code's primitives.
    rfc_key = b64url_decode("AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow")
    rfc_input = ("eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0"
                 "dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ")
    if b64url(hmac.new(rfc_key, rfc_input.encode(), hashlib.sha256).digest()) != \
            "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk":
        problems.append("RFC 7515 A.1 signature mismatch")
    results.record(not problems, "self-test JWT minting (HMAC recomputed, RFC 7515 A.1 vector)", problems)


# ----------------------------------------------------------------------------------------------------------------
# PostgreSQL and the daemon


class Database:
    def __init__(self, admin_url: str, name: str, pg_bin: Path):
        self.admin_url = admin_url
        self.name = name
        self.psql_path = str(pg_bin / "psql") if (pg_bin / "psql").exists() else (shutil.which("psql") or "psql")
        self.url = self.with_dbname(admin_url, name)
        self.created = False

    @staticmethod
    def with_dbname(url: str, name: str) -> str:
        if url.startswith(("postgres://", "postgresql://")):
            parts = urllib.parse.urlsplit(url)
            query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
            # Built by hand: urlunsplit drops the empty authority of postgresql:///db?host=/socket/dir.
            rebuilt = f"{parts.scheme}://{parts.netloc}/{name}"
            return rebuilt + (f"?{urllib.parse.urlencode(query)}" if query else "")
        fields = [f for f in url.split() if not f.startswith("dbname=")]
        return " ".join(fields + [f"dbname={name}"])

    def psql(self, sql: str, url: str | None = None, timeout: float = 120) -> str:
        env = dict(os.environ, PGCONNECT_TIMEOUT="10")
        result = subprocess.run(
            [self.psql_path, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url or self.url, "-f", "-"],
            input=sql, capture_output=True, text=True, timeout=timeout, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"psql failed ({result.returncode}): {result.stderr.strip()[:2000]}\nSQL: {sql[:500]}")
        return result.stdout.strip()

    def create(self) -> None:
        self.psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE);', url=self.admin_url)
        self.psql(f'CREATE DATABASE "{self.name}";', url=self.admin_url)
        self.created = True

    def drop(self) -> None:
        if self.created:
            self.psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE);', url=self.admin_url)
            self.created = False


class Daemon:
    def __init__(self, binary: str, workdir: Path, name: str, env: dict):
        self.binary = binary
        self.name = name
        self.env = env
        self.port = free_port()
        self.env["METRICSD_LISTEN"] = f"127.0.0.1:{self.port}"
        self.stdout_path = workdir / f"{name}.stdout.log"
        self.stderr_path = workdir / f"{name}.stderr.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "serve"], env=self.env, stdin=subprocess.DEVNULL,
            stdout=open(self.stdout_path, "wb"), stderr=open(self.stderr_path, "wb"), start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        chunks = []
        for path in (self.stderr_path, self.stdout_path):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()
                if text:
                    chunks.append(f"--- {path.name} (last {min(lines, len(text))} of {len(text)} lines) ---")
                    chunks.extend(text[-lines:])
        return "\n".join(chunks) if chunks else "(the daemon wrote nothing)"

    def wait_ready(self, timeout: float = 60.0) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                return False, f"exited with status {self.process.returncode} before /readyz answered 200"
            try:
                response = http_request(self.port, "GET", "/readyz", timeout=2)
                if response.status == 200:
                    return True, ""
                last = f"/readyz answered {response.status} {excerpt(response.body, 200)}"
            except OSError as error:
                last = f"/readyz: {error}"
            time.sleep(0.2)
        return False, f"not ready after {timeout:.0f} s (last: {last})"

    def stop(self, timeout: float = 30.0) -> tuple[int | None, bool]:
        """SIGTERM, wait; returns (exit status, whether it had to be killed)."""
        if self.process is None:
            return None, False
        if self.process.poll() is not None:
            return self.process.returncode, False
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10), True

    def log_lines_with(self, needle: str) -> list[str]:
        found = []
        for path in (self.stderr_path, self.stdout_path):
            if path.exists():
                found.extend(line for line in path.read_text(errors="replace").splitlines() if needle in line)
        return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_env(database_url: str, jwt_secret_file: Path, admin_token_file: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METRICSD_", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_", "LISTEN_FDS",
                                "LISTEN_PID", "DATABASE_URL"))}
    env.update({"DATABASE_URL": database_url, "METRICSD_JWT_SECRET_FILE": str(jwt_secret_file),
                "METRICSD_LOG_FORMAT": "json"})
    if admin_token_file is not None:
        env["METRICSD_ADMIN_TOKEN_FILE"] = str(admin_token_file)
    return env


# ----------------------------------------------------------------------------------------------------------------
# Seed data

VALID_USERS = {  # id: (timezone, date of birth, gender, kg, cm, activity)
    1001: ("UTC", "1990-05-17", "male", "80.00", "180.0", "moderately_active"),
    1002: ("Asia/Kathmandu", "1985-02-28", "female", "62.50", "165.0", "lightly_active"),
    1003: ("America/New_York", "2000-12-31", "other", "95.25", "172.5", "very_active"),
    1004: ("Pacific/Chatham", "1960-07-04", "male", "120.00", "190.0", "extremely_active"),
    1005: ("Europe/London", "1999-01-01", "female", "45.00", "150.0", "sedentary"),
    1006: ("America/St_Johns", "1970-03-15", "male", "30.00", "100.0", "sedentary"),  # lower bounds
    1007: ("Australia/Lord_Howe", "1980-08-08", "female", "300.00", "250.0", "very_active"),  # upper bounds
}
# id: (timezone, settings or None for no row, keyword the 404 message must contain)
INVALID_USERS = {
    1101: ("UTC", ("1990-05-17", "male", "80.00", "72.0", "sedentary", True), "height"),
    1102: ("UTC", ("1990-05-17", "male", "25.00", "180.0", "sedentary", True), "weight"),
    1103: ("UTC", ("1990-05-17", "female", "300.01", "180.0", "sedentary", True), "weight"),
    1104: ("UTC", ("AGE10", "male", "40.00", "140.0", "sedentary", True), "age"),
    1105: ("UTC", ("1890-01-01", "male", "70.00", "170.0", "sedentary", True), "age"),
    1106: ("UTC", ("1990-05-17", "unicorn", "70.00", "170.0", "sedentary", True), "gender"),
    1107: ("UTC", ("1990-05-17", "male", "70.00", "170.0", "couch_potato", True), "activity"),
    1108: ("UTC", (None, "male", "70.00", "170.0", "sedentary", True), "birth"),
    1109: ("UTC", ("1990-05-17", "male", "70.00", "170.0", "sedentary", False), "onboarding"),
    1110: ("Mars/Olympus_Mons", ("1990-05-17", "male", "70.00", "170.0", "sedentary", True), "zone"),
    1111: ("UTC", None, "settings"),
    1112: ("UTC", (None, None, None, None, None, True), ""),
    1113: ("UTC", ("1990-05-17", "'; DROP TABLE users; --\n<script>\u001b[31m", "70.00", "170.0", "sedentary", True),
           "gender"),
    1114: ("UTC", ("1990-05-17", "male", "70.00", "250.1", "sedentary", True), "height"),
}
ONBOARDED_USER = 2001  # inserted while the daemon runs: its first request must compute on the spot
UNKNOWN_USER = 999999


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "'" + str(value).replace("'", "''") + "'"


def seed_sql() -> str:
    lines = ["BEGIN;"]
    for uid, (tz, dob, gender, kg, cm, activity) in VALID_USERS.items():
        lines.append(f"INSERT INTO users (id, timezone) VALUES ({uid}, {sql_literal(tz)});")
        lines.append("INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, "
                     f"activity_level, onboarding_completed) VALUES ({uid}, {sql_literal(dob)}, {sql_literal(gender)}, "
                     f"{kg}, {cm}, {sql_literal(activity)}, true);")
    for uid, (tz, settings, _) in INVALID_USERS.items():
        lines.append(f"INSERT INTO users (id, timezone) VALUES ({uid}, {sql_literal(tz)});")
        if settings is None:
            continue
        dob, gender, kg, cm, activity, done = settings
        dob_sql = "(current_date - interval '10 years')::date" if dob == "AGE10" else sql_literal(dob)
        lines.append("INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, "
                     f"activity_level, onboarding_completed) VALUES ({uid}, {dob_sql}, {sql_literal(gender)}, "
                     f"{kg or 'NULL'}, {cm or 'NULL'}, {sql_literal(activity)}, {sql_literal(done)});")
    lines.append("COMMIT;")
    return "\n".join(lines)


def onboard_sql(uid: int) -> str:
    return (f"BEGIN; INSERT INTO users (id, timezone) VALUES ({uid}, 'Asia/Kathmandu');"
            "INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, "
            f"onboarding_completed) VALUES ({uid}, '1995-06-30', 'female', 58.40, 161.5, 'lightly_active', true);"
            " COMMIT;")


def bulk_sql(count: int, first: int = 100000) -> str:
    return (
        "BEGIN;"
        f" INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series({first}, {first + count - 1}) g;"
        " INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,"
        " onboarding_completed)"
        f" SELECT g, DATE '1980-01-01' + (g % 9000), (ARRAY['male','female','other'])[1 + g % 3],"
        f" 50 + (g % 100), 150 + (g % 50), 'sedentary', true FROM generate_series({first}, {first + count - 1}) g;"
        " COMMIT;")


# ----------------------------------------------------------------------------------------------------------------
# Contract checks against the live daemon


class Checker:
    def __init__(self, contract: Contract, results: Results, daemon: Daemon, secrets_to_hide: list[str]):
        self.contract = contract
        self.results = results
        self.daemon = daemon
        self.secrets = [s for s in secrets_to_hide if s]
        self.counter = 0
        self.admin_token = ""

    def call(self, title: str, method: str, path: str, *, expect, token: str | None = None, body=None,
             raw: bytes | None = None, headers: dict | None = None, request_id: str | None | bool = True,
             chunked: bool = False, then=None, port: int | None = None):
        """Sends one request, validates the response against the contract and `expect`, records the check.

        expect: a status or a set of statuses the check wants (each must also be documented).
        then(response) -> list of problems: checks of meaning beyond the schema.
        request_id: True sends a fresh well-formed id, a string sends that, None/False sends none.
        """
        self.counter += 1
        send_headers = {}
        if token is not None:
            send_headers["Authorization"] = token if token.startswith(("Bearer", "Basic", "bearer")) or token == "" \
                else f"Bearer {token}"
        sent_id = None
        if request_id is True:
            sent_id = f"contract-{os.getpid()}-{self.counter}"
        elif isinstance(request_id, str):
            sent_id = request_id
        if sent_id is not None:
            send_headers["X-Request-Id"] = sent_id
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            send_headers.setdefault("Content-Type", "application/json")
        send_headers.update(headers or {})
        described = f"{method} {path}" + (f" body={excerpt(data, 80)}" if data is not None else "")
        try:
            response = http_request(port or self.daemon.port, method, path, send_headers, data, chunked=chunked)
        except Exception as error:  # noqa: BLE001
            alive = "" if self.daemon.alive() else \
                f" (the daemon is no longer running: exit status {self.daemon.process.returncode})"
            self.results.record(False, f"{title}: {described}", [f"request failed: {error!r}{alive}"])
            return None
        wanted = {expect} if isinstance(expect, int) else set(expect)
        label, parsed, problems = self.contract.check_response(method, path, response.status, response.headers,
                                                               response.body, sent_request_id=sent_id)
        response.json = parsed
        self.results.exercised.add((label, response.status))
        if response.status not in wanted:
            problems.insert(0, f"expected status {'/'.join(map(str, sorted(wanted)))}, got {response.status}")
        if response.status >= 500 and response.status not in wanted:
            problems.append(f"server error; daemon log lines for this request: "
                            f"{self.daemon.log_lines_with(response.header('x-request-id') or '?')[:3]}")
        problems.extend(self.leaks(response))
        if then is not None and not problems:
            try:
                problems.extend(then(response) or [])
            except Exception as error:  # noqa: BLE001
                problems.append(f"check of meaning raised {error!r}")
        if problems:
            problems.append(f"response {response.status} {response.header('content-type')}: {excerpt(response.body)}")
        self.results.record(not problems, f"[{label}] {title}: {described} -> {response.status}", problems)
        return response

    def leaks(self, response: Response) -> list[str]:
        if response.status < 400:
            return []
        text = response.body.decode("utf-8", errors="replace")
        found = [f"error body leaks a secret ({s[:6]}…)" for s in self.secrets if s in text]
        message = text
        if isinstance(response.json, dict) and isinstance(response.json.get("error"), str):
            message = response.json["error"]
        for pattern in LEAK_PATTERNS:
            if pattern.search(message):
                found.append(f"error message looks like it leaks internals (matches /{pattern.pattern}/): "
                             f"{excerpt(message, 200)}")
        return found


def run_contract_checks(ck: Checker, db: Database, ctx: dict) -> None:
    contract, results = ck.contract, ck.results
    secret = ctx["jwt_secret"]
    admin = ctx["admin_token"]
    today, ack = "/v1/profile/metrics/today", "/v1/profile/metrics/acknowledge"

    def tok(uid, **kw):
        return mint_jwt(secret, user_claims(uid, **kw))

    def message_contains(*words):
        def check(r):
            msg = (r.json or {}).get("error", "")
            return [] if all(w.lower() in msg.lower() for w in words) else \
                [f"error message {msg!r} should mention {' and '.join(map(repr, words))}"]
        return check

    def code_is(*codes, then=None):
        """The error body's code is one of `codes` (clients branch on it, never on the message); then `then`."""
        def check(r):
            code = (r.json or {}).get("code")
            problems = [] if code in codes else [f"error code {code!r}, expected {' or '.join(codes)}"]
            return problems + ((then(r) or []) if then is not None and not problems else [])
        return check

    log("== operations endpoints ==")
    ck.call("liveness", "GET", "/healthz", expect=200)
    ck.call("readiness", "GET", "/readyz", expect=200)
    ck.call("liveness with a query string", "GET", "/healthz?verbose=1", expect=200)

    def same_document(r):
        if r.body == contract.text:
            return []
        import yaml

        return [] if yaml.safe_load(r.body) == contract.doc else \
            ["served /openapi.yaml differs from Sources/MetricsdDaemon/Resources/openapi.yaml"]

    ck.call("the OpenAPI document", "GET", "/openapi.yaml", expect=200, then=same_document)

    prom_line = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+\S+(\s+-?\d+)?$")

    def prometheus(r):
        lines = [l for l in r.json.splitlines() if l.strip()]
        bad = [l for l in lines if not l.startswith("#") and not prom_line.match(l)]
        problems = [f"not Prometheus text: {l[:120]!r}" for l in bad[:3]]
        if not any(l.startswith("# TYPE") for l in lines):
            problems.append("no '# TYPE' line")
        return problems

    ck.call("Prometheus metrics", "GET", "/metrics", expect=200, then=prometheus)

    log("== request ids ==")
    ck.call("a client request id round-trips", "GET", "/healthz", expect=200, request_id="ios-7f3a9c1e.42_A")
    ck.call("a 64-character request id round-trips", "GET", "/healthz", expect=200, request_id="a" * 64)
    ck.call("without a request id one is generated", "GET", "/healthz", expect=200, request_id=None)
    for bad_id in ("a" * 65, "has space", "../../etc/passwd", "semi;colon", "quote\"d", "é-latin1"):
        ck.call(f"a malformed request id {bad_id[:20]!r} is replaced", "GET", "/healthz", expect=200,
                request_id=bad_id)
    ck.call("a request id on an error response round-trips", "GET", today, expect=401, request_id="err-id-1")

    def distinct_generated(_):
        ids = set()
        for _i in range(3):
            ids.add(http_request(ck.daemon.port, "GET", "/healthz").header("x-request-id"))
        return [] if len(ids) == 3 else [f"generated request ids repeat: {ids}"]

    ck.call("generated request ids are distinct", "GET", "/healthz", expect=200, request_id=None,
            then=distinct_generated)

    log("== routing ==")
    for path in ("/", "/v1", "/v1/profile/metrics", "/v1/profile/metrics/today/extra", "/v2/profile/metrics/today",
                 "/openapi.json", "/v1/admin/recompute/1/cancel/now", "/%2e%2e/%2e%2e/etc/passwd",
                 "/v1/profile/metrics/" + "x" * 2000):
        ck.call(f"unknown route {path[:50]!r}", "GET", path, expect=404, token=tok(1001), then=code_is("route.not_found"))
    for method, path, allowed in (("POST", "/healthz", "GET"), ("DELETE", "/readyz", "GET"),
                                  ("PUT", "/metrics", "GET"), ("POST", "/openapi.yaml", "GET"),
                                  ("POST", today, "GET"), ("DELETE", today, "GET"), ("GET", ack, "POST"),
                                  ("PATCH", ack, "POST"), ("DELETE", "/v1/admin/recompute", "GET, POST"),
                                  ("DELETE", "/v1/admin/recompute/1", "GET"),
                                  ("GET", "/v1/admin/recompute/1/cancel", "POST")):
        auth = admin if "/admin/" in path else tok(1001) if "/profile/" in path else None

        def allow_header(r, allowed=allowed):
            got = {m.strip() for m in (r.header("allow") or "").split(",") if m.strip()}
            want = {m.strip() for m in allowed.split(",")}
            return [] if want <= got else [f"Allow {r.header('allow')!r} should list {allowed}"]

        ck.call(f"wrong method {method} {path}", method, path, expect=405, token=auth,
                then=code_is("method.not_allowed", then=allow_header))

    log("== user authentication ==")
    now = int(time.time())
    wrong_secret = secrets.token_hex(32).encode()
    # Each bad token and the code that says why (an empty header may be dropped on the way: missing or malformed).
    bad_tokens = {
        "no Authorization header": (None, ("auth.token_missing",)),
        "an empty Authorization header": ("", ("auth.token_missing", "auth.authorization_malformed")),
        "a bearer without a token": ("Bearer ", ("auth.authorization_malformed",)),
        "a Basic credential": ("Basic " + base64.b64encode(b"user:pass").decode(), ("auth.authorization_malformed",)),
        "garbage": ("Bearer not-a-jwt", ("token.malformed",)),
        "three garbage parts": ("Bearer a.b.c", ("token.malformed",)),
        "an expired token": (mint_jwt(secret, {"sub": "1001", "iat": now - 7200, "exp": now - 3600}), ("token.expired",)),
        "a token signed with another secret": (mint_jwt(wrong_secret, user_claims(1001)), ("token.bad_signature",)),
        "a token with a tampered payload": ((lambda t: t.split(".")[0] + "." + b64url(
            json.dumps(user_claims(1002)).encode()) + "." + t.split(".")[2])(tok(1001)), ("token.bad_signature",)),
        "alg none": (mint_jwt(b"", user_claims(1001), header={"alg": "none", "typ": "JWT"}, sign=False),
                     ("token.algorithm_not_accepted",)),
        "alg none with a signature": (mint_jwt(secret, user_claims(1001), header={"alg": "none", "typ": "JWT"}),
                                      ("token.algorithm_not_accepted",)),
        "alg HS512 header on an HS256 signature": (mint_jwt(secret, user_claims(1001),
                                                            header={"alg": "HS512", "typ": "JWT"}),
                                                   ("token.algorithm_not_accepted",)),
        "a not-yet-valid token (nbf in an hour)": (mint_jwt(secret, user_claims(1001, nbf=now + 3600)),
                                                   ("token.not_yet_valid",)),
        "a non-numeric sub": (mint_jwt(secret, user_claims("abc")), ("token.subject_not_user_id",)),
        "a negative sub": (mint_jwt(secret, user_claims("-5")), ("token.subject_not_user_id",)),
        "a zero sub": (mint_jwt(secret, user_claims("0")), ("token.subject_not_user_id",)),
        "a SQL-looking sub": (mint_jwt(secret, user_claims("1001 OR 1=1")), ("token.subject_not_user_id",)),
        "a fractional sub": (mint_jwt(secret, {**user_claims(1001), "sub": 1001.5}), ("token.subject_not_user_id",)),
        "a sub beyond 64 bits": (mint_jwt(secret, user_claims("99999999999999999999999")), ("token.subject_not_user_id",)),
        "no sub": (mint_jwt(secret, {"iat": now, "exp": now + 3600}), ("token.subject_not_user_id",)),
        "the admin token": (admin, ("token.malformed",)),
        "an 8 KiB token": ("Bearer " + "A" * 8192, ("token.malformed",)),
    }
    for title, (value, codes) in bad_tokens.items():
        ck.call(f"401 for {title}", "GET", today, expect=401, token=value, then=code_is(*codes))
    ck.call("401 on acknowledge without a token", "POST", ack, expect=401,
            body={"version": 1, "metricsComputedAt": "2025-10-29T14:30:45.123Z"}, then=code_is("auth.token_missing"))
    ck.call("401 on acknowledge with an expired token", "POST", ack, expect=401,
            token=bad_tokens["an expired token"][0], body={"version": 1, "metricsComputedAt": "2025-10-29T14:30:45.123Z"},
            then=code_is("token.expired"))
    ck.call("a numeric (JSON number) sub is accepted", "GET", today, expect=200,
            token=mint_jwt(secret, {**user_claims(1002), "sub": 1002}))

    log("== latest metrics ==")
    metrics_of = {}

    def today_semantics(uid):
        def check(r):
            d = r.json["data"]
            problems = []
            if d["acknowledged"] is not False:
                problems.append(f"user {uid} never acknowledged, but acknowledged={d['acknowledged']}")
            metrics_of[uid] = d["metrics"]
            return problems
        return check

    for uid in VALID_USERS:
        ck.call(f"200 for valid user {uid} ({VALID_USERS[uid][0]})", "GET", today, expect=200, token=tok(uid),
                then=today_semantics(uid))
    m = metrics_of.get(1001)
    if m and m["version"] == 1:  # formulas, version 1: UTC, born 1990-05-17, 80 kg, 180 cm, male, 1.55.
        from datetime import datetime, timedelta, timezone

        today_utc = datetime.now(timezone.utc).date()
        ages = {d.year - 1990 - ((d.month, d.day) < (5, 17)) for d in (today_utc, today_utc - timedelta(days=1))}
        bmrs = {10 * 80 + 6.25 * 180 - 5 * age + 5 for age in ages}
        problems = []
        if m["bmi"] != 24.7:
            problems.append(f"bmi {m['bmi']} != 24.7")
        if m["bmr"] not in bmrs:
            problems.append(f"bmr {m['bmr']} not in {sorted(bmrs)} (ages {sorted(ages)})")
        if abs(m["tdee"] - m["bmr"] * 1.55) > 0.5:
            problems.append(f"tdee {m['tdee']} != round({m['bmr']} x 1.55)")
        results.record(not problems, f"user 1001's metrics follow the version 1 formulas: {m}", problems)
    for uid, (tz, _, word) in INVALID_USERS.items():
        ck.call(f"404 for user {uid} with bad settings ({word or 'all missing'})", "GET", today, expect=404,
                token=tok(uid), then=code_is("metrics.settings_invalid", then=message_contains(word) if word else None))
    ck.call("404 for an unknown user", "GET", today, expect=404, token=tok(UNKNOWN_USER),
            then=code_is("metrics.user_unknown"))

    history = "/v1/profile/metrics/history"
    ck.call("history of a valid user: the last 90 days", "GET", history, expect=200, token=tok(1001))
    ck.call("history of an explicit range, one entry a page", "GET", history + "?from=2025-01-01&to=2026-12-31&limit=1",
            expect=200, token=tok(1001))
    for query, name in (("?from=2025-13-01", "from"), ("?to=2025-02-30", "to"), ("?version=0", "version"),
                        ("?limit=732", "limit"), ("?cursor=x", "cursor"), ("?from=2020-01-01&to=2025-01-01", "from")):
        ck.call(f"history: 400 naming {name} for {query}", "GET", history + query, expect=400, token=tok(1001),
                then=code_is("request.invalid_parameter", then=message_contains(name)))
    uid, (_, _, word) = next(iter(INVALID_USERS.items()))
    ck.call(f"history: 404 for user {uid} with bad settings", "GET", history, expect=404, token=tok(uid),
            then=code_is("metrics.settings_invalid"))
    ck.call("history: 404 for an unknown user", "GET", history, expect=404, token=tok(UNKNOWN_USER),
            then=code_is("metrics.user_unknown"))

    export = "/v1/profile/metrics/export"
    ck.call("export as JSON", "GET", export, expect=200, token=tok(1001))
    for accept in ("text/csv", "application/fhir+json"):
        ck.call(f"export as {accept}", "GET", export, expect=200, token=tok(1001), headers={"Accept": accept})
    ck.call("export of a user with bad settings (a copy, never refused)", "GET", export, expect=200, token=tok(uid))
    ck.call("export: 406 for an Accept it cannot send", "GET", export, expect=406, token=tok(1001),
            headers={"Accept": "application/xml"}, then=code_is("request.not_acceptable"))
    ck.call("export: 404 for an unknown user", "GET", export, expect=404, token=tok(UNKNOWN_USER),
            then=code_is("metrics.user_unknown"))

    db.psql(onboard_sql(ONBOARDED_USER))
    ck.call(f"200 on the first request of a just-onboarded user {ONBOARDED_USER} (computed on the spot)", "GET",
            today, expect=200, token=tok(ONBOARDED_USER), then=today_semantics(ONBOARDED_USER))

    def stored(r):
        count = db.psql(f"SELECT count(*) FROM profile_metrics WHERE user_id = {ONBOARDED_USER}")
        return [] if int(count) >= 1 else ["the on-the-spot metrics were not stored"]

    ck.call("the just-onboarded user's metrics were stored and are served again", "GET", today, expect=200,
            token=tok(ONBOARDED_USER), then=stored)

    log("== acknowledgement ==")
    user = 1001
    t = tok(user)
    current = {}

    def remember(r):
        current.update(r.json["data"]["metrics"])
        return []

    ck.call("today before acknowledging", "GET", today, expect=200, token=t, then=remember)
    if not current:
        results.record(False, "acknowledgement checks need user 1001's metrics", ["today failed"])
        return
    version, computed = current["version"], current["computedAt"]
    first = {}

    def first_ack(r):
        a = r.json["data"]["acknowledgement"]
        first.update(a)
        return [] if a["version"] == version else [f"acknowledgement.version {a['version']} != {version}"]

    ck.call("acknowledge the current metrics", "POST", ack, expect=200, token=t,
            body={"version": version, "metricsComputedAt": computed}, then=first_ack)

    def same_ack(r):
        a = r.json["data"]["acknowledgement"]
        return [] if a == first else [f"second acknowledgement {a} differs from the first {first}"]

    ck.call("acknowledge again: idempotent, same acknowledgedAt", "POST", ack, expect=200, token=t,
            body={"version": version, "metricsComputedAt": computed}, then=same_ack)

    def acknowledged_now(r):
        d = r.json["data"]
        problems = []
        if d["acknowledged"] is not True or d["acknowledgement"] != first:
            problems.append(f"today says acknowledged={d['acknowledged']} acknowledgement={d['acknowledgement']}, "
                            f"expected true and {first}")
        if d["metrics"]["computedAt"] != computed:
            problems.append("computedAt moved between two reads without a recomputation")
        return problems

    ck.call("today reports the acknowledgement", "GET", today, expect=200, token=t, then=acknowledged_now)
    ck.call("acknowledge with extra properties (ignored)", "POST", ack, expect=200, token=t,
            body={"version": version, "metricsComputedAt": computed, "note": "extra", "acknowledged": False},
            then=same_ack)
    same_instant = computed.replace("Z", "+00:00")
    ck.call("acknowledge with the same instant written +00:00", "POST", ack, expect=200, token=t,
            body={"version": version, "metricsComputedAt": same_instant}, then=same_ack)

    def shifted(ms):
        from datetime import datetime, timedelta, timezone

        instant = datetime.strptime(computed, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        return (instant + timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    # The code says stale; the message is the documented sentence the app may show as is.
    exact_stale = code_is("metrics.stale", then=lambda r: [] if r.json["error"] == STALE_MESSAGE else [
        f"message {r.json['error']!r} != {STALE_MESSAGE!r}"])
    ck.call("404 for metrics computed 1 ms earlier (stale)", "POST", ack, expect=404, token=t,
            body={"version": version, "metricsComputedAt": shifted(-1)}, then=exact_stale)
    ck.call("404 for metrics computed a day earlier (stale)", "POST", ack, expect=404, token=t,
            body={"version": version, "metricsComputedAt": shifted(-86400000)}, then=exact_stale)
    no_metrics = code_is("metrics.settings_invalid")  # user 1101's height is out of range
    ck.call("404 for a user with no metrics", "POST", ack, expect=404, token=tok(1101),
            body={"version": version, "metricsComputedAt": computed}, then=no_metrics)
    other = metrics_of.get(1003)
    if other and other["computedAt"] != computed:  # one batch may give several users the same computed_at
        ck.call("404 for another user's metrics", "POST", ack, expect=404, token=tok(1003),
                body={"version": version, "metricsComputedAt": computed}, then=exact_stale)
    ck.call("the stale attempts left the acknowledgement alone", "GET", today, expect=200, token=t,
            then=acknowledged_now)

    field_v, field_d = message_contains("version"), message_contains("metricsComputedAt")
    bad_bodies = [
        ("malformed JSON", b'{"version": 1, "metricsComputedAt": ', None),
        ("an empty body", b"", None),
        ("a JSON array", b"[1, 2]", None),
        ("a JSON string", b'"acknowledge"', None),
        ("JSON null", b"null", None),
        ("not JSON at all", b"version=1&metricsComputedAt=now", None),
        ("version missing", json.dumps({"metricsComputedAt": computed}).encode(), field_v),
        ("metricsComputedAt missing", json.dumps({"version": version}).encode(), field_d),
        ("an empty object", b"{}", None),
        ("version as a string", json.dumps({"version": str(version), "metricsComputedAt": computed}).encode(), field_v),
        ("version fractional", json.dumps({"version": 1.5, "metricsComputedAt": computed}).encode(), field_v),
        ("version boolean", json.dumps({"version": True, "metricsComputedAt": computed}).encode(), field_v),
        ("version null", json.dumps({"version": None, "metricsComputedAt": computed}).encode(), field_v),
        ("version 0", json.dumps({"version": 0, "metricsComputedAt": computed}).encode(), field_v),
        ("version -1", json.dumps({"version": -1, "metricsComputedAt": computed}).encode(), field_v),
        ("unknown version 999", json.dumps({"version": 999, "metricsComputedAt": computed}).encode(), field_v),
        ("version 2^63", json.dumps({"version": 2 ** 63, "metricsComputedAt": computed}).encode(), field_v),
        ("version 1e400", b'{"version": 1e400, "metricsComputedAt": "' + computed.encode() + b'"}', field_v),
        ("version NaN", b'{"version": NaN, "metricsComputedAt": "' + computed.encode() + b'"}', None),
        ("metricsComputedAt a number", json.dumps({"version": version, "metricsComputedAt": 1761748245123}).encode(),
         field_d),
        ("metricsComputedAt null", json.dumps({"version": version, "metricsComputedAt": None}).encode(), field_d),
        ("metricsComputedAt unparsable", json.dumps({"version": version, "metricsComputedAt": "yesterday"}).encode(),
         field_d),
        ("metricsComputedAt impossible date",
         json.dumps({"version": version, "metricsComputedAt": "2025-13-45T99:99:99.999Z"}).encode(), field_d),
        ("metricsComputedAt empty", json.dumps({"version": version, "metricsComputedAt": ""}).encode(), field_d),
        ("metricsComputedAt a date only", json.dumps({"version": version, "metricsComputedAt": computed[:10]}).encode(),
         field_d),
        ("metricsComputedAt SQL-looking",
         json.dumps({"version": version, "metricsComputedAt": "'; DROP TABLE profile_metrics; --"}).encode(), field_d),
        ("metricsComputedAt with control characters",
         json.dumps({"version": version, "metricsComputedAt": "2025-10-29\u0000T\u001b[31m"}).encode(), field_d),
        ("metricsComputedAt an object",
         json.dumps({"version": version, "metricsComputedAt": {"$gt": ""}}).encode(), field_d),
        ("deeply nested JSON (10,000 levels)", b'{"version": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
        ("invalid UTF-8", b'{"version": 1, "metricsComputedAt": "\xff\xfe"}', None),
    ]
    for title, raw, then in bad_bodies:
        ck.call(f"400 for {title}", "POST", ack, expect=400, token=t, raw=raw, then=code_is("request.invalid_body", then=then))
    pad = "x" * (20 * 1024)
    big = json.dumps({"version": version, "metricsComputedAt": computed, "pad": pad}).encode()
    too_large = code_is("request.body_too_large")
    ck.call("413 for a 20 KiB body", "POST", ack, expect=413, token=t, raw=big, then=too_large)
    ck.call("413 for a 20 KiB chunked body", "POST", ack, expect=413, token=t, raw=big, chunked=True, then=too_large)
    ck.call("413 for a 1 MiB body", "POST", ack, expect=413, token=t, raw=b'{"pad": "' + b"y" * (1 << 20) + b'"}',
            then=too_large)
    fits = json.dumps({"version": version, "metricsComputedAt": computed, "pad": "z" * (BODY_LIMIT - 200)}).encode()
    ck.call("a body just under 16 KiB is accepted", "POST", ack, expect=200, token=t, raw=fits, then=same_ack)

    log("== admin authentication ==")
    jobs_path = "/v1/admin/recompute"
    invalid_admin = code_is("auth.admin_token_invalid")
    for title, value, check in (("no token", None, code_is("auth.token_missing")),
                                ("a wrong token", "Bearer " + secrets.token_hex(32), invalid_admin),
                                ("a valid user JWT", tok(1001), invalid_admin),
                                ("the admin token as Basic", "Basic " + admin[7:], code_is("auth.authorization_malformed")),
                                ("the admin token with a suffix", admin + "x", invalid_admin),
                                ("the admin token prefix", admin[:-1], invalid_admin)):
        ck.call(f"401 listing jobs with {title}", "GET", jobs_path, expect=401, token=value, then=check)
        ck.call(f"401 triggering with {title}", "POST", jobs_path, expect=401, token=value, body={}, then=check)
    ck.call("401 reading a job without a token", "GET", jobs_path + "/1", expect=401, then=code_is("auth.token_missing"))
    ck.call("401 cancelling a job with a user JWT", "POST", jobs_path + "/1/cancel", expect=401, token=tok(1001),
            then=invalid_admin)

    log("== recompute jobs ==")
    ck.call("the job list", "GET", jobs_path, expect=200, token=admin)
    bulk = int(os.environ.get("METRICSD_CONTRACT_BULK_USERS", "10000"))
    if bulk > 0:
        started = time.monotonic()
        db.psql(bulk_sql(bulk))
        log(f"     (inserted {bulk} more valid users in {time.monotonic() - started:.1f} s so a job has work)")
    job = {}

    def created(r):
        j = r.json["data"]["job"]
        job.update(j)
        problems = []
        if r.header("location") != f"{jobs_path}/{j['id']}":
            problems.append(f"Location {r.header('location')!r} does not name job {j['id']}")
        if j["state"] not in ("pending", "running", "done"):
            problems.append(f"a new job in state {j['state']}")
        if metrics_of.get(1001) and j["version"] != metrics_of[1001]["version"]:
            problems.append(f"job version {j['version']} is not the served formula version")
        return problems

    ck.call("202 triggering a recompute (empty object body)", "POST", jobs_path, expect=202, token=admin, body={},
            then=created)
    if not job:
        return
    jid = job["id"]

    def retrigger(r):
        j = r.json["data"]["job"]
        if r.status == 200:
            if j is None:
                return [f"200 without a job although job {jid} exists"]
            return [] if j["id"] == jid else [f"200 returned job {j['id']}, expected the pending/running {jid}"]
        first_state = json.loads(http_request(ck.daemon.port, "GET", f"{jobs_path}/{jid}",
                                              {"Authorization": admin}).body)["data"]["job"]["state"]
        if first_state in ("pending", "running"):
            return [f"202 created job {j['id']} while job {jid} is still {first_state}"]
        results.note(f"job {jid} had already finished ({first_state}) when re-triggered, so the 200 path "
                     "(existing job returned) was not exercised")
        job["second"] = j["id"]
        return [f"Location {r.header('location')!r} does not name job {j['id']}"] \
            if r.header("location") != f"{jobs_path}/{j['id']}" else []

    ck.call("triggering again returns the pending/running job (200, created:false)", "POST", jobs_path,
            expect={200, 202}, token=admin, request_id=True, then=retrigger)

    def is_job(want_id):
        return lambda r: [] if r.json["data"]["job"]["id"] == want_id else [f"got job {r.json['data']['job']['id']}"]

    ck.call("read the job", "GET", f"{jobs_path}/{jid}", expect=200, token=admin, then=is_job(jid))
    target = job.get("second", jid)

    def cancel_outcome(r):
        if r.status == 200:
            return is_job(target)(r)
        state = json.loads(http_request(ck.daemon.port, "GET", f"{jobs_path}/{target}",
                                        {"Authorization": admin}).body)["data"]["job"]["state"]
        if state in ("pending", "running"):
            return [f"409 although job {target} is {state}"]
        results.note(f"job {target} had already finished ({state}) before the cancel, so cancel's 200 was not "
                     "exercised")
        return []

    ck.call("cancel the job", "POST", f"{jobs_path}/{target}/cancel", expect={200, 409}, token=admin,
            then=cancel_outcome)
    ck.call("cancel it again: 409", "POST", f"{jobs_path}/{target}/cancel", expect=409, token=admin,
            then=code_is("job.finished"))

    def listed(r):
        jobs = r.json["data"]["jobs"]
        ids = [j["id"] for j in jobs]
        problems = [] if target in ids else [f"job {target} missing from the list {ids}"]
        created_at = [j["createdAt"] for j in jobs]
        if created_at != sorted(created_at, reverse=True):
            problems.append(f"jobs are not most recent first: {list(zip(ids, created_at))}")
        return problems

    ck.call("the job list shows the jobs, most recent first", "GET", jobs_path, expect=200, token=admin, then=listed)
    for bad_id in ("0", "-1", "abc", "1.5", "1e3", "99999999999999999999", "%20", "0x10", "'%20OR%201=1", "+1"):
        ck.call(f"400 for job id {bad_id!r}", "GET", f"{jobs_path}/{bad_id}", expect=400, token=admin)
    ck.call("an encoded slash in a job id is no route or a bad id", "GET", f"{jobs_path}/1%2F2", expect={400, 404},
            token=admin)
    ck.call("400 cancelling job id 'abc'", "POST", f"{jobs_path}/abc/cancel", expect=400, token=admin)
    ck.call("404 for an unknown job", "GET", f"{jobs_path}/987654321", expect=404, token=admin)
    ck.call("404 cancelling an unknown job", "POST", f"{jobs_path}/987654321/cancel", expect=404, token=admin)
    for raw in (b"[1]", b"[null, null]", b"1", b'"x"', b"null", b"true", b"{", b"{}}"):
        ck.call(f"400 triggering with the body {raw.decode()!r} (not a JSON object)", "POST", jobs_path, expect=400,
                token=admin, raw=raw)
    ck.call("413 triggering with a 20 KiB body", "POST", jobs_path, expect=413, token=admin,
            raw=json.dumps({"pad": pad}).encode())
    ck.call("413 cancelling with a 20 KiB body", "POST", f"{jobs_path}/987654321/cancel", expect=413, token=admin,
            raw=json.dumps({"pad": pad}).encode())
    ck.call("413 cancelling with a 20 KiB chunked body", "POST", f"{jobs_path}/987654321/cancel", expect=413,
            token=admin, raw=json.dumps({"pad": pad}).encode(), chunked=True)

    # A complete job: trigger (again), wait for done, check the finished progress document.
    final = {}

    def remember_job(r):
        final.update(r.json["data"]["job"] or {})
        return []

    ck.call("trigger a job to completion", "POST", jobs_path, expect={200, 202}, token=admin, request_id=True,
            then=remember_job)
    if final:
        deadline = time.monotonic() + 180
        state = final["state"]
        while state in ("pending", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
            state = json.loads(http_request(ck.daemon.port, "GET", f"{jobs_path}/{final['id']}",
                                            {"Authorization": admin}).body)["data"]["job"]["state"]

        def finished(r):
            j = r.json["data"]["job"]
            problems = []
            if j["state"] != "done":
                problems.append(f"job {j['id']} is {j['state']} after 180 s (lastError {j['lastError']!r})")
                return problems
            if j["percent"] != 100:
                problems.append(f"a done job at {j['percent']} %")
            if j["startedAt"] is None or j["finishedAt"] is None:
                problems.append("a done job without startedAt/finishedAt")
            if j["usersExamined"] > j["usersTotal"]:
                problems.append(f"examined {j['usersExamined']} > total {j['usersTotal']}")
            if j["usersExamined"] != j["usersWritten"] + j["usersAlreadyCurrent"] + j["usersSkipped"]:
                problems.append(f"examined {j['usersExamined']} is not written {j['usersWritten']} + already current "
                                f"{j['usersAlreadyCurrent']} + skipped {j['usersSkipped']}")
            if j["finishedAt"] and j["startedAt"] and j["finishedAt"] < j["startedAt"]:
                problems.append("finishedAt before startedAt")
            return problems

        ck.call("the job completes: done, 100 %, times set", "GET", f"{jobs_path}/{final['id']}", expect=200,
                token=admin, then=finished)

        def nothing_left(r):
            data = r.json["data"]
            problems = [] if data["nothingToDo"] else ["nothingToDo is false after a finished job"]
            if (data["job"] or {}).get("id") != final["id"]:
                problems.append(f"job {(data['job'] or {}).get('id')} returned, expected the finished {final['id']}")
            if r.header("location") != f"{jobs_path}/{final['id']}":
                problems.append(f"Location {r.header('location')!r} does not name job {final['id']}")
            return problems

        ck.call("triggering after the job is done makes no job (200, nothingToDo)", "POST", jobs_path, expect=200,
                token=admin, then=nothing_left)
        ck.call("a same-version recompute keeps the acknowledgement", "GET", today, expect=200, token=t,
                then=acknowledged_now)


def run_database_down_checks(ck: Checker, db: Database, ctx: dict) -> None:
    """The database refuses connections (the daemon's are terminated): every operation that needs it answers 503
    with Retry-After, readiness 503, liveness 200; once the database is back the daemon serves again, unrestarted."""
    log("== database unavailable: 503 with Retry-After, then recovery ==")
    user = "Bearer " + mint_jwt(ctx["jwt_secret"], user_claims(1002))
    admin = ctx["admin_token"]
    jobs_path = "/v1/admin/recompute"

    def retry_after(r):
        value = r.header("retry-after") or ""
        return [] if value.isdigit() and int(value) > 0 else [f"Retry-After is {value!r}, wanted a positive integer"]

    db.psql(f'ALTER DATABASE "{db.name}" WITH ALLOW_CONNECTIONS false;\n'
            f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = '{db.name}' AND pid <> pg_backend_pid();", url=db.admin_url)
    try:
        ack = {"version": 1, "metricsComputedAt": "2025-10-29T14:30:45.123Z"}
        for method, path, token, body in (
                ("GET", "/v1/profile/metrics/today", user, None),
                ("POST", "/v1/profile/metrics/acknowledge", user, ack),
                ("POST", jobs_path, admin, None), ("GET", jobs_path, admin, None),
                ("GET", f"{jobs_path}/1", admin, None), ("POST", f"{jobs_path}/1/cancel", admin, None)):
            ck.call("503 with Retry-After while the database is down", method, path, expect=503, token=token,
                    body=body, then=retry_after)
        ck.call("not ready while the database is down", "GET", "/readyz", expect=503)
        ck.call("alive while the database is down", "GET", "/healthz", expect=200)
    finally:
        db.psql(f'ALTER DATABASE "{db.name}" WITH ALLOW_CONNECTIONS true;', url=db.admin_url)
    deadline = time.monotonic() + 30
    status = 0
    while time.monotonic() < deadline:
        try:
            status = http_request(ck.daemon.port, "GET", "/readyz", {}, None).status
        except Exception:  # noqa: BLE001
            status = 0
        if status == 200:
            break
        time.sleep(0.1)
    ck.results.record(status == 200, "ready again once the database is back, with no restart",
                      [f"/readyz answered {status}", ck.daemon.tail(20)])
    ck.call("serving again once the database is back", "GET", "/v1/profile/metrics/today", expect=200, token=user)


def run_admin_disabled_checks(ck: Checker, env: dict, workdir: Path, binary: str) -> None:
    log("== an instance without an admin token serves no admin API ==")
    daemon = Daemon(binary, workdir, "daemon-no-admin", dict(env))
    daemon.env.pop("METRICSD_ADMIN_TOKEN_FILE", None)
    daemon.start()
    try:
        ready, why = daemon.wait_ready()
        if not ck.results.record(ready, "second instance (no admin token) becomes ready", [why, daemon.tail(30)]):
            return
        admin = ck.admin_token
        for method, path in (("GET", "/v1/admin/recompute"), ("POST", "/v1/admin/recompute"),
                             ("GET", "/v1/admin/recompute/1"), ("POST", "/v1/admin/recompute/1/cancel")):
            ck.call(f"404 for {method} {path} without an admin API", method, path, expect=404, token=admin,
                    port=daemon.port)
        ck.call("404 without an admin API, even with no token", "GET", "/v1/admin/recompute", expect=404,
                port=daemon.port)
    finally:
        status, killed = daemon.stop()
        ck.results.record(status == 0 and not killed, "second instance exits 0 on SIGTERM",
                          [f"exit status {status}{' after SIGKILL' if killed else ''}", daemon.tail(20)])


# ----------------------------------------------------------------------------------------------------------------
# Fuzz: schemathesis driven by the document, every exchange re-validated here


def schemathesis_runs(user_token: str, admin_token: str, garbage: str) -> list[dict]:
    return [
        {"name": "user routes, valid user JWT", "include": r"^/v1/profile/", "auth": user_token, "examples": 600},
        {"name": "admin routes, admin token", "include": r"^/v1/admin/", "auth": admin_token, "examples": 120},
        {"name": "public routes", "include": r"^/(healthz|readyz|openapi\.yaml|metrics)$", "auth": None,
         "examples": 60},
        {"name": "all routes, invalid bearer", "include": r"^/v1/", "auth": "Bearer " + garbage, "examples": 40},
        {"name": "admin routes, user JWT", "include": r"^/v1/admin/", "auth": user_token, "examples": 25},
    ]


def run_fuzz(contract: Contract, results: Results, port: int, workdir: Path, runs: list[dict], scale: float,
             daemon: Daemon | None = None) -> tuple[int, int, int]:
    """Returns (requests, 5xx, violations)."""
    st = Path(sys.executable).parent / "st"
    if not st.exists():
        results.record(False, "schemathesis is installed", [f"{st} missing (run without --no-venv)"])
        return 0, 0, 0
    total = server_errors = violations = 0
    deadline = time.monotonic() + FUZZ_BUDGET_SECONDS
    # The five conformance checks, plus: schema-invalid input must get a 4xx (negative_data_rejection), methods
    # the document does not list must get 405 with Allow (unsupported_method, allow_header_conformance), and
    # protected operations must refuse requests without credentials (ignored_auth).
    checks = ",".join(("not_a_server_error", "status_code_conformance", "content_type_conformance",
                       "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
                       "unsupported_method", "allow_header_conformance", "ignored_auth"))
    def launch(index: int, run: dict) -> tuple[int, dict, int, object, float, Path, Path]:
        report_dir = workdir / f"schemathesis-{index}"
        har = report_dir / "exchanges.har"
        examples = max(1, int(run["examples"] * scale))
        command = [str(st), "run", str(contract.path), "--url", f"http://127.0.0.1:{port}",
                   "--checks", checks, "--mode", "all", "--phases", "examples,coverage,fuzzing",
                   "--max-examples", str(examples), "--seed", str(FUZZ_SEED + index), "--workers", "1",
                   "--generation-database", "none", "--no-color", "--request-timeout", "15",
                   "--suppress-health-check", "all", "--include-path-regex", run["include"],
                   "--report", "har", "--report-dir", str(report_dir), "--report-har-path", str(har),
                   "--output-truncate", "false", "--continue-on-failure", "--warnings", "off"]
        if run["auth"]:
            command += ["--header", f"Authorization: {run['auth']}"]
        env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="160", PYTHONUNBUFFERED="1")
        started = time.monotonic()
        output_path = workdir / f"schemathesis-{index}.log"
        with open(output_path, "w") as output:
            budget = max(10.0, deadline - time.monotonic())
            try:
                process = subprocess.run(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                         stderr=subprocess.STDOUT, timeout=budget)
                code: object = process.returncode
            except subprocess.TimeoutExpired:
                code = f"killed: the fuzz budget of {FUZZ_BUDGET_SECONDS} s ran out ({budget:.0f} s left for this run)"
        return index, run, examples, code, time.monotonic() - started, output_path, har

    # Schemathesis is CPU-bound (hypothesis generates the data); the runs are independent (each checks only that
    # every response conforms), so they share the machine's cores, longest first. Each run stays deterministic.
    jobs = int(os.environ.get("METRICSD_CONTRACT_FUZZ_JOBS", "0")) or max(1, min(2, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        launched = [pool.submit(launch, index, run) for index, run in enumerate(runs)]
        finished = [future.result() for future in launched]
    for index, run, examples, code, elapsed, output_path, har in finished:
        text = output_path.read_text(errors="replace")
        exchanges = read_har(har)
        count = len(exchanges)
        errors_here = sum(1 for e in exchanges if e["status"] >= 500)
        problems_here = []
        for e in exchanges:
            label, _, problems = contract.check_response(e["method"], e["path"], e["status"], e["headers"], e["body"],
                                                     sent_request_id=e["request_id"])
            results.exercised.add((label, e["status"]))
            if problems:
                problems_here.append(f"{e['method']} {excerpt(e['path'], 120)} body={excerpt(e['request_body'], 120)}"
                                     f" -> {e['status']}: {'; '.join(problems[:3])}; response {excerpt(e['body'], 200)}")
        lines = text.splitlines()
        summary = [lines[i + 1].strip() for i, l in enumerate(lines[:-1]) if l.strip() == "Test cases:"]
        summary += [l.strip() for l in lines if l.strip().startswith(("⚠️", "Failures:", "❌ ST"))][:6]
        total += count
        server_errors += errors_here
        violations += len(problems_here)
        details = []
        if code != 0:
            details.append(f"schemathesis exit status {code}; its report follows")
            details.extend(text.splitlines()[-80:])
        if errors_here and daemon is not None:
            for e in [e for e in exchanges if e["status"] >= 500][:5]:
                rid = e["headers"].get("x-request-id", ["?"])[0]
                details.append(f"5xx {e['method']} {e['path']} id {rid}: log {daemon.log_lines_with(rid)[:2]}")
        details.extend(problems_here[:15])
        if count == 0:
            details.append("no exchanges recorded")
        ok = code == 0 and not problems_here and errors_here == 0 and count > 0
        results.record(ok, f"fuzz '{run['name']}': {count} requests in {elapsed:.0f} s, 5xx {errors_here}, "
                           f"violations {len(problems_here)} (max-examples {examples})", details)
        for line in summary:
            log(f"       | {line.strip()}")
    return total, server_errors, violations


def read_har(path: Path) -> list[dict]:
    # Schemathesis may still be flushing the report when its process has exited (seen on a loaded machine: the
    # file parsed a moment later): a few tries before an unreadable report counts as no exchanges (a failure).
    data = None
    for _ in range(20):
        if path.exists():
            try:
                data = json.loads(path.read_text())
                break
            except json.JSONDecodeError:
                pass
        time.sleep(0.5)
    if data is None:
        return []
    exchanges = []
    for entry in data.get("log", {}).get("entries", []):
        request, response = entry["request"], entry["response"]
        if not response or response.get("status", 0) == 0:
            continue
        headers: dict[str, list[str]] = {}
        for h in response.get("headers", []):
            headers.setdefault(h["name"].lower(), []).append(h["value"])
        content = response.get("content", {})
        body = content.get("text", "") or ""
        body = base64.b64decode(body) if content.get("encoding") == "base64" else body.encode("utf-8")
        sent = {h["name"].lower(): h["value"] for h in request.get("headers", [])}
        url = urllib.parse.urlsplit(request["url"])
        exchanges.append({
            "method": request["method"], "path": url.path + (f"?{url.query}" if url.query else ""),
            "status": response["status"], "headers": headers, "body": body,
            "request_id": sent.get("x-request-id"),
            "request_body": (request.get("postData") or {}).get("text"),
        })
    return exchanges


# ----------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="only check the document and the harness itself")
    parser.add_argument("--skip-fuzz", action="store_true", help="contract checks only")
    parser.add_argument("--fuzz-scale", type=float, default=1.0, help="multiply the examples per operation")
    parser.add_argument("--no-venv", action="store_true", help="use this interpreter (its packages must be there)")
    parser.add_argument("--keep", action="store_true", help="keep the database and temporary files")
    args = parser.parse_args()

    if not args.no_venv and not os.environ.get("METRICSD_CONTRACT_IN_VENV"):
        python = ensure_venv()
        env = dict(os.environ, METRICSD_CONTRACT_IN_VENV="1")
        os.execve(str(python), [str(python), str(Path(__file__).resolve())] + sys.argv[1:], env)

    # A CI timeout or ^C still stops the daemon and drops the database (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    results = Results()
    contract = Contract(DOC_PATH)
    self_test(contract, results)
    if args.self_test or results.failed:
        log(f"contract: self-test {results.passed} passed, {results.failed} failed")
        return 1 if results.failed else 0

    binary = os.environ.get("METRICSD_BINARY")
    admin_url = os.environ.get("METRICSD_TEST_DATABASE_URL")
    if not binary or not admin_url:
        log("contract: FAIL METRICSD_BINARY and METRICSD_TEST_DATABASE_URL must be set")
        return 2
    pg_bin = Path(os.environ.get("METRICSD_PG_BIN", "/usr/lib/postgresql/15/bin"))
    tmp_root = os.environ.get("METRICSD_TEST_TMP") or None
    if tmp_root:
        Path(tmp_root).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"contract-{os.getpid()}-", dir=tmp_root))
    db = Database(admin_url, f"contract_{os.getpid()}", pg_bin)
    jwt_secret = secrets.token_hex(32)
    admin_secret = secrets.token_urlsafe(32)
    (workdir / "jwt-secret").write_text(jwt_secret)
    (workdir / "admin-token").write_text(admin_secret)
    os.chmod(workdir / "jwt-secret", 0o600)
    os.chmod(workdir / "admin-token", 0o600)
    daemon = None
    fuzz_total = fuzz_5xx = fuzz_violations = 0
    try:
        log(f"== setup: database {db.name}, files in {workdir} ==")
        db.create()
        env = daemon_env(db.url, workdir / "jwt-secret", workdir / "admin-token")
        for attempt in ("migrate", "migrate again (a no-op)"):
            result = subprocess.run([binary, "migrate"], env=env, capture_output=True, text=True, timeout=120,
                                    stdin=subprocess.DEVNULL)
            if not results.record(result.returncode == 0, f"metricsd {attempt} exits 0",
                                  [f"exit status {result.returncode}", excerpt(result.stderr[-2000:], 2000)]):
                return 1
        db.psql(seed_sql())
        results.record(True, f"seeded {len(VALID_USERS)} valid and {len(INVALID_USERS)} invalid users")
        daemon = Daemon(binary, workdir, "daemon", dict(env))
        daemon.start()
        ready, why = daemon.wait_ready()
        if not results.record(ready, f"metricsd serve on 127.0.0.1:{daemon.port} answers /readyz 200",
                              [why, daemon.tail(60)]):
            return 1
        checker = Checker(contract, results, daemon, [jwt_secret, admin_secret])
        checker.admin_token = "Bearer " + admin_secret
        ctx = {"jwt_secret": jwt_secret.encode(), "admin_token": "Bearer " + admin_secret}
        run_contract_checks(checker, db, ctx)
        run_admin_disabled_checks(checker, env, workdir, binary)
        if not args.skip_fuzz:
            log("== fuzz (schemathesis, driven by the document) ==")
            runs = schemathesis_runs("Bearer " + mint_jwt(ctx["jwt_secret"], user_claims(1002, lifetime=3 * 3600)),
                                     ctx["admin_token"], secrets.token_hex(16))
            fuzz_total, fuzz_5xx, fuzz_violations = run_fuzz(contract, results, daemon.port, workdir, runs,
                                                             args.fuzz_scale, daemon)
            results.record(fuzz_total >= MIN_FUZZ_REQUESTS * min(1.0, args.fuzz_scale),
                           f"fuzz sent {fuzz_total} requests (at least {MIN_FUZZ_REQUESTS} wanted)")
            results.record(daemon.alive(), "the daemon survived the fuzz run",
                           [f"exit status {daemon.process.returncode} (negative: killed by that signal)",
                            daemon.tail(40)])
        run_database_down_checks(checker, db, ctx)
        log("== shutdown ==")
        status, killed = daemon.stop()
        results.record(status == 0 and not killed, "metricsd exits 0 on SIGTERM",
                       [f"exit status {status}{' after SIGKILL (no exit within 30 s)' if killed else ''}",
                        daemon.tail(30)])
    except Exception as error:  # noqa: BLE001
        import traceback

        results.record(False, "harness error", [repr(error), traceback.format_exc()[-3000:]])
        if daemon is not None:
            log(daemon.tail(60))
    finally:
        if daemon is not None and daemon.alive():
            daemon.stop()
        if not args.keep:
            try:
                db.drop()
            except Exception as error:  # noqa: BLE001
                results.record(False, f"drop database {db.name}", [str(error)])
        if results.failed == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"contract: logs and reports kept in {workdir}")
    documented = {(op.operation_id, int(code)) for op in contract.operations for code in op.spec["responses"]}
    missing = sorted(documented - results.exercised)
    log(f"contract: {len(documented & results.exercised)} of {len(documented)} documented (operation, status) "
        f"pairs exercised; not exercised: {', '.join(f'{o} {s}' for o, s in missing) or 'none'}")
    for line in results.notes:
        log(f"contract: note: {line}")
    if results.failures:
        log("contract: failures:")
        for line in results.failures:
            log(f"  - {line[:400]}")
    log(f"contract: {time.monotonic() - started:.0f} s")
    log(f"contract: checks {results.passed} passed, {results.failed} failed, fuzz requests {fuzz_total}, "
        f"5xx {fuzz_5xx}, violations {fuzz_violations}")
    log(f"contract: {results.passed} passed, {results.failed} failed")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
