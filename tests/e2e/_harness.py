"""Helpers of the end-to-end tests: write a spec, compile a run, launch the job entry point per rank."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hpcppo.launch import jobs

REPO = Path(__file__).resolve().parents[2]


def write_spec(path: Path, tiny: dict[str, Path], *, name: str = "e2e", extra: str = "") -> Path:
    path.write_text(textwrap.dedent(f"""\
        name = "{name}"
        seed = 7
        [model]
        path = "{tiny['model']}"
        dtype = "float32"
        [data]
        train_files = ["{tiny['train']}"]
        val_files = ["{tiny['val']}"]
        max_prompt_length = 48
        max_response_length = 8
        [rollout]
        n = 2
        [actor]
        lr = 1e-4
        ppo_mini_batch_size = 8
        ppo_micro_batch_size_per_gpu = 4
        [critic]
        lr = 1e-3
        [trainer]
        train_batch_size = 16
        total_steps = 6
        collective_timeout_s = 120
        [checkpoint]
        save_every = 3
        keep_last = 0
        [resources]
        time = "00:20:00"
        """) + textwrap.dedent(extra))
    return path


def compile_run(spec: Path, runs_root: Path, overrides=()) -> Path:
    return jobs.compile_run(spec, "local", list(overrides), runs_root=str(runs_root)).run.path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(run_dir: Path, world: int, attempt: str, *, log_name: str = "rank") -> list[subprocess.Popen]:
    """Start the job entry point once per rank with torchrun-style variables (what the launchers export)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), HPCPPO_ATTEMPT=attempt, OMP_NUM_THREADS="1")
        log = open(run_dir / "logs" / f"{log_name}-{attempt}-{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "hpcppo.train.main", str(run_dir)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float = 300) -> list[int]:
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes


def logs_of(run_dir: Path) -> str:
    return "\n".join(f"==> {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((run_dir / "logs").glob("*.log")))


# Columns that depend on wall time or on which attempt ran a step, not on the numbers trained.
VOLATILE = ("time", "attempt", "branch", "seq")


def comparable(df):
    """A metrics frame indexed by step without the columns that may differ between two exact runs."""
    keep = [c for c in df.columns if c not in VOLATILE and not c.startswith(("time/", "perf/"))]
    return df[keep].set_index("step").sort_index()


def final_weights(run_dir: Path, step: int) -> dict:
    """Actor and critic weights of checkpoint ``step`` of a run, loaded on one process."""
    from hpcppo.config import load_resolved
    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.models import build_actor, build_critic

    path = load_resolved(run_dir / "resolved.toml").experiment.model.path
    actor, critic = build_actor(path), build_critic(path)
    CheckpointManager(run_dir / "checkpoints", keep_last=0, rank=0, world_size=1).load(
        step, models={"actor": actor, "critic": critic}, optimizers={}, restore_rng=False)
    return ({f"actor.{k}": v for k, v in actor.state_dict().items()}
            | {f"critic.{k}": v for k, v in critic.state_dict().items()})


def wait_for_commit(run_dir: Path, step: int, procs: list[subprocess.Popen], timeout: float = 240) -> None:
    marker = run_dir / "checkpoints" / f"step-{step}" / "COMMITTED"
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a rank exited before the checkpoint:\n" + logs_of(run_dir))
        if time.monotonic() > deadline:
            raise AssertionError("no checkpoint in time:\n" + logs_of(run_dir))
        time.sleep(0.05)



def kill_at_commit(run_dir: Path, step: int, procs: list[subprocess.Popen]) -> None:
    """SIGKILL every rank as soon as checkpoint ``step`` is committed (a crash right after a save), and reap them."""
    wait_for_commit(run_dir, step, procs)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    wait_all(procs)


def rows_logged(run_dir: Path) -> int:
    """Rows of the run's metric log so far; 0 while no file exists yet or one is being created."""
    from hpcppo import metrics as hmetrics

    try:
        return len(hmetrics.load(run_dir)) if list((run_dir / "metrics").glob("*.h5")) else 0
    except Exception:  # a file being created: try again
        return 0
