#!/usr/bin/env bash
# Optional peer for tools/bench_peers.py: Hugging Face TRL 1.12.0 (the last release with PPOTrainer; it was
# removed in 1.13) in its own venv, .venv-trl, so that hpcppo's .venv never sees TRL's dependency pins.
#   tools/peers/setup_trl.sh        # idempotent; quick when done already
# torch is pinned to the same version as .venv (2.13.0 unless HPCPPO_TORCH says otherwise): an unpinned
# `pip install trl` would pull the newest torch, on Linux a multi-GB CUDA build. transformers is pinned to the
# version installed in .venv so both sides run the same model code.
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH_PIN=${HPCPPO_TORCH:-2.13.0}
TRL_PIN=1.12.0
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup_trl: run tools/setup.sh first (.venv is missing)" >&2
    exit 1
fi
TF_PIN=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("transformers"))')
want="trl$TRL_PIN-torch$TORCH_PIN-transformers$TF_PIN"
stamp=.venv-trl/.hpcppo-peer-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "setup_trl: ready (.venv-trl: $want)"
    exit 0
fi
[ -x .venv-trl/bin/python ] || "$PY" -m venv .venv-trl
echo "setup_trl: installing torch==$TORCH_PIN trl==$TRL_PIN transformers==$TF_PIN into .venv-trl (log: .venv-trl/setup.log)"
if ! {
    .venv-trl/bin/python -m pip install -q "torch==$TORCH_PIN" &&
    .venv-trl/bin/python -m pip install -q "trl==$TRL_PIN" "transformers==$TF_PIN" "torch==$TORCH_PIN"
} >.venv-trl/setup.log 2>&1; then
    cat .venv-trl/setup.log
    echo "setup_trl: pip failed (log above)" >&2
    exit 1
fi
echo "$want" > "$stamp"
echo "setup_trl: ready (.venv-trl: $want)"
