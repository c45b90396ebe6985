#!/usr/bin/env bash
# The README's test command: set up (idempotent: apt packages, venv, pinned CPU torch), start the
# local Slurm dev cluster (2 emulated nodes + accounting), run the whole test suite except GPU tests.
#   tools/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/slurm-dev-cluster.sh start
exec .venv/bin/python -m pytest -m "not gpu" "$@"
