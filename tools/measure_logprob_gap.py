"""Measure ``rollout/logprob_gap`` on a healthy run (docs/sync-guard.md's table): one CPU rank, GRPO, the guard off.

    python tools/measure_logprob_gap.py MODEL_DIR TRAIN_PARQUET ENGINE MODEL_DTYPE TRAINER_DTYPE [STEPS] [WORK_DIR]

e.g. ``... artifacts/tiny-arith/model artifacts/tiny-arith/data/train.parquet vllm bfloat16 float32 10`` (the vllm
engine with the .venv-vllm interpreter). Prints one JSON line: the engine/dtypes and the gap of each step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from hpcppo import metrics
from hpcppo.launch import jobs


def main(argv: list[str]) -> int:
    model, train, engine, model_dtype, trainer_dtype = argv[:5]
    steps = int(argv[5]) if len(argv) > 5 else 10
    work = Path(argv[6] if len(argv) > 6 else tempfile.mkdtemp(prefix="logprob-gap-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = work / f"{engine}-{model_dtype}-{trainer_dtype}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "gap-{engine}"
        seed = 1
        [model]
        path = "{Path(model).resolve()}"
        dtype = "{model_dtype}"
        [data]
        train_files = ["{Path(train).resolve()}"]
        max_prompt_length = 48
        max_response_length = 8
        [rollout]
        engine = "{engine}"
        n = 4
        logprob_gap_max = -1
        [actor]
        lr = 1e-4
        ppo_mini_batch_size = 16
        ppo_micro_batch_size_per_gpu = 16
        [actor.fsdp]
        param_dtype = "{trainer_dtype}"
        [algorithm]
        adv_estimator = "grpo"
        [trainer]
        train_batch_size = 32
        total_steps = {steps}
        [checkpoint]
        save_every = -1
        [resources]
        procs_per_node = 1
        """))
    run = jobs.compile_run(spec, "local", [], runs_root=str(work / "runs")).run.path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", HPCPPO_ATTEMPT="a0", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "hpcppo.train.main", str(run)], env=env, capture_output=True, text=True)
    if done.returncode:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return 1
    gaps = metrics.load(run)["rollout/logprob_gap"].tolist()
    print(json.dumps({"engine": engine, "engine_dtype": model_dtype, "trainer_dtype": trainer_dtype, "gaps": gaps}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
