#!/usr/bin/env bash
# The test command: installs what it needs, then runs the whole suite (pass pytest args through).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --browser
# Three test processes on two cores: many tests wait (on a tick, a lock's expiry, a subprocess)
# while another could run. Measured 2026-11-29, whole suite beside one CPU-bound process: 11:12
# and 12:20 with 3, 16:31 with 2 (README).
exec .venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=20 "$@"
