"""What verl users reach for, end to end on the arithmetic task (issue 23), one short run sharing the checks:
validation at n responses per prompt (verl's mean@n, best@k, worst@k, maj@k per data source)."""

from __future__ import annotations

import math

import pytest

from hpcppo import metrics as hmetrics
from hpcppo.rundir import metric_names

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec


@pytest.mark.slow
def test_validation_at_n(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "rollout.val_n=4", "rollout.val_temperature=1.0", "trainer.val_before_train=true", "trainer.test_freq=2",
        "trainer.total_steps=2", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    for stat in metric_names.validation_stats(4):
        col = f"val/score/hpcppo/arith/{stat}"
        assert df.loc[[0, 2], col].notna().all(), col  # before training and at step 2; maj@k from arith's pred
        assert math.isnan(df.loc[1, col]), col
    val = df.loc[[0, 2]]
    # mean@4 over prompts of 4 samples each is the plain mean; best >= mean >= worst; maj is one of the scores.
    assert (val["val/score/hpcppo/arith/mean@4"] - val["val/score/hpcppo/arith"]).abs().max() < 1e-9
    assert (val["val/score/hpcppo/arith/best@4/mean"] >= val["val/score/hpcppo/arith/mean@4"]).all()
    assert (val["val/score/hpcppo/arith/worst@4/mean"] <= val["val/score/hpcppo/arith/mean@4"]).all()
