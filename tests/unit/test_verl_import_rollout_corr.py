"""``import-verl`` of rollout-correction launches (scripts in the style of verl b178a3c's
examples/rollout_correction/, written with our own values): every key translated, nothing refused, and the spec
compiles with the settings verl would use."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.config import load_resolved
from hpcppo.verl import names as verl

INPUTS = Path(__file__).resolve().parent / "verl_inputs"
K = "algorithm.rollout_correction."


def _import_and_compile(tmp_path, name, capsys):
    out = tmp_path / f"{name}.toml"
    assert main(["import-verl", str(INPUTS / f"{name}.sh"), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "[unsupported]" not in err and "does not load" not in err, err
    runs = tmp_path / "runs"
    assert main(["compile", str(out), "--site", "a100-cluster", "--no-check-paths", "-q", "--runs-root",
                 str(runs)]) == 0, capsys.readouterr().err
    [run_dir] = list(runs.iterdir())
    return load_resolved(run_dir / "resolved.toml").experiment, err


@pytest.mark.parametrize("name, want", [
    ("rollout_corr_reinforce", dict(rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True,
                                    rollout_rs=None, rollout_rs_threshold=None, bypass_mode=True,
                                    loss_type="reinforce")),
    ("rollout_corr_multi_rs", dict(rollout_is="token", rollout_is_threshold=1.8, rollout_is_batch_normalize=False,
                                   rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_1.5,0.02",
                                   bypass_mode=True, loss_type="ppo_clip")),
    ("rollout_corr_decoupled", dict(rollout_is="token", rollout_is_threshold=2.5, rollout_rs="seq_mean_k3,seq_sum_k1",
                                    rollout_rs_threshold="0.005,4", bypass_mode=False)),
])
def test_rollout_correction_launches_import_and_compile(tmp_path, capsys, name, want):
    exp, err = _import_and_compile(tmp_path, name, capsys)
    rc = exp.algorithm.rollout_correction
    assert {k: getattr(rc, k) for k in want} == want
    if name == "rollout_corr_decoupled":
        assert exp.actor.policy_loss.loss_mode == "sapo" and exp.actor.policy_loss.tau_neg == 1.2
    else:
        assert "[ignored] actor_rollout_ref.rollout.calculate_log_probs=True" in err


def test_every_rollout_correction_key_of_verl_is_mapped_to_the_same_name():
    for key in ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                "rollout_rs_threshold", "bypass_mode", "loss_type"):
        entry = verl.lookup(K + key)
        assert entry is not None and entry.kind == "map" and entry.hpcppo == K + key, (key, entry)
