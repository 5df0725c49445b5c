#!/usr/bin/env bash
# Regenerates requirements_lock.txt (with sha256 hashes) from requirements.in.
# pip reads its indexes from this machine's pip configuration; none is written into the lock.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q pip-tools
python3 -m piptools compile --generate-hashes --allow-unsafe --no-emit-index-url --no-emit-find-links \
  --no-header -o requirements_lock.txt requirements.in
