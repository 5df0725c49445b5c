#!/usr/bin/env bash
# The remote cache end to end: starts BuildGrid (services.sh), builds //:wheel with
# --config=remote-cache from two clean clones of this repository in two scratch folders, each
# with its own output base, prints the action counts of both builds, and stops everything it
# started, also on failure. Exits non-zero unless the second build executed no action (all remote
# cache hits) and the two wheels are identical byte for byte.
#
#   tools/remote/check.sh        (MLLM_REMOTE_STATE / MLLM_REMOTE_PORT as for services.sh)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
SERVICES=$REPO/tools/remote/services.sh
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/mllm_remote_check.XXXXXX")
PORT=${MLLM_REMOTE_PORT:-50051}

cleanup() {
  for n in 1 2; do  # the Bazel servers of the two clones, then their trees
    [[ -d $SCRATCH/clone$n ]] && (cd "$SCRATCH/clone$n" && bazel --output_user_root="$SCRATCH/out$n" shutdown) || true
  done
  [[ ${STARTED:-0} == 1 ]] && "$SERVICES" stop || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

"$SERVICES" install > /dev/null
if "$SERVICES" status > /dev/null 2>&1; then STARTED=0; else "$SERVICES" start; STARTED=1; fi

build() {  # $1: clone number -> prints "<executed> <cache hits> <seconds>", wheel in out$1.whl
  local clone=$SCRATCH/clone$1
  git clone -q "$REPO" "$clone"
  (cd "$clone" && ./tools/setup.sh > "$SCRATCH/setup$1.log" 2>&1)  # the README's setup (offline Bazel)
  local start=$SECONDS
  (cd "$clone" && bazel --output_user_root="$SCRATCH/out$1" build --config=remote-cache \
     --remote_cache="grpc://127.0.0.1:$PORT" //:wheel) > "$SCRATCH/build$1.log" 2>&1 || {
    tail -20 "$SCRATCH/build$1.log" >&2; echo "check.sh: build $1 failed" >&2; return 1; }
  cp "$clone"/bazel-bin/wheel/*.whl "$SCRATCH/out$1.whl"
  local line
  line=$(grep -E "^INFO: [0-9]+ processes" "$SCRATCH/build$1.log" | tail -1)
  local total internal hits
  total=$(grep -oE "[0-9]+ processes" <<< "$line" | grep -oE "^[0-9]+")
  internal=$(grep -oE "[0-9]+ internal" <<< "$line" | grep -oE "^[0-9]+" || echo 0)
  hits=$(grep -oE "[0-9]+ remote cache hit" <<< "$line" | grep -oE "^[0-9]+" || echo 0)
  executed=$((total - internal - hits))
  echo "$executed $hits $((SECONDS - start))"
}

read -r exec1 hits1 secs1 <<< "$(build 1)"
echo "build 1 (clone 1, clean output base): $exec1 actions executed locally, $hits1 remote cache hits, ${secs1}s"
read -r exec2 hits2 secs2 <<< "$(build 2)"
echo "build 2 (clone 2, clean output base): $exec2 actions executed locally, $hits2 remote cache hits, ${secs2}s"
status=0
if [[ $exec2 != 0 ]]; then echo "check.sh: FAIL: the second build executed $exec2 actions (expected all cache hits)"; status=1; fi
if cmp -s "$SCRATCH/out1.whl" "$SCRATCH/out2.whl"; then
  echo "wheels identical: $(sha256sum < "$SCRATCH/out1.whl" | cut -c1-16)..."
else
  echo "check.sh: FAIL: the two wheels differ"; status=1
fi
exit $status
