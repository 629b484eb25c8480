# shellcheck shell=bash
# debian/tests/lib.sh: what the package's tests (debian/tests/control) share. Sourced, not a test itself.
#
# The tests run as root on a Debian 12 host booted with systemd (autopkgtest's isolation-container or more;
# scripts/test-package runs them in a fresh Debian 12 root under systemd), from the top of the source tree.

TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOURCE_DIR="$(cd "$TESTS_DIR/../.." && pwd)"
BASE_URL="http://127.0.0.1:8080"
TEST_NAME="$(basename "$0")"
declare -a FAILURES=()

# Everything a test prints goes to stdout; stderr is for the commands it runs.
say() {
    printf '%s: %s\n' "$TEST_NAME" "$*"
}

# check DESCRIPTION COMMAND...: one assertion; a failure is recorded and the test goes on to the end.
check() {
    local description="$1"
    shift
    if "$@"; then
        printf '    ok: %s\n' "$description"
    else
        printf '    FAILED: %s\n' "$description"
        FAILURES+=("$description")
    fi
}

# The test's verdict: exit 1 when any assertion failed (and list them), else 0.
finish() {
    if ((${#FAILURES[@]})); then
        printf '%s: %d assertion(s) failed:\n' "$TEST_NAME" "${#FAILURES[@]}"
        printf '  %s\n' "${FAILURES[@]}"
        journalctl -u metricsd.service --no-pager -n 60 -o short-monotonic || true
        exit 1
    fi
    say "passed"
    exit 0
}

unit_property() {
    systemctl show -p "$1" --value "${2:-metricsd.service}"
}

# Active after READY, only the main process may notify, and the status line says it serves.
is_ready() {
    local unit="${1:-metricsd.service}" state status access
    state="$(unit_property ActiveState "$unit")"
    status="$(unit_property StatusText "$unit")"
    access="$(unit_property NotifyAccess "$unit")"
    echo "    $unit: ActiveState=$state SubState=$(unit_property SubState "$unit") NotifyAccess=$access MainPID=$(unit_property MainPID "$unit")"
    echo "    StatusText=$status"
    [[ "$state" == "active" && "$access" == "main" && "$status" == serving* ]]
}

http_status() {
    curl -sS -o /dev/null -w '%{http_code}' "$@"
}

# answers_200 PATH [BASE]: GET BASE/PATH answers 200.
answers_200() {
    local code
    code="$(http_status "${2:-$BASE_URL}$1")"
    echo "    GET ${2:-$BASE_URL}$1 -> $code"
    [[ "$code" == "200" ]]
}

# psql as PostgreSQL's superuser on the database metricsd (from /, which the user postgres may enter).
psql_db() {
    (cd / && runuser -u postgres -- psql -X -q -tA -v ON_ERROR_STOP=1 -d metricsd "$@")
}

# Whether the install steps (debian/tests/install) have run on this host: the database exists and the service is
# enabled.
installed_and_configured() {
    [[ "$(cd / && runuser -u postgres -- psql -X -tA -d postgres -c "SELECT count(*) FROM pg_database WHERE datname = 'metricsd'" 2>/dev/null)" == 1 ]] &&
        [[ "$(systemctl is-enabled metricsd.service 2>/dev/null)" == enabled ]]
}

# Runs the install steps unless an earlier test did: each test also runs on its own.
ensure_installed() {
    if ! installed_and_configured; then
        say "running the install steps first (debian/tests/install)"
        "$TESTS_DIR/install" >&2
    fi
}

# The demo users (scripts/demo-seed.sql: 300 valid users over 61 zones, 16 with bad settings), once.
ensure_users() {
    if [[ "$(psql_db -c 'SELECT count(*) FROM users')" == 0 ]]; then
        psql_db -f - <"$SOURCE_DIR/scripts/demo-seed.sql" >/dev/null
    fi
}

b64url() {
    base64 -w0 | tr '+/' '-_' | tr -d '='
}

# mint_token USER-ID: an HS256 JWT for the user, signed with the service's secret (its bytes without trailing
# CR/LF), valid for an hour.
mint_token() {
    local secret header payload now
    secret="$(tr -d '\r\n' </etc/credstore/metricsd-jwt-secret)"
    now="$(date +%s)"
    header="$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)"
    payload="$(printf '{"sub":"%s","iat":%d,"exp":%d}' "$1" "$now" $((now + 3600)) | b64url)"
    printf '%s.%s.%s\n' "$header" "$payload" \
        "$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -mac HMAC -macopt "key:$secret" -binary | b64url)"
}

# latest_metrics TOKEN [BASE]: the body of GET /v1/profile/metrics/today once it answers 200 (up to 60 s).
latest_metrics() {
    local body tries=0
    while ((tries++ < 120)); do
        body="$(curl -sS -w '\n%{http_code}' -H "Authorization: Bearer $1" "${2:-$BASE_URL}/v1/profile/metrics/today")" || true
        if [[ "${body##*$'\n'}" == "200" ]]; then
            printf '%s\n' "${body%$'\n'*}"
            return 0
        fi
        sleep 0.5
    done
    echo "    last answer: $body"
    return 1
}

# The served row's values (bmi, bmr, tdee, computedAt, version), one per line, from the JSON body on stdin: the
# "metrics" object's members (the explanations next to it have the same names).
metric_values() {
    sed -n 's/.*"metrics":{\([^}]*\)}.*/\1/p' | grep -o '"\(bmi\|bmr\|tdee\|computedAt\|version\)":[^,}]*'
}

# Every metrics row as it is now, in the test's own table NAME: snapshot_rows NAME, then rows_kept NAME.
snapshot_rows() {
    psql_db -c "DROP TABLE IF EXISTS $1; CREATE TABLE $1 AS SELECT user_id, metrics_date, version, computed_at FROM profile_metrics" >/dev/null
}

# Every row of the snapshot NAME is still there, unchanged (the daily schedule may add rows meanwhile: a zone
# whose 00:05 has not come yet still gets its previous date's run).
rows_kept() {
    local missing
    missing="$(psql_db -c "SELECT count(*) FROM $1 b WHERE NOT EXISTS (SELECT 1 FROM profile_metrics p
        WHERE (p.user_id, p.metrics_date, p.version, p.computed_at) = (b.user_id, b.metrics_date, b.version, b.computed_at))")"
    echo "    rows of $1 ($(psql_db -c "SELECT count(*) FROM $1")) missing or changed: $missing; rows now: $(psql_db -c 'SELECT count(*) FROM profile_metrics')"
    [[ "$missing" == 0 ]]
}

duplicate_rows() {
    psql_db -c "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date HAVING count(*) > 1) d"
}

no_failed_units() {
    local failed
    failed="$(systemctl --failed --no-legend --plain --no-pager)"
    [[ -z "$failed" ]] || echo "    failed units: $failed"
    [[ -z "$failed" ]]
}

# --- Clients across a restart, an upgrade or a crash ------------------------------------------------------------

# load_through LABEL COMMAND...: clients of the public port while COMMAND runs: two wrk runs of 8 keep-alive
# connections each (GET /healthz, and user 1's latest read), and a fresh curl connection to /healthz every 50 ms;
# COMMAND starts after 1 s of load, and the load goes on for 2 s after it returned (and the service is ready
# again). Every failed connection and request is counted. Prints one line and sets:
#   LOAD_REFUSED  connections refused (curl exit 7, wrk connect errors)
#   LOAD_FAILED   requests without a 2xx answer: reset or cut (curl 52/55/56, wrk read/write errors), timed
#                 out (curl 28, wrk timeouts), any other curl failure, non-2xx replies
#   LOAD_LONGEST  the longest any request waited for its answer, in seconds (wrk's maximum latency, curl's total)
#   LOAD_PROBES   probes made; LOAD_CONNECTIONS keep-alive connections (16); LOAD_STATUS COMMAND's exit status
load_through() {
    local label="$1" dir token stop started took
    shift
    dir="$(mktemp -d)"
    token="$(mint_token 1)"
    LOAD_CONNECTIONS=16
    wrk -t1 -c8 -d600s --timeout 10s "$BASE_URL/healthz" >"$dir/wrk-health" 2>&1 &
    local health=$!
    wrk -t1 -c8 -d600s --timeout 10s -H "Authorization: Bearer $token" "$BASE_URL/v1/profile/metrics/today" \
        >"$dir/wrk-latest" 2>&1 &
    local latest=$!
    stop="$dir/stop"
    (
        while [[ ! -e "$stop" ]]; do
            (
                at="$(date +%s%3N)"
                out="$(curl -sS -o /dev/null --max-time 10 -w '%{http_code} %{time_total}' "$BASE_URL/healthz" 2>"$dir/curl-$at")"
                echo "$? $out $at $(head -c 200 "$dir/curl-$at" | tr '\n' ' ')" >>"$dir/probes"
                rm -f "$dir/curl-$at"
            ) &
            sleep 0.05
        done
        wait
    ) &
    local probes=$!
    sleep 1
    started="$(date +%s%N)"
    LOAD_STATUS=0
    "$@" >"$dir/command" 2>&1 || LOAD_STATUS=$?
    ((LOAD_STATUS == 0)) || echo "    $label: the command failed (exit $LOAD_STATUS): $(tail -n 3 "$dir/command")"
    took="$((($(date +%s%N) - started) / 1000000))"
    local tries=0
    until [[ "$(unit_property ActiveState)/$(unit_property SubState)" == active/running ]] || ((tries++ > 100)); do sleep 0.1; done
    sleep 2
    touch "$stop"
    kill -INT "$health" "$latest" 2>/dev/null
    wait "$health" "$latest" "$probes" 2>/dev/null
    local wrk_requests wrk_connect wrk_failed wrk_longest
    read -r wrk_requests wrk_connect wrk_failed wrk_longest < <(cat "$dir/wrk-health" "$dir/wrk-latest" | awk '
        function seconds(text) {
            if (text ~ /us$/) return substr(text, 1, length(text) - 2) / 1000000
            if (text ~ /ms$/) return substr(text, 1, length(text) - 2) / 1000
            if (text ~ /m$/) return substr(text, 1, length(text) - 1) * 60
            if (text ~ /s$/) return substr(text, 1, length(text) - 1)
            return text
        }
        / requests in / { requests += $1 }
        /Latency/ { if (seconds($4) > longest) longest = seconds($4) }
        /Socket errors:/ { gsub(",", ""); connect += $4; failed += $6 + $8 + $10 }
        /Non-2xx or 3xx responses:/ { failed += $5 }
        END { printf "%d %d %d %.3f\n", requests, connect, failed, longest }')
    local probe_count probe_refused probe_failed probe_longest
    read -r probe_count probe_refused probe_failed probe_longest < <(awk '
        { count++ }
        $1 == 7 { refused++ }
        $1 != 7 && ($1 != 0 || $2 !~ /^2/) { failed++ }
        $1 == 0 && $3 > longest { longest = $3 }
        END { printf "%d %d %d %.3f\n", count, refused, failed, longest }' "$dir/probes")
    LOAD_PROBES="$probe_count"
    LOAD_REFUSED=$((wrk_connect + probe_refused))
    LOAD_FAILED=$((wrk_failed + probe_failed))
    LOAD_LONGEST="$(awk -v a="$wrk_longest" -v b="$probe_longest" 'BEGIN { printf "%.3f", (a > b ? a : b) }')"
    printf '    %s (%s took %d ms): wrk, 16 keep-alive connections: %d requests, %d connect errors, %d failed, longest %s s; %d fresh connections: %d refused, %d failed, longest %s s => refused %d, failed %d, longest wait %s s\n' \
        "$label" "$1" "$took" "$wrk_requests" "$wrk_connect" "$wrk_failed" "$wrk_longest" "$probe_count" "$probe_refused" \
        "$probe_failed" "$probe_longest" "$LOAD_REFUSED" "$LOAD_FAILED" "$LOAD_LONGEST"
    grep -h 'Socket errors\|Non-2xx' "$dir/wrk-health" "$dir/wrk-latest" | sed 's/^/      wrk: /'
    # Each fresh connection that was not answered 2xx: curl's exit code, the status, its time, when it started
    # (ms after the command began) and what curl said.
    awk -v started="$((started / 1000000))" '$1 != 0 || $2 !~ /^2/ {
        message = ""; for (i = 5; i <= NF; i++) message = message " " $i
        printf "      probe: curl exit %s, status %s, %s s, started %+d ms after the command:%s\n", $1, $2, $3, $4 - started, message
    }' "$dir/probes"
    rm -rf -- "$dir"
}

# below SECONDS LIMIT: SECONDS (a decimal) is below LIMIT.
below() {
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'
}
