#!/usr/bin/env bash
# Install what the project needs, idempotently: a Python venv with requirements-dev.txt and the
# project itself, the pinned CDK CLI from npm, and (with --browser) Debian's Chromium for the
# browser test. Re-runs are quick: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
for arg in "$@"; do
  case "$arg" in
    --browser) want_browser=1 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.installed-$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "==> installing Python packages (requirements-dev.txt)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  .venv/bin/python -m pip install --quiet --no-deps -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi

if [ -f package-lock.json ] && command -v npm >/dev/null 2>&1; then
  if [ ! -x node_modules/.bin/cdk ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "==> installing the CDK CLI (npm ci)"
    npm ci --no-audit --no-fund --loglevel=error
  fi
fi

if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Chromium from Debian's packages (browser test)"
  SUDO=""
  [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
