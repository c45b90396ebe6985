"""LoRA end to end (issue 23): 2 ranks train the actor's and the critic's adapters with the KL in the reward (the
reference is the actor with its adapters disabled: no copy is loaded), the watchdog restarts a NaN critic and rolls
back a KL spike from checkpoints, a run resumed from a checkpoint logs the same rows and ends with the same weights,
bit for bit, and ``hpcppo export`` writes the merged model, equal to peft's own merge of the checkpoint's adapters,
and the adapters alone in peft's format."""

from __future__ import annotations

import shutil

import pytest
import torch

from hpcppo import metrics as hmetrics
from hpcppo.rundir import events

from _harness import comparable, compile_run, launch_ranks, logs_of, wait_all, write_spec

# Faults the watchdog repairs with a model reloaded from a checkpoint: a NaN critic at step 2 (restarted from
# checkpoint 1), a KL spike at step 3 (rolled back to checkpoint 2; the retried step is clean).
LORA = ["actor.lora.rank=4", "actor.lora.alpha=8", "critic.lora.rank=2", "critic.lora.target_modules=['q_proj','v_proj']",
        "algorithm.use_kl_in_reward=true", "actor.lr=1e-3", "trainer.total_steps=3", "checkpoint.save_every=1",
        "debug.inject.nan_value_loss_at_step=2", "debug.inject.kl_spike_at_step=3"]


def _checkpoint(run, step: int) -> dict:
    """Actor (with its adapters) and critic weights of checkpoint ``step``, on one process."""
    import functools

    from hpcppo import models
    from hpcppo.config import load_resolved
    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.train.lora import with_lora

    exp = load_resolved(run / "resolved.toml").experiment
    actor = with_lora(functools.partial(models.build_actor, exp.model.path), exp.actor.lora)()
    critic = with_lora(functools.partial(models.build_critic, exp.model.path), exp.critic.lora,
                       inside=lambda m: m.backbone)()
    CheckpointManager(run / "checkpoints", keep_last=0, rank=0, world_size=1).load(
        step, models={"actor": actor, "critic": critic}, optimizers={}, restore_rng=False)
    return {"actor": actor, "critic": critic}


@pytest.mark.slow
def test_lora_actor_and_critic_train_resume_exactly_and_export_merged(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", LORA)
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    log = logs_of(run)
    assert "+ reference" not in log  # the reference is the actor without its adapters
    df = hmetrics.load(run).set_index("step")
    assert list(df.index) == [1, 2, 3]
    assert df["kl/actor_ref"].notna().all()
    for col in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        assert df.loc[[1, 3], col].notna().all(), col  # step 2 ran with the NaN critic
    assert df.loc[1, "kl/actor_ref"] == 0.0  # lora_B = 0: the first rollout's policy is the reference
    assert (df.loc[[2, 3], "kl/actor_ref"] != 0).all() and df.loc[3, "kl/actor_ref"] < 0.05  # step 3 retried clean
    assert df["critic/vf_loss"].isna().tolist() == [False, True, False]
    recorded = [(e["kind"], e["step"], e.get("checkpoint")) for e in events.read_events(run)]
    assert ("watchdog.restart_critic", 2, 1) in recorded and ("watchdog.rollback", 3, 2) in recorded, recorded

    # Resumed from step 1 in a new run: the same rows and the same final weights, bit for bit.
    again = compile_run(spec, tmp_path / "runs", LORA)
    shutil.copytree(run / "checkpoints" / "step-1", again / "checkpoints" / "step-1")
    assert wait_all(launch_ranks(again, 2, "a0")) == [0, 0], logs_of(again)
    assert "resumed from checkpoint step 1" in logs_of(again)
    straight, resumed = comparable(hmetrics.load(run)), comparable(hmetrics.load(again))
    assert list(resumed.index) == [2, 3]
    assert straight.loc[[2, 3]].equals(resumed), (straight.loc[[2, 3]], resumed)
    first, second = _checkpoint(run, 3), _checkpoint(again, 3)
    for role in ("actor", "critic"):
        a, b = first[role].state_dict(), second[role].state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role
    critic_lora = [k for k in first["critic"].state_dict() if ".lora_A." in k]
    assert critic_lora and all(".q_proj." in k or ".v_proj." in k for k in critic_lora)

    # Export: the merged actor under the base model's names, as peft's own Linear.merge computes it.
    from hpcppo.config import load_resolved
    from hpcppo.models.lora import lora_layers
    from hpcppo.train.export import export_actor
    from transformers import AutoModelForCausalLM

    export_actor(run, tmp_path / "exported")
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "exported").named_parameters())
    actor = first["actor"]
    for name, layer in lora_layers(actor).items():
        assert layer.lora_B["default"].weight.any(), name  # trained
        layer.merge()
    expected = {n.replace(".base_layer.", "."): p for n, p in actor.named_parameters() if ".lora_" not in n}
    assert expected.keys() == exported.keys()
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
    # ... and the adapters alone in peft's format: PeftModel loads them onto the base model, to the same merge.
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(load_resolved(run / "resolved.toml").experiment.model.path)
    reloaded = PeftModel.from_pretrained(base, tmp_path / "exported" / "lora_adapter").merge_and_unload()
    for name, tensor in reloaded.named_parameters():
        assert torch.equal(tensor, exported[name]), name
