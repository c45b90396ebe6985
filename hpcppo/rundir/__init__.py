"""The run directory's protocol: every file the processes of a run exchange, and who writes and reads it.

A run is several processes that never call each other: the ranks of the trainer, the batch script, the
watchdog monitor beside them and the CLI on a login node. They meet in the run directory, and this package is
the only code that names its files (submitit's ``JobPaths`` plays the same part for a submitit job):

- :mod:`~hpcppo.rundir.paths` — the file names and :class:`RunPaths` (the path of each file of one run; the
  batch script gets the same names through :meth:`RunPaths.shell`);
- :mod:`~hpcppo.rundir.record` — run ids, creating a run directory, ``run.json`` and :class:`RunDir`;
- :mod:`~hpcppo.rundir.lock` — one writer per run;
- :mod:`~hpcppo.rundir.exitcodes` — the job's exit codes and its exit record;
- :mod:`~hpcppo.rundir.control` — the control inbox (requests, acknowledgements) and the pause files;
- :mod:`~hpcppo.rundir.events` — ``events.jsonl`` and its event sources;
- :mod:`~hpcppo.rundir.checkpoints` — ``checkpoints/step-<N>/`` and the commit marker (torch-free queries);
- :mod:`~hpcppo.rundir.metric_names` — the metric columns and the headline metrics;
- :mod:`~hpcppo.rundir.heartbeat` — the watchdog monitor's heartbeat, which ``hpcppo status`` reads.

``docs/architecture.md`` has the table: file, writer, readers, format. No torch, numpy or h5py here: the
login-node CLI imports this package.
"""

from hpcppo.rundir import checkpoints, control, events, exitcodes, heartbeat, lock, metric_names, paths
from hpcppo.rundir.paths import RunPaths
from hpcppo.rundir.record import (RunDir, RunIdTakenError, create_run_dir, list_runs, new_run_id, stray_entries,
                                  validate_run_id)

__all__ = ["RunDir", "RunIdTakenError", "RunPaths", "checkpoints", "control", "create_run_dir", "events",
           "exitcodes", "heartbeat", "list_runs", "lock", "metric_names", "new_run_id", "paths", "stray_entries",
           "validate_run_id"]
