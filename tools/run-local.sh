#!/usr/bin/env bash
# The README's first command: set up (idempotent), build the tiny offline model and data, and train
# examples/arith-tiny.toml on the embedded local default (submitit local executor, 2 CPU ranks), watching it live
# (hpcppo submit --follow: a progress bar with reward, KL and events; Ctrl-C detaches, the job goes on).
#   tools/run-local.sh [extra hpcppo submit args, e.g. -o trainer.total_steps=10]
#   tools/run-local.sh --vllm [...]   # the same with the colocated vLLM engine (vLLM's CPU backend, .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
engine=()
if [ "${1:-}" = "--vllm" ]; then
    shift
    tools/setup.sh --vllm
    venv=.venv-vllm
    engine=(-o rollout.engine=vllm)
else
    tools/setup.sh
fi
"$venv/bin/hpcppo" tools make-model --out artifacts/tiny-arith/model --data-out artifacts/tiny-arith/data
exec "$venv/bin/hpcppo" submit examples/arith-tiny.toml --site local --follow -q "${engine[@]}" "$@"
