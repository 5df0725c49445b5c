#!/usr/bin/env bash
# A local Bazel remote cache: BuildGrid's CAS and action cache on 127.0.0.1.
#
#   tools/remote/services.sh install   # BuildGrid (pinned) into a venv of its own, from pip's indexes
#   tools/remote/services.sh start     # in the background; returns once the port answers
#   tools/remote/services.sh stop      # stops what start started (and nothing else)
#   tools/remote/services.sh status
#
# Everything lives under MLLM_REMOTE_STATE (default ~/.cache/mllm_kernel_remote): the venv, the
# server's configuration, its storage, log and pid file. MLLM_REMOTE_PORT: default 50051.
# Then: bazel build --config=remote-cache //:wheel   (.bazelrc; README "Remote cache").
set -euo pipefail
BUILDGRID_VERSION=0.4.4
STATE=${MLLM_REMOTE_STATE:-$HOME/.cache/mllm_kernel_remote}
PORT=${MLLM_REMOTE_PORT:-50051}
ADDRESS=127.0.0.1:$PORT
HERE=$(cd "$(dirname "$0")" && pwd)
PIDFILE=$STATE/buildgrid.pid

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

case "${1:-}" in
  install)
    mkdir -p "$STATE"
    [[ -x $STATE/venv/bin/python ]] || python3 -m venv "$STATE/venv"
    "$STATE/venv/bin/python" -m pip install -q --disable-pip-version-check "buildgrid==$BUILDGRID_VERSION"
    "$STATE/venv/bin/bgd" --help > /dev/null
    echo "BuildGrid $BUILDGRID_VERSION installed in $STATE/venv"
    ;;
  start)
    [[ -x $STATE/venv/bin/bgd ]] || { echo "services.sh: run '$0 install' first" >&2; exit 1; }
    if running; then echo "BuildGrid already running (pid $(cat "$PIDFILE")) on $ADDRESS"; exit 0; fi
    if answers; then echo "services.sh: something else listens on $ADDRESS (set MLLM_REMOTE_PORT)" >&2; exit 1; fi
    mkdir -p "$STATE/cas"
    sed -e "s|@ADDRESS@|$ADDRESS|" -e "s|@STATE@|$STATE|" "$HERE/buildgrid-cache.yml" > "$STATE/buildgrid.yml"
    setsid "$STATE/venv/bin/bgd" server start "$STATE/buildgrid.yml" > "$STATE/buildgrid.log" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    for _ in $(seq 1 60); do  # 30 s at most
      if answers; then echo "BuildGrid (pid $(cat "$PIDFILE")) serves the remote cache on grpc://$ADDRESS"; exit 0; fi
      running || break
      sleep 0.5
    done
    echo "services.sh: BuildGrid did not come up on $ADDRESS; its log ($STATE/buildgrid.log) ends with:" >&2
    tail -5 "$STATE/buildgrid.log" >&2
    "$0" stop > /dev/null
    exit 1
    ;;
  stop)
    if running; then
      pid=$(cat "$PIDFILE")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"  # its process group (setsid)
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      echo "BuildGrid (pid $pid) stopped"
    else
      echo "BuildGrid is not running"
    fi
    rm -f "$PIDFILE"
    ;;
  status)
    if running && answers; then echo "BuildGrid (pid $(cat "$PIDFILE")) on grpc://$ADDRESS"; else echo "BuildGrid is not running"; exit 1; fi
    ;;
  *)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
