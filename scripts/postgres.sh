#!/usr/bin/env bash
# A private PostgreSQL server for drainpipe's tests and local use.
#
#   scripts/postgres.sh start     install Debian's postgresql if missing, initdb into $PGDATA_DIR, start it on
#                                 127.0.0.1:$PG_PORT, create the role and database; idempotent
#   scripts/postgres.sh stop      stop it (pg_ctl stop -m fast); idempotent
#   scripts/postgres.sh restart   stop, then start
#   scripts/postgres.sh status    exit 0 when it is running
#   scripts/postgres.sh url       print the connection URL (what tests read from DRAINPIPE_TEST_PG)
#   scripts/postgres.sh datadir   print the data directory
#
# The server runs as the `postgres` OS user (PostgreSQL refuses to run as root); the data dir is chowned to it.
# Settings (environment): PG_PORT (55432; when that port is taken by another process, e.g. a second checkout's
# test server, start picks a free one and records it in the server's postgresql.conf, where `url` reads it), PG_BASE (<repo>/.pg, or /tmp/drainpipe-pg-<hash> when the postgres user
# cannot reach the repo), PGDATA_DIR ($PG_BASE/data), PG_DB / PG_USER / PG_PASSWORD (drainpipe).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_PORT_SET="${PG_PORT:-}"
PG_PORT="${PG_PORT:-55432}"
PG_BASE_SET="${PG_BASE:-}"
PG_BASE="${PG_BASE:-$ROOT/.pg}"
PGDATA_SET="${PGDATA_DIR:-}"
PG_DB="${PG_DB:-drainpipe}"
PG_USER="${PG_USER:-drainpipe}"
PG_PASSWORD="${PG_PASSWORD:-drainpipe}"

url_of() { echo "postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"; }

say() { echo "postgres.sh: $*" >&2; }

resolve_base() {
    # <repo>/.pg, unless the postgres OS user cannot reach the repo (e.g. a clone under /root): then a private
    # directory under /tmp named after the repo path (the same on every call)
    if [ -z "$PG_BASE_SET" ] && id postgres >/dev/null 2>&1 && ! as_pg test -x "$ROOT"; then
        PG_BASE="/tmp/drainpipe-pg-$(printf %s "$ROOT" | md5sum | cut -c1-10)"
    fi
    PGDATA_DIR="${PGDATA_SET:-$PG_BASE/data}"
    LOG="$PG_BASE/postgres.log"
    # this checkout's server keeps the port it was last started on (unless PG_PORT says otherwise)
    local configured
    configured="$(grep -E '^port = [0-9]+' "$PGDATA_DIR/postgresql.conf" 2>/dev/null | tail -n 1 | awk '{print $3}')" || true
    if [ -z "$PG_PORT_SET" ] && [ -n "$configured" ]; then PG_PORT="$configured"; fi
}

# shellcheck source=ports.sh
. "$ROOT/scripts/ports.sh"

bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
    done
    return 1
}

as_pg() {
    # run a command as the postgres OS user (we may already be it)
    # (from /: the postgres user may not be allowed into the current directory; all paths here are absolute)
    if [ "$(id -un)" = postgres ]; then "$@"; return; fi
    if command -v runuser >/dev/null 2>&1; then (cd / && runuser -u postgres -- "$@")
    else (cd / && su postgres -s /bin/sh -c "$(printf '%q ' "$@")"); fi
}

ensure_installed() {
    if bindir >/dev/null; then return 0; fi
    if [ "$(id -u)" != 0 ]; then say "postgresql is not installed and we are not root: apt-get install postgresql"; exit 1; fi
    say "installing Debian's postgresql (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq postgresql >/dev/null
    # Debian's package creates and starts a default cluster on 5432; we do not need it.
    if command -v pg_lsclusters >/dev/null 2>&1; then
        pg_lsclusters -h 2>/dev/null | while read -r ver name port status _; do
            [ "$status" = online ] && pg_ctlcluster "$ver" "$name" stop || true
        done
    fi
    bindir >/dev/null || { say "postgresql install failed"; exit 1; }
}

running() {
    local bin; bin="$(bindir)" || return 1
    [ -f "$PGDATA_DIR/PG_VERSION" ] && as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1
}

psql_admin() {
    local bin; bin="$(bindir)"
    as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"
}

start() {
    ensure_installed
    resolve_base   # again: the postgres user exists now
    local bin; bin="$(bindir)"
    id postgres >/dev/null 2>&1 || { say "no postgres OS user (the postgresql package creates it)"; exit 1; }
    if ! as_pg test -x "$(dirname "$PG_BASE")"; then
        say "the postgres user cannot reach $(dirname "$PG_BASE"); set PG_BASE to a directory it can"
        exit 1
    fi
    mkdir -p "$PG_BASE"
    chown postgres: "$PG_BASE"
    chmod 700 "$PG_BASE"
    if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
        say "initdb $PGDATA_DIR"
        as_pg "$bin/initdb" -D "$PGDATA_DIR" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
            --encoding=UTF8 --no-locale >/dev/null
        local pw; pw="$(mktemp)"; chown postgres: "$pw"
        # the superuser needs no password over the socket; TCP logins use scram
        cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_BASE'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 50
EOF
        echo "host all postgres 127.0.0.1/32 trust" >"$pw"
        cat "$PGDATA_DIR/pg_hba.conf" >>"$pw"
        cp "$pw" "$PGDATA_DIR/pg_hba.conf"; rm -f "$pw"
        chown postgres: "$PGDATA_DIR/pg_hba.conf"
    fi
    if ! running; then
        if port_taken "$PG_PORT"; then   # another server (another checkout's?) has it: take a free port
            local old="$PG_PORT"
            PG_PORT="$(free_port)"
            echo "port = $PG_PORT" >>"$PGDATA_DIR/postgresql.conf"
            say "port $old is taken by another process; using $PG_PORT"
        fi
        as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" -l "$LOG" -w -t 60 start >/dev/null
    fi
    # role and database (idempotent)
    psql_admin <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD' CREATEDB;
  END IF;
END \$\$;
SQL
    if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]; then
        psql_admin -c "CREATE DATABASE $PG_DB OWNER $PG_USER" >/dev/null
    fi
    say "running on 127.0.0.1:$PG_PORT (data $PGDATA_DIR): $(url_of)"
}

stop() {
    local bin
    if ! bin="$(bindir)"; then return 0; fi
    if running; then
        as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 60 stop >/dev/null
        say "stopped"
    fi
}

resolve_base
case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status) running ;;
    datadir) echo "$PGDATA_DIR" ;;
    url) url_of ;;
    *) echo "usage: $0 start|stop|restart|status|url" >&2; exit 2 ;;
esac
