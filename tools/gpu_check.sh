#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA GPU (the device tool's H200; see docs/gpu.md).
#
#   bash tools/gpu_check.sh --fetch-wheels   # HERE, on the CPU machine, once: wheels the GPU image lacks
#   bash tools/gpu_check.sh [--no-vllm]      # THERE: environment, pytest -m gpu, bench_algos on cuda, summary
#
# Everything it writes for the caller goes under $OUT (the device tool brings that folder back; elsewhere
# artifacts/gpu-check): gpu_check.log (all output), junit.xml, bench_algos.txt, scenario-logs.tar.gz.
# Prints one PASS/FAIL/SKIP/NOT RUN line per check at the end; exits 1 if anything failed, 2 on bad usage.
# Fits one 10-minute device call: pytest is stopped with SIGINT at its cap (junit.xml is still written; the tests
# it did not reach are listed NOT RUN), and every test's own limit is below that cap.
#
# The device image has CUDA torch in its python3 and no package registry, so no venv is made there: hpcppo runs
# from the checkout (PYTHONPATH), and the few pure-Python packages the image lacks are carried as wheels
# (artifacts/gpu-wheels, ignored by git; name it in the run's `carry`).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$REPO/artifacts/gpu-wheels"
# hpcppo's dependencies missing from the device image (its package list in .library/device/KINDS.md), and what
# cattrs needs newer than an image may hold. Versions are those of the CPU venv, so both sides run the same code.
CARRIED=(submitit cattrs tomli_w attrs typing_extensions)
DEVICE_PYTHON_VERSION="3.12"  # the image's python3 (KINDS.md); the wheels are pure Python either way
# Budgets (s). Worst case: ~30 environment + pytest cap + 20 after SIGINT + bench = 540, inside a 580 s device call.
PYTEST_TIMEOUT_S="${HPCPPO_GPU_PYTEST_TIMEOUT_S:-450}"  # all of pytest: SIGINT at this point
TEST_TIMEOUT_S="${HPCPPO_GPU_TEST_TIMEOUT_S:-240}"  # one test, fixtures included (pytest-timeout; children get less)
BENCH_TIMEOUT_S="${HPCPPO_GPU_BENCH_TIMEOUT_S:-40}"

usage() {
    sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

fetch_wheels() {
    local py="${HPCPPO_PY:-$REPO/.venv/bin/python}" name version
    local specs=()
    for name in "${CARRIED[@]}"; do
        if ! version="$("$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")"; then
            echo "gpu_check: $name is not installed for $py; run tools/setup.sh first (or set HPCPPO_PY)" >&2
            return 1
        fi
        specs+=("$name==$version")
    done
    rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp" || return 1
    if ! "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON_VERSION" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
            -d "$WHEELS.tmp" "${specs[@]}"; then
        echo "gpu_check: pip download failed for ${specs[*]}" >&2
        rm -rf "$WHEELS.tmp"
        return 1
    fi
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS" || return 1
    echo "gpu_check: wheels for the device run in ${WHEELS#"$REPO"/} (carry it):"
    ls -l "$WHEELS"
}

SUMMARY=()
FAILED=0

record() {  # STATUS NAME DETAIL
    SUMMARY+=("$(printf '%-8s %-44s %s' "$1" "$2" "${3:-}")")
    if [[ "$1" == FAIL ]]; then FAILED=1; fi
}

section() {
    printf '\n===== %s =====\n' "$1"
}

summarize_junit() {  # JUNIT_XML COLLECTED: one record per collected test; those junit lacks are NOT RUN
    local status name detail
    while IFS=$'\t' read -r status name detail; do
        [[ -n "$status" ]] && record "$status" "$name" "$detail"
    done < <("$PY" - "$1" "$2" <<'PYEOF'
import os
import sys
import xml.etree.ElementTree as ET

cases = {}
try:  # absent or cut short when pytest was killed rather than interrupted
    for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
        cases[(case.get("classname", ""), case.get("name", ""))] = case
except (OSError, ET.ParseError) as exc:
    print(f"FAIL\tjunit.xml\tunreadable: {exc}")
wanted = []  # node ids from --collect-only -q: tests/gpu/test_x.py::test_y[param]
for line in open(sys.argv[2], encoding="utf-8"):
    path, sep, name = line.strip().partition("::")
    if sep and path.endswith(".py"):
        wanted.append((path[:-3].replace("/", "."), name))
for key in wanted + [k for k in cases if k not in wanted]:
    label = key[0].split(".")[-1] + "::" + key[1]
    case = cases.get(key)
    if case is None:
        print(f"NOT RUN\t{label}\tnot finished: pytest was stopped at its cap")
        continue
    status, detail = "PASS", f"{float(case.get('time', 0)):.1f} s"
    for tag, verdict in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "SKIP")):
        node = case.find(tag)
        if node is not None:
            status = verdict
            detail = " ".join((node.get("message") or tag).split())[:160]
            break
    print(f"{status}\t{label}\t{detail}")
PYEOF
    )
}

run_checks() {
    local no_vllm="$1" out_dir="$2" tmp_root="$3" rc marker commit
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    cd "$REPO" || return 1
    commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "gpu_check: repo $REPO (commit $commit), python $PY, output $out_dir, $(date -u +%FT%TZ)"

    section "environment"
    if timeout 60 nvidia-smi; then record PASS "nvidia-smi"; else record FAIL "nvidia-smi" "exit $?"; fi
    if ! timeout 120 "$PY" - <<'PYEOF'
import sys

import torch

print(f"python {sys.version.split()[0]} ({sys.executable})")
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if (major, minor) < (2, 13):
    print(f"NOTE: torch {torch.__version__} is older than the project's torch>=2.13: results hold for this version")
PYEOF
    then
        record FAIL "torch + CUDA" "torch cannot use a GPU here: nothing else can run"
        return 0
    fi
    record PASS "torch + CUDA"

    section "dependencies"
    if [[ -d "$WHEELS" ]]; then
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$tmp_root/site" "$WHEELS"/*.whl; then
            export PYTHONPATH="$tmp_root/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
            echo "installed $(find "$WHEELS" -name '*.whl' | wc -l) carried wheels into $tmp_root/site"
        else
            record FAIL "carried wheels" "pip install from ${WHEELS#"$REPO"/} failed"
        fi
    else
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
        echo "no ${WHEELS#"$REPO"/}: using the image's packages only (run --fetch-wheels here first if imports fail)"
    fi
    if timeout 120 "$PY" - <<'PYEOF'
import importlib
import importlib.util

for name in ("hpcppo", "submitit", "cattrs", "tomli_w", "attrs", "transformers", "h5py", "pandas", "pytest",
             "pytest_timeout"):
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
import hpcppo.launch.jobs, hpcppo.train.trainer, hpcppo.rollout.vllm_engine  # noqa: E401,F401 - the code under test
print("vllm", "importable" if importlib.util.find_spec("vllm") else "NOT INSTALLED")
PYEOF
    then
        record PASS "imports (hpcppo and its dependencies)"
    else
        record FAIL "imports (hpcppo and its dependencies)" "see the log; carry artifacts/gpu-wheels (--fetch-wheels)"
        return 0
    fi
    if "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)'; then
        timeout 120 "$PY" -c 'import vllm; print("vllm", vllm.__version__)'
    elif [[ "$no_vllm" == 0 ]]; then
        echo "NOTE: vllm is not importable: the vllm-marked checks will FAIL (use --no-vllm to leave them out)"
    fi

    section "pytest -m gpu"
    local gpus marker="gpu" tests=(tests/gpu tests/unit/test_algos_devices.py)
    gpus="$(timeout 60 "$PY" -c 'import torch; print(torch.cuda.device_count())')" || gpus=0
    [[ "$no_vllm" == 1 ]] && marker+=" and not vllm"
    [[ "$gpus" -lt 2 ]] && marker+=" and not multi_gpu"
    # The per-test limit (pytest-timeout) and the children's limits (tests/gpu/_gpu_launch.budget) under the cap.
    export HPCPPO_GPU_TEST_TIMEOUT_S="$TEST_TIMEOUT_S"
    if ! timeout 120 "$PY" -m pytest -p no:cacheprovider -q --collect-only -m "$marker" "${tests[@]}" \
            > "$tmp_root/collected.txt"; then
        cat "$tmp_root/collected.txt"
        record FAIL "pytest --collect-only -m '$marker'" "see the log"
        return 0
    fi
    echo "$(grep -c '::' "$tmp_root/collected.txt") tests selected by -m '$marker' ($gpus GPU(s)); cap" \
        "$PYTEST_TIMEOUT_S s in all, $TEST_TIMEOUT_S s each"
    # No -x: a device run is scarce, so every check reports. SIGINT at the cap: pytest stops like on Ctrl-C and
    # still writes junit.xml; -k: KILL if it has not stopped 20 s later.
    timeout -s INT -k 20 "$PYTEST_TIMEOUT_S" "$PY" -m pytest -p no:cacheprovider -q -ra --tb=short -m "$marker" \
        --timeout "$TEST_TIMEOUT_S" --basetemp="$tmp_root/pytest" --junitxml="$out_dir/junit.xml" "${tests[@]}"
    rc=$?
    summarize_junit "$out_dir/junit.xml" "$tmp_root/collected.txt"
    case "$rc" in
        0) record PASS "pytest -m '$marker'" ;;
        124|137) record FAIL "pytest -m '$marker'" "stopped at the $PYTEST_TIMEOUT_S s cap" ;;
        5) record FAIL "pytest -m '$marker'" "no test was collected" ;;
        *) record FAIL "pytest -m '$marker'" "exit $rc" ;;
    esac
    if [[ "$no_vllm" == 1 ]]; then
        record "NOT RUN" "vllm-marked checks" "--no-vllm"
    fi
    if [[ "$gpus" -lt 2 ]]; then
        record "NOT RUN" "multi_gpu-marked checks" "$gpus GPU(s) here; they need 2"
    fi
    if [[ -d "$tmp_root/pytest" ]]; then
        (cd "$tmp_root/pytest" && find . \( -name '*.log' -o -name '*-probe.json' \) -print0 |
            tar -czf "$out_dir/scenario-logs.tar.gz" --null -T -)
    fi

    section "tools/bench_algos.py --device cuda"
    timeout -k 10 "$BENCH_TIMEOUT_S" "$PY" tools/bench_algos.py --device cuda --batch 4096 --length 1024 \
        > "$out_dir/bench_algos.txt" 2>&1
    rc=$?
    cat "$out_dir/bench_algos.txt"
    if [[ "$rc" == 0 ]]; then
        record PASS "bench_algos --device cuda" "figures in bench_algos.txt"
    else
        record FAIL "bench_algos --device cuda" "exit $rc"
    fi
}

report() {  # run the checks, then print the verdicts; returns 1 if any check failed
    local started=$SECONDS
    run_checks "$@"
    section "summary ($((SECONDS - started)) s)"
    printf '%s\n' "${SUMMARY[@]}"
    if [[ "$FAILED" == 0 ]]; then echo "gpu_check: ALL PASSED"; else echo "gpu_check: FAILED"; fi
    return "$FAILED"
}

main() {
    local no_vllm=0 fetch=0 arg
    for arg in "$@"; do
        case "$arg" in
            --no-vllm) no_vllm=1 ;;
            --fetch-wheels) fetch=1 ;;
            -h|--help) usage; return 0 ;;
            *) echo "gpu_check: unknown argument '$arg'" >&2; usage >&2; return 2 ;;
        esac
    done
    if [[ "$fetch" == 1 ]]; then
        fetch_wheels
        return
    fi
    PY="${PYTHON:-python3}"
    if ! [[ "$TEST_TIMEOUT_S" =~ ^[0-9]+$ && "$PYTEST_TIMEOUT_S" =~ ^[0-9]+$ ]] \
            || (( TEST_TIMEOUT_S >= PYTEST_TIMEOUT_S )); then
        echo "gpu_check: the per-test limit ($TEST_TIMEOUT_S s) must be a whole number below the pytest cap" \
             "($PYTEST_TIMEOUT_S s)" >&2
        return 2
    fi
    local out_dir="${OUT:-$REPO/artifacts/gpu-check}" tmp_root="${TMPDIR:-/tmp}/hpcppo-gpu-check"
    mkdir -p "$out_dir" || return 1
    rm -rf "$tmp_root" && mkdir -p "$tmp_root" || return 1
    # report runs in the pipeline's subshell: its exit status (not its variables) comes back
    report "$no_vllm" "$out_dir" "$tmp_root" 2>&1 | tee "$out_dir/gpu_check.log"
    return "${PIPESTATUS[0]}"
}

main "$@"
