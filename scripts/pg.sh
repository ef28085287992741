#!/usr/bin/env bash
# pg.sh — find or start the Postgres server that `make run` and `make test` use.
#
#   scripts/pg.sh server-url       print a connection string for the server's
#                                  "postgres" database (the admin database)
#   scripts/pg.sh database-url DB  print a connection string for database DB,
#                                  creating DB if it does not exist
#   scripts/pg.sh start|stop|status   the private cluster under .dev/pg
#   scripts/pg.sh with-server CMD...  run CMD with TEST_DATABASE_URL set to
#                                  server-url; stop the private cluster after
#                                  CMD if this call started it
#   scripts/pg.sh with-database DB CMD...  the same with DATABASE_URL set to
#                                  database-url DB
#
# Which server: $DATABASE_URL (database-url) or $TEST_DATABASE_URL (server-url)
# when set; else a server answering on 127.0.0.1:5432 (user postgres, trust
# auth); else a private throwaway cluster under .dev/pg, created with the
# host's initdb and started with pg_ctl on 127.0.0.1:$SLUICE_DEV_PGPORT
# (default 54329). ($SLUICE_PG_PROBE_PORT changes the probed port 5432.)
# Postgres refuses to run as root, so as root the cluster
# runs as the postgres user.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dev="$root/.dev/pg"
port="${SLUICE_DEV_PGPORT:-54329}"
private_url="postgres://postgres@127.0.0.1:${port}/postgres?sslmode=disable"
probe_port="${SLUICE_PG_PROBE_PORT:-5432}"
system_url="postgres://postgres@127.0.0.1:${probe_port}/postgres?sslmode=disable"

die() { echo "pg.sh: $*" >&2; exit 1; }

# find_bin NAME: the path of a Postgres server binary.
find_bin() {
  local name=$1 dir
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  for dir in /usr/lib/postgresql/*/bin /usr/pgsql-*/bin /usr/local/opt/postgresql*/bin /opt/homebrew/opt/postgresql*/bin /opt/homebrew/bin /usr/local/pgsql/bin; do
    if [ -x "$dir/$name" ]; then echo "$dir/$name"; return; fi
  done
  return 1
}

need_server_bins() {
  initdb=$(find_bin initdb) && pg_ctl=$(find_bin pg_ctl) || die "no PostgreSQL server answers on 127.0.0.1:5432 and the server binaries (initdb, pg_ctl) are not installed.
Install PostgreSQL, for example:
  Debian/Ubuntu:  sudo apt install postgresql
  Fedora/RHEL:    sudo dnf install postgresql-server
  macOS:          brew install postgresql@16
or point DATABASE_URL / TEST_DATABASE_URL at a server."
}

# as_owner CMD...: run CMD as the cluster owner (postgres when we are root).
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root, but there is no 'postgres' user to run the private cluster as (Postgres refuses to run as root)"
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else
    "$@"
  fi
}

answers() { # answers HOST PORT
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$1" -p "$2" -t 2 >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/$1/$2") >/dev/null 2>&1
  fi
}

private_running() {
  [ -f "$dev/data/PG_VERSION" ] || return 1
  need_server_bins
  as_owner "$pg_ctl" -D "$dev/data" status >/dev/null 2>&1
}

start_private() {
  need_server_bins
  mkdir -p "$dev"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$dev" 2>/dev/null || true
    if ! as_owner test -w "$dev"; then
      # The checkout is not reachable by the postgres user (e.g. under /root):
      # keep the data in a private temp dir and link it from .dev/pg.
      local tmp="/tmp/sluice-dev-pg-$(echo "$root" | cksum | cut -d' ' -f1)"
      mkdir -p "$tmp" && chown postgres "$tmp" && chmod 700 "$tmp"
      rmdir "$dev" 2>/dev/null || true
      [ -e "$dev" ] || ln -s "$tmp" "$dev"
      dev="$tmp"
    fi
  fi
  if [ ! -f "$dev/data/PG_VERSION" ]; then
    echo "pg.sh: creating a private cluster in $dev/data" >&2
    as_owner "$initdb" -D "$dev/data" -U postgres --auth=trust --encoding=UTF8 --no-sync >"$dev/initdb.log" 2>&1 \
      || die "initdb failed; see $dev/initdb.log"
  fi
  if answers 127.0.0.1 "$port"; then
    die "port $port is taken by another server; set SLUICE_DEV_PGPORT to a free port"
  fi
  as_owner "$pg_ctl" -D "$dev/data" -l "$dev/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='' -c fsync=off -c max_connections=300" start >/dev/null \
    || die "pg_ctl start failed; see $dev/server.log"
  started=1
}
started=0

# server_url sets $url (not printed, so that $started survives).
server_url() {
  if [ -n "${TEST_DATABASE_URL:-}" ]; then url=$TEST_DATABASE_URL; return; fi
  if answers 127.0.0.1 "$probe_port"; then url=$system_url; return; fi
  private_running || start_private
  url=$private_url
}

# ensure_db ADMIN_URL DB: create database DB through ADMIN_URL unless it
# exists (names passed as psql variables, quoted by psql).
ensure_db() {
  local admin=$1 db=$2 exists
  exists=$(printf '%s\n' "SELECT 1 FROM pg_database WHERE datname = :'db'" | psql "$admin" -v db="$db" -tAq) || return 1
  if [ "$exists" != 1 ]; then
    echo "pg.sh: creating database $db" >&2
    printf '%s\n' 'CREATE DATABASE :"db"' | psql "$admin" -v db="$db" -q >/dev/null || return 1
  fi
}

# db_of URL: the database a connection string names ("" if none).
db_of() {
  case "$1" in
    postgres://*|postgresql://*)
      local rest=${1%%\?*}; rest=${rest#*://}
      case "$rest" in */*) echo "${rest#*/}" ;; *) echo "" ;; esac ;;
    *) printf '%s\n' "$1" | sed -n "s/.*dbname=\([^ ]*\).*/\1/p" ;;
  esac
}

# database_url DB sets $url to a connection string for DB, creating DB. With
# $DATABASE_URL set, it is that URL, and the database it names is created
# when the server answers but the database does not exist yet.
database_url() {
  local db=$1
  if [ -n "${DATABASE_URL:-}" ]; then
    url=$DATABASE_URL
    local named; named=$(db_of "$url")
    if [ -n "$named" ] && [ "$named" != postgres ] && command -v psql >/dev/null 2>&1; then
      ensure_db "$(with_db "$url" postgres)" "$named" 2>/dev/null \
        || echo "pg.sh: could not check or create database $named (the command will say why if it is missing)" >&2
    fi
    return
  fi
  TEST_DATABASE_URL="" server_url
  command -v psql >/dev/null 2>&1 || die "psql not found: install the PostgreSQL client so that make can create database $db"
  ensure_db "$url" "$db" || die "cannot query or create database $db on the server at 127.0.0.1"
  url=$(with_db "$url" "$db")
}

# run_then_stop CMD...: run CMD; stop the private cluster if we started it.
run_then_stop() {
  trap 'true' INT TERM
  local rc=0
  "$@" || rc=$?
  if [ "$started" = 1 ]; then
    echo "pg.sh: stopping the private cluster" >&2
    as_owner "$pg_ctl" -D "$(readlink -f "$dev")/data" -m fast -w stop >/dev/null || true
  fi
  exit $rc
}

# with_db URL DB: URL pointed at database DB.
with_db() {
  local url=$1 db=$2
  case "$url" in
    postgres://*|postgresql://*)
      local base=${url%%\?*} query=""
      [ "$base" != "$url" ] && query="?${url#*\?}"
      local authority=${base#*://}; authority=${authority%%/*}
      echo "${base%%://*}://${authority}/${db}${query}" ;;
    *) echo "$url dbname=$db" ;;
  esac
}

case "${1:-}" in
  server-url) server_url; echo "$url" ;;
  database-url) database_url "${2:?database-url needs a database name}"; echo "$url" ;;
  with-server)
    shift; server_url
    TEST_DATABASE_URL=$url run_then_stop "$@" ;;
  with-database)
    db=${2:?with-database needs a database name}; shift 2; database_url "$db"
    DATABASE_URL=$url run_then_stop "$@" ;;
  start) private_running || start_private; echo "$private_url" ;;
  stop)
    if private_running; then as_owner "$pg_ctl" -D "$(readlink -f "$dev")/data" -m fast -w stop >/dev/null; fi ;;
  status)
    if private_running; then echo "private cluster running: $private_url"; else echo "private cluster not running"; fi ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
esac
