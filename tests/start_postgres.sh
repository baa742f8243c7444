#!/usr/bin/env bash
# Starts a private PostgreSQL server for the test suite (data under /tmp, port 55432) and
# prints its SQLAlchemy URL. Idempotent: a server already running there is reused.
# `start_postgres.sh restart` restarts that server (the fault tests restart it mid-sweep).
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
data=/tmp/tuner-test-pg
port=55432
run_as=()
if [ "$(id -u)" = 0 ]; then run_as=(runuser -u postgres --); chown -R postgres /tmp/tuner-test-pg 2>/dev/null || true; fi
if [ "${1:-}" = restart ]; then
  "${run_as[@]}" "$bin/pg_ctl" -D "$data" -o "-p $port -k /tmp -c listen_addresses=127.0.0.1" -l "$data/log" -m fast -w restart >/dev/null
  exit 0
fi
if ! "${run_as[@]}" "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
  rm -rf "$data"; mkdir -p "$data"; [ "$(id -u)" = 0 ] && chown postgres "$data"
  "${run_as[@]}" "$bin/initdb" -D "$data" -U tuner --auth=trust >/dev/null
  "${run_as[@]}" "$bin/pg_ctl" -D "$data" -o "-p $port -k /tmp -c listen_addresses=127.0.0.1" -l "$data/log" -w start >/dev/null
fi
echo "postgresql+psycopg://tuner@127.0.0.1:$port/postgres"
