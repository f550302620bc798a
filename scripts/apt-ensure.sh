#!/usr/bin/env bash
# Installs Debian packages a part of the suite needs when its check fails and apt can; never fails the
# build (without them, the tests that need them skip and say so).
#
#   scripts/apt-ensure.sh WHAT CHECK PACKAGE...
#
# WHAT says what they are for; CHECK is a shell command that succeeds when they are already there.
what=${1:?usage: apt-ensure.sh WHAT CHECK PACKAGE...}
check=${2:?usage: apt-ensure.sh WHAT CHECK PACKAGE...}
shift 2
[ $# -gt 0 ] || { echo "usage: apt-ensure.sh WHAT CHECK PACKAGE..." >&2; exit 2; }
if bash -c "$check" > /dev/null 2>&1; then
  echo "$* installed ($what)"
  exit 0
fi
if ! command -v apt-get > /dev/null; then
  echo "$* not installed and this machine has no apt-get: $what will be skipped" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo -n"
fi
echo "installing $* for $what"
if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"; then
  echo "$* installed"
else
  echo "$* could not be installed: $what will be skipped" >&2
fi
