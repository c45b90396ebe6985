"""Token budgets and packed rows in the real trainer, end to end on 2 ranks (issue 21, item 2): the actor's, the
critic's and the log-prob passes' micro-batches under a token budget, rows packed without padding, against the
fixed-size padded run of the same spec. The first step has the same rollout, so its losses and statistics agree to
float precision; the run goes on from there."""

from __future__ import annotations

import math

import pytest

from hpcppo import metrics as hmetrics

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

# actor/ppo_kl and the clip fractions are means of per-micro-batch means: they depend on the split (in verl too)
KEYS = ("actor/pg_loss", "actor/entropy", "critic/vf_loss", "critic/values_mean", "returns/mean",
        "rollout/logprob_gap", "actor/grad_norm", "critic/grad_norm")


@pytest.mark.slow
def test_token_budgets_and_packed_rows_give_the_padded_runs_first_step(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    common = ["trainer.total_steps=2", "checkpoint.save_every=0"]
    runs = {}
    for name, extra in (("padded", []), ("budget", ["actor.max_tokens_per_micro_batch=112",
                                                    "critic.max_tokens_per_micro_batch=168",
                                                    "rollout.max_tokens_per_micro_batch=56",
                                                    "model.remove_padding=true"])):
        run = compile_run(spec, tmp_path / name, common + extra)
        assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
        runs[name] = hmetrics.load(run).set_index("step")
    padded, budget = runs["padded"], runs["budget"]
    assert list(budget.index) == [1, 2]
    for key in KEYS:
        assert budget.loc[1, key] == pytest.approx(padded.loc[1, key], rel=1e-4, abs=1e-6), key
        assert math.isfinite(budget.loc[2, key]), key
