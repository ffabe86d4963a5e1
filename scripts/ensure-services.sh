#!/usr/bin/env bash
# Make sure PostgreSQL and Redis answer on 127.0.0.1; start them if installed but stopped.
set -euo pipefail
PG_HOST=127.0.0.1 PG_PORT=5432 REDIS_PORT=6379

pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start
  else
    echo "PostgreSQL is not installed (need a server on $PG_HOST:$PG_PORT; Debian: apt-get install postgresql)" >&2
    exit 1
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { echo "PostgreSQL did not come up on $PG_HOST:$PG_PORT" >&2; exit 1; }
fi

if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
      --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  else
    echo "Redis is not installed (need a server on 127.0.0.1:$REDIS_PORT; Debian: apt-get install redis-server)" >&2
    exit 1
  fi
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
  redis_up || { echo "Redis did not come up on 127.0.0.1:$REDIS_PORT" >&2; exit 1; }
fi
echo "PostgreSQL and Redis are up"
