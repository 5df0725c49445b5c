#!/usr/bin/env bash
# Makes sure a Bazel >= 7 is on PATH. A no-op where one exists (system bazel or bazelisk);
# on Debian without one, installs Debian sid's bazel-bootstrap 7 (see README "Setup and tests").
# The Debian mirror is read from this machine's apt configuration, never hard-coded.
set -euo pipefail

have_bazel7() {
  local b v
  b=$(command -v bazel || command -v bazelisk || true)
  [ -n "$b" ] || return 1
  v=$("$b" --version 2>/dev/null | awk '{print $2}')  # "bazel 7.7.1" -> 7.7.1
  [ "${v%%.*}" -ge 7 ] 2>/dev/null
}

if have_bazel7; then
  echo "install_bazel: $( (command -v bazel || command -v bazelisk) ) is Bazel >= 7; nothing to do"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "install_bazel: no Bazel >= 7 and no apt-get: install bazelisk (it reads .bazelversion)" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

MIRROR=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME) $(COMPONENT)' 'Created-By: Packages' \
  | awk '$3=="main" && $2 !~ /security/ {print $1; exit}')
if [ -z "$MIRROR" ]; then
  $SUDO apt-get update -qq
  MIRROR=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME) $(COMPONENT)' 'Created-By: Packages' \
    | awk '$3=="main" && $2 !~ /security/ {print $1; exit}')
fi
[ -n "$MIRROR" ] || { echo "install_bazel: found no Debian mirror in apt's configuration" >&2; exit 1; }

echo "install_bazel: installing bazel-bootstrap 7 from Debian sid (low-priority pin)"
echo "deb [check-valid-until=no] $MIRROR sid main" | $SUDO tee /etc/apt/sources.list.d/sid-bazel.list >/dev/null
printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' | $SUDO tee /etc/apt/preferences.d/sid-bazel.pref >/dev/null
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# unzip: the CUDA wheels must be unpacked with their exec bits (Python's zipfile drops them).
$SUDO apt-get install -y -qq --no-install-recommends unzip
$SUDO apt-get install -y -qq -o Dpkg::Options::=--force-overwrite -t sid --no-install-recommends \
  bazel-bootstrap bazel-rules-pkg
have_bazel7 || { echo "install_bazel: bazel-bootstrap did not give a Bazel >= 7" >&2; exit 1; }
bazel --version
