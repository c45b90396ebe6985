"""Exit codes of the job entry point, shared by the trainer, the sbatch template and the watchdog.

The batch script turns ``REQUEUE`` into ``scontrol requeue`` and ``PAUSED`` into a clean stop.
"""

DONE = 0
FAILED = 1
# EX_TEMPFAIL: checkpointed on a preemption signal / time limit; requeue me.
REQUEUE = 75
# Stopped on request (pause rule, ``hpcppo pause``): do not requeue; ``hpcppo resume`` continues.
PAUSED = 76
