#!/usr/bin/env bash
# The whole system on this machine: creates .venv and installs requirements-dev.txt when missing
# (scripts/bootstrap.sh), then runs `python -m coworker_local` with the arguments given, e.g.
#   scripts/run-local.sh --tasks 500 --api-port 8080
# See docs/local.md for every flag and environment variable.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m coworker_local "$@"
