"""Experiment trackers beside the HDF5 log: TensorBoard event files and wandb in offline mode.

The HDF5 log stays the record (every reader of hpcppo reads it); a tracker is an optional copy for the tools people
already use, named in the spec as verl names them (``trainer.logger = ["console", "tensorboard", "wandb"]``; verl
b178a3c, ``verl/utils/tracking.py``, ``Tracking``). Each is written by rank 0 only, into the run directory
(:class:`hpcppo.rundir.RunPaths`: ``tensorboard/``, ``wandb/``), and its package is imported only when a tracker is
opened (``pip install 'hpcppo[trackers]'``), so the login-node commands never load it.

- ``tensorboard``: one event file per attempt, one scalar per metric and step, written with TensorBoard's own
  ``EventFileWriter`` and protos (no TensorFlow, no torch); ``tensorboard --logdir RUN/tensorboard`` shows it.
- ``wandb``: ``wandb.init(mode="offline")`` (compute nodes have no internet): ``RUN/wandb/offline-run-*``, uploaded
  later with ``wandb sync RUN/wandb/offline-run-*``; the run id is hpcppo's run id, so the attempts of a run resume
  the same wandb run, the project is ``trainer.project_name``.
- ``console``: hpcppo's per-step log line (``trainer.log_every``), always on; accepted for verl's sake.

:func:`write_tensorboard` writes a finished run's log as event files (``hpcppo metrics export --format tensorboard``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcppo.errors import ConfigError
from hpcppo.rundir.paths import RunPaths, tensorboard_suffix

__all__ = ["LOGGERS", "TRACKER_PACKAGES", "Trackers", "missing_packages", "open_trackers", "require",
           "write_tensorboard"]

#: The values of ``trainer.logger`` hpcppo honours (verl also has mlflow, swanlab, clearml, ...: refused).
LOGGERS = ("console", "tensorboard", "wandb")
#: The package each tracker writes with (the ``trackers`` extra of pyproject.toml).
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def missing_packages(loggers: Iterable[str]) -> list[str]:
    """The packages of ``loggers`` this interpreter cannot import (looked up with ``find_spec``: nothing imported)."""
    return [TRACKER_PACKAGES[n] for n in loggers if n in TRACKER_PACKAGES
            and importlib.util.find_spec(TRACKER_PACKAGES[n]) is None]


def require(loggers: Iterable[str]) -> None:
    missing = missing_packages(loggers)
    if missing:
        raise ConfigError(f"trainer.logger names {', '.join(missing)}, which is not installed in this Python "
                          f"(pip install 'hpcppo[trackers]')", key="trainer.logger")


class TensorBoardSink:
    """Scalars into ``logdir`` as TensorBoard event files (``events.out.tfevents.*``)."""

    tracker = "tensorboard"

    def __init__(self, logdir: str | os.PathLike[str], *, suffix: str = "") -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(str(logdir), filename_suffix=suffix)

    def log(self, step: int, values: Mapping[str, float], wall_time: float | None = None) -> None:
        scalars = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        if scalars:
            self._writer.add_event(self._event(wall_time=time.time() if wall_time is None else wall_time, step=step,
                                               summary=self._summary(value=scalars)))

    def start_at(self, step: int) -> None:
        """A new attempt logs from ``step`` on: whatever an earlier attempt's file holds at ``step`` and after was
        abandoned (the resume replays it). TensorBoard's own rule hides it: a ``SessionLog.START`` event at ``step``
        purges the events at ``step`` and after that came before it (``EventAccumulator._MaybePurgeOrphanedData``;
        torch's ``SummaryWriter(purge_step=...)`` writes the same two events). Without it the replayed steps are drawn
        twice, as a zigzag."""
        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(self._event(step=step, wall_time=time.time(), file_version="brain.Event:2"))
        self._writer.add_event(self._event(step=step, wall_time=time.time(),
                                           session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A wandb run in offline mode under the run directory."""

    tracker = "wandb"

    def __init__(self, wandb_dir: Path, *, project: str, run_id: str, group: str, config: Mapping[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        # wandb writes into <dir>/wandb: the run directory's wandb/ (RunPaths.wandb).
        settings = wandb.Settings(mode="offline", console="off", silent=True, save_code=False, x_disable_stats=True)
        self._run = wandb.init(dir=str(wandb_dir.parent), project=project, name=run_id, id=run_id, group=group,
                               resume="allow", config=dict(config), settings=settings)

    def log(self, step: int, values: Mapping[str, float], wall_time: float | None = None) -> None:
        del wall_time  # wandb stamps its own
        self._run.log(dict(values), step=step)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._run.finish()
        # finish() returns before wandb's service process has written the run file out; teardown waits for it
        # (the trainer's process is about to exit, and a reader may look at once).
        self._wandb.teardown()


class Trackers:
    """The trackers of one run, fed the same rows as the HDF5 log (rank 0). An empty set does nothing."""

    def __init__(self, sinks: Sequence[Any] = ()) -> None:
        self.sinks = list(sinks)
        self._last_step: int | None = None

    @property
    def names(self) -> list[str]:
        return [s.tracker for s in self.sinks]

    def log(self, step: int, values: Mapping[str, float]) -> None:
        # wandb refuses a step below one it has seen (a rollback re-logs steps): those rows stay in the HDF5 log only.
        for sink in self.sinks:
            if sink.tracker == "wandb" and self._last_step is not None and step < self._last_step:
                continue
            sink.log(step, values)
        self._last_step = step if self._last_step is None else max(self._last_step, step)

    def start_at(self, step: int) -> None:
        """This attempt logs from ``step`` on (a resume from checkpoint ``step - 1``): TensorBoard hides what an
        earlier attempt logged from there (:meth:`TensorBoardSink.start_at`); wandb keeps its own step rule."""
        for sink in self.sinks:
            if sink.tracker == "tensorboard":
                sink.start_at(step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_trackers(loggers: Iterable[str], run_dir: str | os.PathLike[str], *, project: str, group: str,
                  attempt: int, config: Mapping[str, Any]) -> Trackers:
    """Open the trackers ``loggers`` names for ``run_dir`` (``console`` needs none); ``ConfigError`` naming a missing
    package."""
    loggers = list(loggers)
    require(loggers)
    paths = RunPaths(run_dir)
    sinks: list[Any] = []
    if "tensorboard" in loggers:
        sinks.append(TensorBoardSink(paths.tensorboard, suffix=tensorboard_suffix(attempt)))
    if "wandb" in loggers:
        sinks.append(WandbSink(paths.wandb, project=project, run_id=paths.run_id, group=group, config=config))
    return Trackers(sinks)


def write_tensorboard(frame: Any, logdir: str | os.PathLike[str], *, suffix: str = ".export") -> dict[str, int]:
    """Write a metrics frame (:func:`hpcppo.metrics.load`: ``step``, ``time`` and the metric columns) as TensorBoard
    event files in ``logdir``: one scalar per finite value. Returns the numbers of steps and scalars written."""
    require(["tensorboard"])
    skip = {"step", "attempt", "branch", "seq", "time", "run", "current"}
    metrics = [c for c in frame.columns if c not in skip]
    sink = TensorBoardSink(logdir, suffix=suffix)
    scalars = 0
    try:
        for row in frame.to_dict("records"):
            values = {k: float(row[k]) for k in metrics if row[k] is not None and math.isfinite(float(row[k]))}
            sink.log(int(row["step"]), values, wall_time=float(row["time"]))
            scalars += len(values)
    finally:
        sink.close()
    return {"steps": int(len(frame)), "scalars": scalars}
