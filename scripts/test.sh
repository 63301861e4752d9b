#!/usr/bin/env bash
# The test command: installs what it needs, then runs the whole suite (pass pytest args through).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --browser
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=20 "$@"
