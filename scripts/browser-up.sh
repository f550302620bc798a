#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's chromium through chromium-driver (selenium): installed
# when missing and apt can (about a minute, once per machine).
exec bash "$(dirname "$0")/apt-ensure.sh" "the dashboard's browser tests" \
  "command -v chromium && command -v chromedriver" chromium chromium-driver
