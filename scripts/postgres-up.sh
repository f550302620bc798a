#!/usr/bin/env bash
# The platform database tests run against a real PostgreSQL on 127.0.0.1:5432 (see ENVIRONMENT.md):
# start the machine's local cluster when it is installed but not answering. Without one the
# PostgreSQL tests skip, saying so; nothing here fails the build.
if ! command -v pg_isready > /dev/null; then
  echo "PostgreSQL client tools are not installed: the PostgreSQL tests will be skipped" >&2
  exit 0
fi
if pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "PostgreSQL is accepting connections on 127.0.0.1:5432"
  exit 0
fi
echo "PostgreSQL is not answering on 127.0.0.1:5432; starting the local cluster"
if [ -d /etc/postgresql ] && pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start \
  && pg_isready -q -t 30 -h 127.0.0.1 -p 5432; then
  echo "PostgreSQL started on 127.0.0.1:5432"
else
  echo "PostgreSQL could not be started: the PostgreSQL tests will be skipped" >&2
fi
