#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's chromium through chromium-driver (selenium): install
# them when missing and apt can (about a minute, once per machine). Without them the browser tests
# skip and say so; nothing here fails the build.
if command -v chromium > /dev/null && command -v chromedriver > /dev/null; then
  echo "chromium and chromedriver are installed"
  exit 0
fi
if ! command -v apt-get > /dev/null; then
  echo "chromium is not installed and this machine has no apt-get: the browser tests will be skipped" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo -n"
fi
echo "installing chromium and chromium-driver for the dashboard's browser tests"
if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver; then
  echo "chromium installed"
else
  echo "chromium could not be installed: the browser tests will be skipped" >&2
fi
