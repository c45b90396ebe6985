#!/usr/bin/env bash
# The README's test command: set up (idempotent: apt packages, the venvs, pinned CPU torch), start the local Slurm
# dev cluster (2 emulated nodes + accounting), run the whole test suite except GPU tests, then the vLLM tier
# (tests/vllm_tier) in .venv-vllm, where vLLM's CPU backend is installed.
#   tools/test.sh [pytest args]         # both runs get the args
#   HPCPPO_VLLM_TIER=0 tools/test.sh    # without the vLLM tier (no .venv-vllm set-up)
set -euo pipefail
cd "$(dirname "$0")/.."
tier=${HPCPPO_VLLM_TIER:-1}
if [ "$tier" = 1 ]; then
    tools/setup.sh --vllm
else
    tools/setup.sh
fi
tools/slurm-dev-cluster.sh start
status=0
# Types ([tool.mypy] in pyproject.toml: strict on config, launch, rundir, algos, verl, agent, engines, rule_actions and rollout_corr; no errors anywhere in hpcppo/),
# before the tests: quick (~45 s). HPCPPO_MYPY=0 skips it.
if [ "${HPCPPO_MYPY:-1}" = 1 ]; then
    echo "test.sh: mypy"
    .venv/bin/python -m mypy || status=$?
fi
# "manual" tests are outside CI by design (minutes each on 2 cores); run them by hand.
.venv/bin/python -m pytest -m "not gpu and not vllm and not manual" "$@" || status=$?
if [ "$tier" = 1 ]; then
    echo "test.sh: the vLLM tier (tests/vllm_tier) in .venv-vllm"
    start=$SECONDS
    tier_status=0
    .venv-vllm/bin/python -m pytest -m "vllm and not manual" tests/vllm_tier "$@" || tier_status=$?
    echo "test.sh: the vLLM tier took $((SECONDS - start)) s (exit $tier_status)"
    [ "$tier_status" -eq 0 ] || status=$tier_status
fi
exit "$status"
