"""Tests against the real local Slurm dev cluster (``tools/slurm-dev-cluster.sh``): 2 emulated nodes.

Every test collected under ``tests/slurm`` gets the ``slurm`` marker. The session fixture
``slurm_cluster`` starts the cluster (quick when it is already up) and fails with the script's
output when it cannot.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from hpcppo.errors import SchedulerError
from hpcppo.launch import slurm

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "tools" / "slurm-dev-cluster.sh"
HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(REPO / "tests" / "e2e"))

from _harness import logs_of  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


def cluster_script(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``tools/slurm-dev-cluster.sh ARGS``; fail the test with its output when it fails."""
    proc = subprocess.run([str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{CLUSTER_SCRIPT.name} {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class DevCluster:
    """Handle on the running dev cluster: ``run("accounting-off")`` calls its control script."""

    script = CLUSTER_SCRIPT

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cluster_script(*args)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """The dev cluster, started when it is not usable yet (``start`` is idempotent but needs root)."""
    status = subprocess.run([str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True, timeout=60, check=False)
    if status.returncode != 0:
        if os.geteuid() != 0:
            pytest.fail(f"the Slurm dev cluster is not usable and only root can start it:\n{status.stdout}")
        cluster_script("start")
    yield DevCluster()


def wait_for_state(
    job_id: str,
    states: Collection[str],
    timeout: float = 60.0,
    *,
    submitted_after: dt.datetime | None = None,
    condition: Callable[[slurm.JobInfo], bool] | None = None,
    poll_s: float = 0.3,
) -> slurm.JobInfo:
    """Poll ``slurm.query_jobs`` until the job is in one of ``states`` (and ``condition`` holds).

    Fails the test with the last answer when the time is up, so a hang shows what Slurm said.
    """
    deadline = time.monotonic() + timeout
    after = {job_id: submitted_after} if submitted_after else None
    last: slurm.JobInfo | str = "no answer yet"
    while True:
        try:
            info = slurm.query_jobs([job_id], submitted_after=after)[job_id]
            last = info
            if info.state in states and (condition is None or condition(info)):
                return info
        except SchedulerError as exc:  # e.g. slurmctld restarting under another test session
            last = str(exc)
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} did not reach {sorted(states)} within {timeout:g} s; last: {last}")
        time.sleep(poll_s)


@pytest.fixture(name="wait_for_state")
def _wait_for_state_fixture() -> Callable[..., slurm.JobInfo]:
    return wait_for_state


def wait_until(predicate: Callable[[], object], timeout: float, what: str, run_dir: Path, *,
               poll_s: float = 0.5) -> None:
    """Poll ``predicate`` until it is true; fail the test with the run's logs when ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{logs_of(run_dir)}")
        time.sleep(poll_s)


@pytest.fixture(name="wait_until")
def _wait_until_fixture() -> Callable[..., None]:
    return wait_until


@pytest.fixture()
def submit_job(slurm_cluster: DevCluster, tmp_path: Path) -> Iterator[Callable[..., tuple[str, dt.datetime]]]:
    """``submit_job(script_text, *sbatch_args) -> (job_id, submitted_at)``; jobs are cancelled at teardown."""
    submitted: list[str] = []

    def submit(text: str, *args: str) -> tuple[str, dt.datetime]:
        path = tmp_path / f"job{len(submitted)}.sh"
        path.write_text(text)
        submitted_at = dt.datetime.now(dt.timezone.utc)
        job_id = slurm.submit_script(path, ["-t", "5", "-J", "hpcppo-test", *args], cwd=tmp_path)
        submitted.append(job_id)
        return job_id, submitted_at

    yield submit
    for job_id in submitted:
        try:
            slurm.cancel(job_id)
        except SchedulerError:
            pass  # the cluster went away: nothing left to clean


@pytest.fixture()
def launched(slurm_cluster) -> Iterator[list]:
    """Runs (``RunDir``) a test started; their jobs are cancelled at teardown if still alive."""
    from hpcppo.launch import jobs

    runs: list = []
    yield runs
    for run in runs:
        try:
            jobs.cancel_run(run)
        except Exception:  # noqa: BLE001 - best-effort cleanup; the test already reported
            pass
