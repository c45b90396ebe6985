"""Rollout correction where it matters: vLLM computing in bfloat16 against the float32 trainer (vLLM's CPU backend, 2
gloo ranks). The engine's log-probs then differ from the actor's, the ``rollout_corr/*`` metrics measure the gap
and the IS weights are no longer 1; the run still learns the warm-started task. (With both in float32 the weights
are 1 and the losses those of the uncorrected run: tests/e2e/test_rollout_correction_run.py.)"""

from __future__ import annotations

import pytest
from _harness import REPO, logs_of

from hpcppo import metrics as hmetrics
from hpcppo.cli import main
from hpcppo.rundir import list_runs

K = "algorithm.rollout_correction."


@pytest.mark.slow
def test_bf16_engine_against_fp32_trainer_is_corrected_and_learns(tmp_path, warm_tiny, capsys):
    root, _ = warm_tiny
    overrides = [
        f"model.path={root / 'model'}", f"data.train_files=['{root / 'data' / 'train.parquet'}']",
        f"data.val_files=['{root / 'data' / 'val.parquet'}']", "checkpoint.save_every=0", "rollout.engine=vllm",
        "trainer.total_steps=8", "trainer.test_freq=0", "trainer.val_before_train=false",
        # the weights are bf16 values in both; the engine computes in bf16, the actor in float32
        "model.dtype=bfloat16", "actor.fsdp.param_dtype=float32", "critic.fsdp.param_dtype=float32",
        K + "rollout_is=token", K + "rollout_is_threshold=2.0", K + "rollout_rs=seq_max_k3",
        K + "rollout_rs_threshold=0.005",  # sequences with a token whose k3 = r - 1 - log r > 0.005 (r ~ 1 +- 0.1)
    ]
    code = main(["submit", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local", "--wait", "-q",
                 "--runs-root", str(tmp_path), *(x for o in overrides for x in ("-o", o))])
    (run,) = list_runs(tmp_path)
    assert code == 0, capsys.readouterr().out + logs_of(run.path)
    df = hmetrics.load(run.path).set_index("step")
    assert list(df.index) == list(range(1, 9))
    # a real mismatch, measured: the engine's log-probs are not the actor's
    assert (df["rollout/logprob_gap"] > 1e-4).all(), df["rollout/logprob_gap"].tolist()
    assert (df["rollout_corr/k3_kl"] > 0).all() and (df["rollout_corr/chi2_token"] != 0).all()
    assert (df["rollout_corr/rollout_is_eff_sample_size"] < 1).all()
    assert (df["rollout_corr/rollout_is_std"] > 1e-4).all(), df["rollout_corr/rollout_is_std"].tolist()
    assert ((df["rollout_corr/rollout_is_max"] - df["rollout_corr/rollout_is_min"]) > 1e-3).all()
    assert (df["rollout_corr/rollout_is_mean"] - 1).abs().max() < 0.05  # bf16 noise, not another policy
    rejected = df["rollout_corr/rollout_rs_masked_fraction"]
    assert (rejected > 0).any() and (rejected < 0.5).all(), rejected.tolist()  # some sequences, not the run
    start, end = df["reward/mean"].head(2).mean(), df["reward/mean"].tail(3).mean()
    assert end > start + 0.05, (start, end, df["reward/mean"].tolist())
