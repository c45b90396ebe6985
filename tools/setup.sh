#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for hpcppo: apt packages, the venv (.venv) with a
# pinned CPU torch, and hpcppo itself in editable mode with the dev extra. Quick when done already.
#   tools/setup.sh            # packages + venv
#   HPCPPO_TORCH=2.13.0 ...   # torch pin for CPU machines (default 2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_PIN=${HPCPPO_TORCH:-2.13.0}
APT_PKGS=(shellcheck hdf5-tools)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing apt packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    # Debian's own python3 ships venv/ensurepip separately.
    echo "setup: installing python3 and python3-venv"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: hpcppo needs Python >= 3.11 ($PY is $("$PY" -V 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.hpcppo-installed
want="$(sha256sum pyproject.toml setup.py | sha256sum | cut -c1-16)-torch$TORCH_PIN"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing torch==$TORCH_PIN and hpcppo[dev] into .venv (log: .venv/setup.log)"
    if ! {
        .venv/bin/python -m pip install -q --upgrade pip &&
        .venv/bin/python -m pip install -q "torch==$TORCH_PIN" &&
        .venv/bin/python -m pip install -q -e ".[dev]" "torch==$TORCH_PIN"
    } >.venv/setup.log 2>&1; then
        cat .venv/setup.log
        echo "setup: pip failed (log above)" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
echo "setup: ready ($ROOT/.venv)"
