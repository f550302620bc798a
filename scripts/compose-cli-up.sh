#!/usr/bin/env bash
# `make test` validates docker-compose.yml with a compose implementation (tests/unit/flows/
# test_deploy_files.py): Debian's docker-compose is installed when none is present and apt can
# (seconds, once per machine; validating needs no Docker daemon).
exec bash "$(dirname "$0")/apt-ensure.sh" "the compose file's validation" \
  "command -v docker-compose || docker compose version" docker-compose
