#!/usr/bin/env bash
# Local Bazel remote services on 127.0.0.1: BuildGrid's CAS and action cache (kept in Redis), and
# optionally its execution service with buildbox workers.
#
#   tools/remote/services.sh install        # BuildGrid (pinned) into a venv of its own, from pip's indexes;
#                                           # Redis (pinned, Debian bookworm) unpacked
#   tools/remote/services.sh start          # Redis and the remote cache, in the background; returns once they answer
#   tools/remote/services.sh install-exec   # + buildbox (pinned, Debian sid) with its libraries, unpacked
#   tools/remote/services.sh start-exec [N] # cache + execution: PostgreSQL, Redis, BuildGrid, buildbox-casd, N workers (2)
#   tools/remote/services.sh stop           # stops what start / start-exec started (and nothing else)
#   tools/remote/services.sh status
#
# Everything lives under MLLM_REMOTE_STATE (default ~/.cache/mllm_kernel_remote): the venv, the
# server's configuration, its storage, logs and pid files. MLLM_REMOTE_PORT: default 50051;
# MLLM_REMOTE_REDIS_PORT: the action cache's Redis (default 56379); MLLM_REMOTE_PG_PORT /
# MLLM_REMOTE_PG_DIR: the scheduler's PostgreSQL (default 55432; see PG_DIR).
# Then: bazel build --config=remote-cache //:wheel, or --config=remote (.bazelrc; README "Remote cache").
set -euo pipefail
BUILDGRID_VERSION=0.4.4
PSYCOPG2_VERSION=2.9.13
REDIS_PY_VERSION=5.2.1
REDIS_VERSION=5:7.0.15-1~deb12u10  # Debian bookworm's redis-server / redis-tools
BUILDBOX_VERSION=1.4.30+dfsg-1+b1
STATE=${MLLM_REMOTE_STATE:-$HOME/.cache/mllm_kernel_remote}
PORT=${MLLM_REMOTE_PORT:-50051}
PG_PORT=${MLLM_REMOTE_PG_PORT:-55432}
REDIS_PORT=${MLLM_REMOTE_REDIS_PORT:-56379}
ADDRESS=127.0.0.1:$PORT
HERE=$(cd "$(dirname "$0")" && pwd)
PIDFILE=$STATE/buildgrid.pid
SID=$STATE/buildbox  # buildbox and the Debian sid libraries it needs, unpacked (never installed)
# The scheduler's PostgreSQL cluster (jobs only: the caches live in BuildGrid's storage). As root
# its server runs as nobody, who may not reach into root's home, so it then lives under /tmp.
if [[ $EUID == 0 ]]; then PG_DIR=${MLLM_REMOTE_PG_DIR:-/tmp/mllm_kernel_remote_pg}; else PG_DIR=${MLLM_REMOTE_PG_DIR:-$STATE/pg}; fi

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/${1:-$PORT}") 2>/dev/null; }

# PostgreSQL refuses to run as root: as root, its server runs as nobody.
as_db_user() { if [[ $EUID == 0 ]]; then setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; else "$@"; fi; }
pg_bin() {  # the machine's PostgreSQL (Debian: postgresql-15) or one unpacked by install-exec
  local d
  for d in "$STATE"/postgresql/usr/lib/postgresql/*/bin /usr/lib/postgresql/*/bin; do
    [[ -x $d/pg_ctl ]] && { echo "$d"; return; }
  done
  echo "services.sh: no PostgreSQL server found (run '$0 install-exec')" >&2
  return 1
}

# Starts BuildGrid with configuration template $1 (fills in @ADDRESS@, @STATE@, @PG_PORT@, @REDIS_PORT@).
start_buildgrid() {
  [[ -x $STATE/venv/bin/bgd ]] || { echo "services.sh: run '$0 install' first" >&2; exit 1; }
  if running; then echo "BuildGrid already running (pid $(cat "$PIDFILE")) on $ADDRESS"; return 0; fi
  if answers; then echo "services.sh: something else listens on $ADDRESS (set MLLM_REMOTE_PORT)" >&2; exit 1; fi
  mkdir -p "$STATE/cas"
  sed -e "s|@ADDRESS@|$ADDRESS|" -e "s|@STATE@|$STATE|" -e "s|@PG_PORT@|$PG_PORT|" -e "s|@REDIS_PORT@|$REDIS_PORT|" \
    "$1" > "$STATE/buildgrid.yml"
  setsid "$STATE/venv/bin/bgd" server start "$STATE/buildgrid.yml" > "$STATE/buildgrid.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 60); do  # 30 s at most
    if answers; then echo "BuildGrid (pid $(cat "$PIDFILE")) on grpc://$ADDRESS"; return 0; fi
    running || break
    sleep 0.5
  done
  echo "services.sh: BuildGrid did not come up on $ADDRESS; its log ($STATE/buildgrid.log) ends with:" >&2
  tail -5 "$STATE/buildgrid.log" >&2
  "$0" stop > /dev/null
  exit 1
}

start_redis() {  # the action cache's Redis on 127.0.0.1:$REDIS_PORT, its append-only file in $STATE/redis-data
  [[ -x $STATE/redis/usr/bin/redis-server ]] || { echo "services.sh: run '$0 install' first" >&2; exit 1; }
  mkdir -p "$STATE/redis-data" "$STATE/pids" "$STATE/logs"
  if [[ -f $STATE/pids/redis.pid ]] && kill -0 "$(cat "$STATE/pids/redis.pid")" 2>/dev/null; then return 0; fi
  if answers "$REDIS_PORT"; then echo "services.sh: something else listens on 127.0.0.1:$REDIS_PORT (set MLLM_REMOTE_REDIS_PORT)" >&2; exit 1; fi
  LD_LIBRARY_PATH=$STATE/redis/usr/lib/x86_64-linux-gnu setsid "$STATE/redis/usr/bin/redis-server" \
    --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$STATE/redis-data" --appendonly yes --save "" \
    --logfile "$STATE/logs/redis.log" > /dev/null 2>&1 < /dev/null &
  echo $! > "$STATE/pids/redis.pid"
  for _ in $(seq 1 40); do answers "$REDIS_PORT" && break; sleep 0.25; done
  answers "$REDIS_PORT" || { echo "services.sh: Redis did not start ($STATE/logs/redis.log)" >&2; exit 1; }
  echo "Redis on 127.0.0.1:$REDIS_PORT (data: $STATE/redis-data)"
}

start_postgres() {  # a private cluster in $PG_DIR on 127.0.0.1:$PG_PORT, database bgd with BuildGrid's tables
  local bin
  bin=$(pg_bin)
  mkdir -p "$PG_DIR"
  [[ $EUID == 0 ]] && chown nobody:nogroup "$PG_DIR" && chmod 700 "$PG_DIR"
  if [[ ! -f $PG_DIR/data/PG_VERSION ]]; then
    as_db_user "$bin/initdb" -D "$PG_DIR/data" -U bgd --auth=trust > "$STATE/pg-initdb.log" 2>&1 || {
      echo "services.sh: initdb failed ($STATE/pg-initdb.log)" >&2; exit 1; }
  fi
  as_db_user "$bin/pg_ctl" -D "$PG_DIR/data" status > /dev/null 2>&1 ||
    as_db_user "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 30 \
      -o "-h 127.0.0.1 -p $PG_PORT -k $PG_DIR -c jit=off" start > /dev/null
  "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U bgd -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'bgd'" |
    grep -q 1 || "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U bgd bgd
  "$STATE/venv/bin/python" -c "
import sqlalchemy, buildgrid.server.sql.models as m
m.Base.metadata.create_all(sqlalchemy.create_engine('postgresql+psycopg2://bgd@127.0.0.1:$PG_PORT/bgd'))"
  echo "PostgreSQL on 127.0.0.1:$PG_PORT (data: $PG_DIR/data)"
}

start_workers() {  # buildbox-casd (the workers' local CAS, backed by BuildGrid's) and $1 workers
  [[ -x $STATE/bin/buildbox-worker ]] || { echo "services.sh: run '$0 install-exec' first" >&2; exit 1; }
  mkdir -p "$STATE/casd" "$STATE/pids" "$STATE/logs"
  for f in "$STATE"/pids/worker*.pid "$STATE/pids/casd.pid"; do stop_group "$f"; done  # a second start-exec
  rm -f "$STATE/casd.sock"
  setsid "$STATE/bin/buildbox-casd" --cas-remote="http://$ADDRESS" --bind="unix:$STATE/casd.sock" "$STATE/casd" \
    > "$STATE/logs/casd.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pids/casd.pid"
  for _ in $(seq 1 40); do [[ -S $STATE/casd.sock ]] && break; sleep 0.25; done
  [[ -S $STATE/casd.sock ]] || { echo "services.sh: buildbox-casd did not start ($STATE/logs/casd.log)" >&2; exit 1; }
  local i
  for ((i = 0; i < $1; ++i)); do
    setsid "$STATE/bin/buildbox-worker" --bots-remote="http://$ADDRESS" --cas-remote="unix:$STATE/casd.sock" \
      --buildbox-run="$STATE/bin/buildbox-run-hosttools" --platform OSFamily=linux --platform ISA=x86-64 \
      "worker$i" > "$STATE/logs/worker$i.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pids/worker$i.pid"
  done
  echo "buildbox-casd and $1 worker(s) running (logs: $STATE/logs)"
}

stop_group() {  # $1: pid file of a process started with setsid; TERM its group, then KILL
  [[ -f $1 ]] || return 0
  local pid
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

case "${1:-}" in
  install)
    mkdir -p "$STATE"
    [[ -x $STATE/venv/bin/python ]] || python3 -m venv "$STATE/venv"
    "$STATE/venv/bin/python" -m pip install -q --disable-pip-version-check "buildgrid==$BUILDGRID_VERSION" \
      "psycopg2-binary==$PSYCOPG2_VERSION" "redis==$REDIS_PY_VERSION"
    "$STATE/venv/bin/bgd" --help > /dev/null
    if [[ ! -x $STATE/redis/usr/bin/redis-server ]]; then  # unpacked with its two libraries, never installed
      rm -rf "$STATE/redis-debs" "$STATE/redis" && mkdir -p "$STATE/redis-debs"
      (cd "$STATE/redis-debs" && apt-get download -q "redis-server=$REDIS_VERSION" "redis-tools=$REDIS_VERSION" \
        libjemalloc2/bookworm liblzf1/bookworm > /dev/null 2>&1)
      for deb in "$STATE"/redis-debs/*.deb; do dpkg -x "$deb" "$STATE/redis"; done
    fi
    LD_LIBRARY_PATH=$STATE/redis/usr/lib/x86_64-linux-gnu "$STATE/redis/usr/bin/redis-server" --version > /dev/null
    echo "BuildGrid $BUILDGRID_VERSION installed in $STATE/venv; Redis $REDIS_VERSION in $STATE/redis"
    ;;
  install-exec)
    "$0" install
    # buildbox from Debian sid (the apt configuration must list sid) and the libraries it needs
    # there, unpacked under $SID; PostgreSQL likewise when the machine has none.
    if [[ ! -x $STATE/bin/buildbox-worker ]]; then
      rm -rf "$STATE/debs" "$SID" && mkdir -p "$STATE/debs" "$SID" "$STATE/bin"
      libs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
               --no-enhances -o APT::Default-Release=sid "buildbox=$BUILDBOX_VERSION" 2>/dev/null | grep -E "^lib" | sort -u)
      (cd "$STATE/debs" && apt-get download -q "buildbox=$BUILDBOX_VERSION" > /dev/null 2>&1 &&
        for p in $libs; do apt-get download -q "$p/sid" > /dev/null 2>&1; done)
      for deb in "$STATE"/debs/*.deb; do dpkg -x "$deb" "$SID"; done
      # Each program runs through sid's own loader and libraries (this machine's glibc is older
      # than the one they need); the host's libraries stay out of them, and the actions the
      # runner starts use the host's as usual (no LD_LIBRARY_PATH is set).
      for program in buildbox-casd buildbox-worker buildbox-run-hosttools; do
        printf '#!/bin/sh\nexec "%s/usr/lib64/ld-linux-x86-64.so.2" --library-path "%s/usr/lib/x86_64-linux-gnu:%s/lib/x86_64-linux-gnu" "%s/usr/bin/%s" "$@"\n' \
          "$SID" "$SID" "$SID" "$SID" "$program" > "$STATE/bin/$program"
        chmod +x "$STATE/bin/$program"
      done
    fi
    "$STATE/bin/buildbox-worker" --help > /dev/null
    if ! pg_bin > /dev/null 2>&1; then
      (cd "$STATE/debs" && apt-get download -q postgresql-15 postgresql-client-15 > /dev/null 2>&1)
      for deb in "$STATE"/debs/postgresql-*.deb; do dpkg -x "$deb" "$STATE/postgresql"; done
    fi
    echo "buildbox $BUILDBOX_VERSION unpacked in $SID; PostgreSQL: $(pg_bin)"
    ;;
  start)
    start_redis
    start_buildgrid "$HERE/buildgrid-cache.yml"
    ;;
  start-exec)
    workers=${2:-2}
    start_postgres
    start_redis
    start_buildgrid "$HERE/buildgrid-exec.yml"
    start_workers "$workers"
    ;;
  stop)
    for f in "$STATE"/pids/worker*.pid "$STATE/pids/casd.pid"; do stop_group "$f"; done
    if running; then
      pid=$(cat "$PIDFILE")
      stop_group "$PIDFILE"
      echo "BuildGrid (pid $pid) stopped"
    else
      echo "BuildGrid is not running"
      rm -f "$PIDFILE"
    fi
    if [[ -f $PG_DIR/data/postmaster.pid ]] && bin=$(pg_bin 2> /dev/null); then
      as_db_user "$bin/pg_ctl" -D "$PG_DIR/data" -m fast -w stop > /dev/null 2>&1 && echo "PostgreSQL stopped" || true
    fi
    if [[ -f $STATE/pids/redis.pid ]]; then stop_group "$STATE/pids/redis.pid"; echo "Redis stopped"; fi  # TERM: it syncs its file
    ;;
  status)
    if running && answers; then echo "BuildGrid (pid $(cat "$PIDFILE")) on grpc://$ADDRESS"; else echo "BuildGrid is not running"; exit 1; fi
    ;;
  *)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
