# shellcheck shell=bash
# scripts/lib.sh: helpers shared by metricsd's shell scripts. Source it, don't run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sets METRICSD_ROOT (the repository root) and defines die/warn/note, timing helpers,
# metricsd_pg_bin (the PostgreSQL bin directory), and the helpers that run servers as the
# unprivileged user metricsd-pg in sessions of their own (spawn_server, stop_server).

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

# ---------------------------------------------------------------------------------------------
# Servers run by the scripts (scripts/pg-cluster, scripts/ha-cluster): as root they run as the unprivileged
# system user metricsd-pg (initdb, postgres and pgbouncer refuse root), otherwise as the current user; each in
# a session and process group of its own, so that stopping one ends exactly its processes.

# shellcheck disable=SC2034 # used by the scripts that source this file
PG_OS_USER="${METRICSD_PG_OS_USER:-metricsd-pg}"
if [[ "$(id -u)" -eq 0 ]]; then IS_ROOT=1; else IS_ROOT=0; fi

# Absolute form of a directory argument (it need not exist yet).
abs_dir() {
    [[ -n "$1" ]] || die "empty directory argument"
    realpath -m -- "$1"
}

# The user the servers run as: metricsd-pg as root, the current user otherwise.
server_user() {
    if ((IS_ROOT)); then printf '%s\n' "$PG_OS_USER"; else id -un; fi
}

# Runs a command as USER from / (so an unreadable working directory doesn't bother postgres).
run_as() {
    local user="$1"
    shift
    if ((IS_ROOT)); then
        (cd / && runuser -u "$user" -- "$@")
    else
        (cd / && "$@")
    fi
}

ensure_os_user() {
    getent passwd "$PG_OS_USER" >/dev/null && return 0
    command -v useradd >/dev/null || die "useradd not found; cannot create system user $PG_OS_USER"
    local lockdir=/run/lock
    [[ -d "$lockdir" && -w "$lockdir" ]] || lockdir=/tmp
    # Serialised, so that concurrent `create`s on a fresh machine don't race on useradd.
    (
        flock -w 60 9 || die "timed out waiting for $lockdir/metricsd-pg-useradd.lock"
        if ! getent passwd "$PG_OS_USER" >/dev/null; then
            useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
                --comment "metricsd private PostgreSQL clusters" "$PG_OS_USER" ||
                die "could not create system user $PG_OS_USER"
            note "created system user $PG_OS_USER (initdb refuses to run as root)"
        fi
    ) 9>"$lockdir/metricsd-pg-useradd.lock"
}

# As root: makes sure USER can reach DIR by granting search (x) permission on any ancestor
# that denies it (an ACL entry when setfacl exists, else o+x; never read permission).
ensure_reachable() {
    local user="$1" dir="$2"
    run_as "$user" test -x "$dir" && return 0
    local path="" part
    local -a parts
    IFS=/ read -r -a parts <<<"${dir#/}"
    for part in "" "${parts[@]}"; do
        [[ -z "$part" && -n "$path" ]] && continue
        path="${path%/}/$part"
        [[ -d "$path" ]] || break
        if ! run_as "$user" test -x "$path"; then
            if command -v setfacl >/dev/null 2>&1 && setfacl -m "u:$user:x" -- "$path" 2>/dev/null; then
                note "granted $user search permission on $path (ACL) so it can reach $dir"
            else
                chmod o+x -- "$path" || die "cannot grant $user access to $path"
                note "granted search permission (o+x) on $path so that $user can reach $dir"
            fi
        fi
    done
    run_as "$user" test -x "$dir" || die "$user cannot reach $dir; put the cluster somewhere it can reach"
}

make_owned_dir() {
    local owner="$1" path="$2"
    mkdir -p -- "$path" || die "cannot create $path"
    if ((IS_ROOT)); then
        chown "$owner:" -- "$path" || die "cannot chown $path to $owner"
    fi
}

# Writes stdin to FILE (mode 0600, owned by OWNER as root), replacing it in one rename.
write_owned_file() {
    local owner="$1" file="$2" tmp="$2.tmp.$$"
    cat >"$tmp" || die "cannot write $tmp"
    chmod 0600 -- "$tmp"
    if ((IS_ROOT)); then chown "$owner:" -- "$tmp"; fi
    mv -f -- "$tmp" "$file" || die "cannot write $file"
}

# Exits with an error naming what holds 127.0.0.1:PORT: a listener, or a connection whose local end is PORT (an
# outgoing connection takes its local port from net.ipv4.ip_local_port_range, 32768-60999 by default, so a port
# in that range may be taken at any moment; below it, only a listener takes it). TIME-WAIT does not count: every
# server here binds with SO_REUSEADDR.
require_free_port() {
    local port="$1" what="$2" holder
    if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then die "invalid port '$port' for $what"; fi
    holder="$(ss -Htanp "( sport = :$port )" 2>/dev/null | { grep -v '^TIME-WAIT' || true; } | head -n 1)"
    [[ -z "$holder" ]] || die "port $port (for $what) is in use: $holder"
}

# spawn_server USER PIDFILE LOG COMMAND...: starts COMMAND from / in a new session, as USER when root, with
# stdin from /dev/null and stdout and stderr appended to LOG, and writes its pid — which is also its process
# group and session id — to PIDFILE. Returns once PIDFILE is written, not when the server is ready.
spawn_server() {
    local user="$1" pidfile="$2" log="$3" i
    shift 3
    local -a as_user=()
    if ((IS_ROOT)) && [[ "$user" != root ]]; then
        as_user=(setpriv "--reuid=$user" "--regid=$(id -g "$user")" --init-groups)
        touch -- "$log" && chown "$user:" -- "$log"
    fi
    rm -f -- "$pidfile"
    # setsid forks when the caller leads a process group (job control): the pid is written by the process
    # that then becomes the server, never guessed from $!.
    (cd / && exec setsid sh -c 'echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"' "$pidfile" \
        "${as_user[@]}" "$@" </dev/null >>"$log" 2>&1) &
    for ((i = 0; i < 100; i++)); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.05
    done
    die "$1 did not start (no $pidfile); see $log"
}

# Processes of process group PGID that are not zombies.
group_alive() {
    ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# Prints the pid in PIDFILE when that process is alive and its command line contains MARKER (the server's
# configuration or data path), so that a pid reused by another process is never signalled.
server_pid() {
    local pidfile="$1" marker="$2" pid
    [[ -s "$pidfile" ]] || return 1
    pid="$(head -n 1 -- "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$marker" || return 1
    printf '%s\n' "$pid"
}

# stop_server PIDFILE MARKER [SIGNAL [TIMEOUT]]: sends SIGNAL (TERM) to the server's process group, waits up to
# TIMEOUT seconds (30) for the group to end, then sends SIGKILL. No-op when it is not running.
stop_server() {
    local pidfile="$1" marker="$2" signal="${3:-TERM}" timeout="${4:-30}" pid i
    if ! pid="$(server_pid "$pidfile" "$marker")"; then
        rm -f -- "$pidfile"
        return 0
    fi
    kill "-$signal" -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 20; i++)); do
        group_alive "$pid" || break
        sleep 0.05
    done
    if group_alive "$pid"; then
        warn "process group $pid ($marker) still running ${timeout}s after SIG$signal: sending SIGKILL"
        kill -KILL -- "-$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            group_alive "$pid" || break
            sleep 0.05
        done
        group_alive "$pid" && die "process group $pid ($marker) survives SIGKILL"
    fi
    rm -f -- "$pidfile"
}
