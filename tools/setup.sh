#!/usr/bin/env bash
# One-time machine setup for building mllm-kernel (idempotent; README "Setup and tests").
#  1. Bazel >= 7 (a no-op where one exists; Debian sid's bazel-bootstrap otherwise).
#  2. The host tools repository rules call: unzip (CUDA wheels keep exec bits), python3 with pip.
#  3. On Debian's offline Bazel (its /etc/bazel/bazelrc overrides modules to /usr/share/bazel),
#     switch on tools/offline/ by writing the git-ignored .bazelrc.offline. Elsewhere nothing is
#     written and Bazel resolves modules from the registry. Force with MLLM_KERNEL_OFFLINE=0|1.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install_bazel.sh

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v unzip >/dev/null; then
  if command -v apt-get >/dev/null; then
    $SUDO apt-get install -y -qq --no-install-recommends unzip || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends unzip; }
  else
    echo "setup: please install unzip" >&2; exit 1
  fi
fi
python3 -m pip --version >/dev/null || { echo "setup: python3 needs pip" >&2; exit 1; }

offline="${MLLM_KERNEL_OFFLINE:-}"
if [ -z "$offline" ]; then
  offline=0
  grep -qs -- "--override_module=rules_python=/usr/share/bazel" /etc/bazel/bazelrc && offline=1
fi
if [ "$offline" = 1 ]; then
  sed "s|@STUBS@|$PWD/tools/offline/stubs|" tools/offline/offline.bazelrc.in > .bazelrc.offline
  echo "setup: offline module overrides on (.bazelrc.offline)"
else
  rm -f .bazelrc.offline
  echo "setup: modules resolve from the Bazel Central Registry"
fi
echo "setup: done"
