# shellcheck shell=bash
# scripts/lib.sh: helpers shared by metricsd's shell scripts. Source it, don't run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sets METRICSD_ROOT (the repository root) and defines die/warn/note, timing helpers and
# metricsd_pg_bin (the PostgreSQL bin directory).

# shellcheck disable=SC2034 # used by the scripts that source this file
METRICSD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
METRICSD_SCRIPT_NAME="${METRICSD_SCRIPT_NAME:-$(basename "$0")}"

# runuser and useradd live in /usr/sbin, which a non-login root shell may not have on PATH.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
case ":$PATH:" in *:/sbin:*) ;; *) PATH="$PATH:/sbin" ;; esac
export PATH

die() {
    printf '%s: error: %s\n' "$METRICSD_SCRIPT_NAME" "$*" >&2
    exit 1
}

warn() {
    printf '%s: warning: %s\n' "$METRICSD_SCRIPT_NAME" "$*" >&2
}

note() {
    printf '%s: %s\n' "$METRICSD_SCRIPT_NAME" "$*" >&2
}

# Milliseconds since the epoch.
now_ms() {
    date +%s%3N
}

# Formats a duration in milliseconds: "0.4s", "12.3s", "2m05.1s".
format_ms() {
    local ms="$1"
    local tenths=$(((ms % 1000) / 100))
    local secs=$((ms / 1000))
    if ((secs >= 60)); then
        printf '%dm%02d.%ds' $((secs / 60)) $((secs % 60)) "$tenths"
    else
        printf '%d.%ds' "$secs" "$tenths"
    fi
}

# Prints the PostgreSQL bin directory (initdb, pg_ctl, psql): $METRICSD_PG_BIN if set, else
# Debian's /usr/lib/postgresql/15/bin, else `pg_config --bindir`. Returns 1 when none has pg_ctl.
metricsd_pg_bin() {
    if [[ -n "${METRICSD_PG_BIN:-}" ]]; then
        if [[ -x "$METRICSD_PG_BIN/pg_ctl" ]]; then
            printf '%s\n' "$METRICSD_PG_BIN"
            return 0
        fi
        warn "METRICSD_PG_BIN=$METRICSD_PG_BIN has no executable pg_ctl"
        return 1
    fi
    if [[ -x /usr/lib/postgresql/15/bin/pg_ctl ]]; then
        printf '%s\n' /usr/lib/postgresql/15/bin
        return 0
    fi
    local dir
    if command -v pg_config >/dev/null 2>&1 && dir="$(pg_config --bindir 2>/dev/null)" && [[ -x "$dir/pg_ctl" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    return 1
}
