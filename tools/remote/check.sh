#!/usr/bin/env bash
# The remote cache (or remote execution) end to end: starts the services (services.sh), builds
# //:wheel from two clean clones of this repository in two scratch folders, each with its own
# output base, prints the action counts of both builds, and stops everything it started, also on
# failure. Exits non-zero unless the second build executed no action (all remote cache hits) and
# the two wheels are identical byte for byte.
#
#   tools/remote/check.sh              --config=remote-cache: actions run here, results shared
#   tools/remote/check.sh --exec [N]   --config=remote: actions run on N buildbox workers (2)
#   tools/remote/check.sh --release-times [N ...]
#       the release build (--config=release, every arch) on N workers for each N (1 2 4): one
#       clean clone and output base per N, the remote action cache not consulted
#       (--noremote_accept_cached: every action runs on the workers); prints each wall time.
#
# MLLM_REMOTE_STATE / MLLM_REMOTE_PORT as for services.sh.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
SERVICES=$REPO/tools/remote/services.sh
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/mllm_remote_check.XXXXXX")
PORT=${MLLM_REMOTE_PORT:-50051}

cleanup() {
  for clone in "$SCRATCH"/clone*; do  # the Bazel servers of the clones, then their trees
    [[ -d $clone ]] && (cd "$clone" && bazel --output_user_root="$SCRATCH/out${clone##*clone}" shutdown) || true
  done
  [[ ${STARTED:-0} == 1 ]] && "$SERVICES" stop || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

MODE=cache
if [[ ${1:-} == --exec ]]; then MODE=exec; WORKERS=${2:-2}; fi
if [[ ${1:-} == --release-times ]]; then
  shift
  counts=("$@")
  [[ ${#counts[@]} -gt 0 ]] || counts=(1 2 4)
  for workers in "${counts[@]}"; do
    [[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "check.sh: --release-times takes worker counts, got '$workers'" >&2; exit 2; }
  done
  "$SERVICES" install-exec > /dev/null
  if "$SERVICES" status > /dev/null 2>&1; then echo "check.sh: stop the running services first" >&2; exit 1; fi
  MODE=release
fi
if [[ $MODE == exec ]]; then
  "$SERVICES" install-exec > /dev/null
  # Execution needs the workers and the scheduler, which a running cache-only server lacks.
  if "$SERVICES" status > /dev/null 2>&1; then echo "check.sh: stop the running services first" >&2; exit 1; fi
  STARTED=1
  "$SERVICES" start-exec "$WORKERS"
  FLAGS=(--config=remote "--remote_cache=grpc://127.0.0.1:$PORT" "--remote_executor=grpc://127.0.0.1:$PORT")
elif [[ $MODE == cache ]]; then
  "$SERVICES" install > /dev/null
  if "$SERVICES" status > /dev/null 2>&1; then STARTED=0; else "$SERVICES" start; STARTED=1; fi
  FLAGS=(--config=remote-cache "--remote_cache=grpc://127.0.0.1:$PORT")
fi

count() {  # $1: kind in Bazel's "INFO: N processes: ..." line $2 ("remote", "remote cache hit", ...)
  grep -oE "[0-9]+ $1([,.]|$)" <<< "$2" | grep -oE "^[0-9]+" || echo 0
}

build() {  # $1: clone number -> prints "<run remotely> <cache hits> <run here> <seconds>", wheel in out$1.whl
  local clone=$SCRATCH/clone$1
  git clone -q "$REPO" "$clone"
  (cd "$clone" && ./tools/setup.sh > "$SCRATCH/setup$1.log" 2>&1)  # the README's setup (offline Bazel)
  local start=$SECONDS
  (cd "$clone" && bazel --output_user_root="$SCRATCH/out$1" build "${FLAGS[@]}" //:wheel) > "$SCRATCH/build$1.log" 2>&1 || {
    tail -20 "$SCRATCH/build$1.log" >&2; echo "check.sh: build $1 failed" >&2; return 1; }
  cp "$clone"/bazel-bin/wheel/*.whl "$SCRATCH/out$1.whl"
  local line total internal hits remote
  line=$(grep -E "^INFO: [0-9]+ processes" "$SCRATCH/build$1.log" | tail -1)
  total=$(grep -oE "[0-9]+ processes" <<< "$line" | grep -oE "^[0-9]+")
  internal=$(count internal "$line")
  hits=$(count "remote cache hit" "$line")
  remote=$(count remote "$line")
  echo "$remote $hits $((total - internal - hits - remote)) $((SECONDS - start))"
}

if [[ $MODE == release ]]; then
  FLAGS=(--config=release --config=remote "--remote_cache=grpc://127.0.0.1:$PORT"
         "--remote_executor=grpc://127.0.0.1:$PORT" --noremote_accept_cached)
  n=0
  for workers in "${counts[@]}"; do
    n=$((n + 1))
    STARTED=1
    "$SERVICES" start-exec "$workers" > "$SCRATCH/services$n.log"
    result=$(build $n) || { echo "check.sh: FAIL: the release build on $workers workers failed"; exit 1; }
    read -r remote hits here secs <<< "$result"
    echo "release build, $workers worker(s): ${secs}s, $remote actions executed remotely, $hits remote cache hits, $here executed here"
    (cd "$SCRATCH/clone$n" && bazel --output_user_root="$SCRATCH/out$n" shutdown) || true
    rm -rf "$SCRATCH/clone$n" "$SCRATCH/out$n"
    "$SERVICES" stop > /dev/null
    STARTED=0
  done
  exit 0
fi

status=0
for n in 1 2; do
  result=$(build $n) || { echo "check.sh: FAIL: build $n failed"; exit 1; }
  read -r remote hits here secs <<< "$result"
  echo "build $n (clone $n, clean output base, $MODE): $remote actions executed remotely, $hits remote cache hits, $here executed here, ${secs}s"
done
if [[ $((remote + here)) != 0 ]]; then
  echo "check.sh: FAIL: the second build executed $((remote + here)) actions (expected all cache hits)"
  status=1
fi
if cmp -s "$SCRATCH/out1.whl" "$SCRATCH/out2.whl"; then
  echo "wheels identical: $(sha256sum < "$SCRATCH/out1.whl" | cut -c1-16)..."
else
  echo "check.sh: FAIL: the two wheels differ"; status=1
fi
exit $status
