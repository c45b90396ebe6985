"""resolve(site, experiment): layout, batch arithmetic and every ResolveError with its suggestion."""

from __future__ import annotations

import attrs
import pytest

from hpcppo.config import (ActorSection, AlgorithmSection, CheckpointSection, CriticSection, DataSection, Experiment,
                           ModelSection, ReferenceSection, ResourcesSection, RolloutSection, Site, TrainerSection,
                           load_site, resolve)
from hpcppo.config.site import LocalSection, SlurmSection
from hpcppo.errors import ResolveError


def exp(**sections) -> Experiment:
    base = dict(name="t", model=ModelSection(path="/m"), data=DataSection(train_files=["/d.parquet"]))
    base.update(sections)
    return Experiment(**base)


def gpu_site(gpus: int = 8, max_nodes: int = 4, max_time: str = "24:00:00", **slurm) -> Site:
    return Site(name="g", scheduler="slurm",
                slurm=SlurmSection(gpus_per_node=gpus, max_nodes=max_nodes, max_time=max_time, **slurm))


LOCAL = Site(name="l", scheduler="local", local=LocalSection(procs_per_node=2))
CPU_SLURM = Site(name="c", scheduler="slurm", slurm=SlurmSection(max_nodes=2, max_time="02:00:00"))


def batches(train=8, mini=8, micro=2, n=1, **actor) -> dict:
    return dict(trainer=TrainerSection(train_batch_size=train),
                actor=ActorSection(ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=micro, **actor),
                rollout=RolloutSection(n=n))


def resolve_error(site: Site, e: Experiment) -> str:
    with pytest.raises(ResolveError) as info:
        resolve(site, e)
    assert info.value.exit_code == 4
    return str(info.value)


def test_local_cpu_plan():
    plan = resolve(LOCAL, exp(**batches(train=32, mini=16, micro=8, n=4)))
    assert (plan.nodes, plan.ranks_per_node, plan.world_size, plan.device, plan.backend) == (1, 2, 2, "cpu", "gloo")
    assert (plan.samples_per_step, plan.prompts_per_rank, plan.samples_per_rank) == (128, 16, 64)
    assert (plan.actor_mini_batch_samples, plan.actor_mini_batch_per_rank, plan.grad_accum_steps_actor,
            plan.mini_batches_per_epoch_actor) == (64, 32, 4, 2)
    # critic: 0 = actor's values
    assert (plan.needs_critic, plan.critic_mini_batch_samples, plan.critic_micro_batch_per_rank,
            plan.grad_accum_steps_critic, plan.critic_ppo_epochs) == (True, 64, 8, 4, 1)
    assert (plan.mesh_shape, plan.mesh_dim_names, plan.hsdp) == ([2], ["shard"], False)
    assert (plan.signal_lead_s, plan.time_limit_s, plan.time_limit) == (0, 3600, "01:00:00")
    assert plan.needs_reference is False and plan.total_steps == 0


def test_resources_procs_per_node_overrides_the_local_site():
    e = exp(**batches(), resources=ResourcesSection(procs_per_node=4))
    assert resolve(LOCAL, e).world_size == 4


def test_gpu_plan_with_hsdp_and_tensor_parallel():
    e = exp(trainer=TrainerSection(train_batch_size=1024), resources=ResourcesSection(nodes=2),
            rollout=RolloutSection(n=5, engine="vllm", tensor_parallel_size=2),
            algorithm=AlgorithmSection(adv_estimator="grpo"), actor=ActorSection(
                ppo_mini_batch_size=256, ppo_micro_batch_size_per_gpu=16, use_kl_loss=True))
    plan = resolve(gpu_site(), e)
    assert (plan.world_size, plan.device, plan.backend, plan.gpus_per_node) == (16, "cuda", "nccl", 8)
    assert (plan.dp_size, plan.train_dp_size, plan.prompts_per_rank) == (8, 16, 128)
    assert (plan.mesh_shape, plan.mesh_dim_names) == ([2, 8], ["replicate", "shard"])
    assert (plan.actor_mini_batch_per_rank, plan.grad_accum_steps_actor) == (80, 5)
    assert (plan.needs_critic, plan.needs_reference, plan.kl_loss) == (False, True, True)
    assert plan.signal_lead_s == 300


def test_hsdp_modes():
    e = exp(**batches(train=16, mini=16, micro=1))
    assert resolve(gpu_site(), attrs.evolve(e, resources=ResourcesSection(hsdp="on"))).mesh_shape == [1, 8]
    assert resolve(gpu_site(), attrs.evolve(e, resources=ResourcesSection(nodes=2, hsdp="off"))).mesh_shape == [16]


def test_fewer_gpus_than_the_site_has():
    plan = resolve(gpu_site(), exp(**batches(train=8, mini=8, micro=1), resources=ResourcesSection(gpus_per_node=4)))
    assert (plan.ranks_per_node, plan.gpus_per_node, plan.world_size) == (4, 4, 4)


def test_cpu_slurm_site_ranks_per_node_defaults_to_one():
    e = exp(**batches(), resources=ResourcesSection(nodes=2))
    plan = resolve(CPU_SLURM, e)
    assert (plan.nodes, plan.ranks_per_node, plan.world_size, plan.hsdp, plan.mesh_shape) == (2, 1, 2, True, [2, 1])


def test_mini_batch_not_dividing_the_train_batch():
    msg = resolve_error(LOCAL, exp(**batches(train=12, mini=5, micro=1)))
    assert msg == ("trainer.train_batch_size=12 is not divisible by actor.ppo_mini_batch_size=5 (prompts); "
                   "valid actor mini-batch sizes: 2, 4, 6, 12")


def test_train_batch_not_dividing_over_data_parallel_groups():
    msg = resolve_error(LOCAL, exp(**batches(train=9, mini=9, micro=1), resources=ResourcesSection(procs_per_node=4)))
    assert msg == ("trainer.train_batch_size=9 prompts cannot be split over 4 rollout data-parallel groups "
                   "(world size 4 / rollout.tensor_parallel_size 1); use a multiple of 4, e.g. 8 or 12")


def test_micro_batch_suggestions_match_the_brief_example():
    msg = resolve_error(LOCAL, exp(**batches(train=96, mini=96, micro=5, n=4)))
    assert msg == ("actor.ppo_mini_batch_size=96 x rollout.n=4 = 384 samples is not divisible by data-parallel size "
                   "2 x actor.ppo_micro_batch_size_per_gpu=5 = 10; valid micro-batch sizes: 1, 2, 3, 4, 6, 8, 12, 16, "
                   "24, 32, 48, 64, ...")


def test_mini_batch_samples_not_dividing_the_world():
    e = exp(**batches(train=6, mini=3, micro=1), resources=ResourcesSection(procs_per_node=2))
    msg = resolve_error(LOCAL, e)
    assert msg == ("actor.ppo_mini_batch_size=3 x rollout.n=1 = 3 samples is not divisible by data-parallel size 2; "
                   "valid actor mini-batch sizes: 2, 6")


def test_critic_batches_resolve_from_zero_and_are_checked():
    e = exp(**batches(train=8, mini=8, micro=2), critic=CriticSection(ppo_micro_batch_size_per_gpu=3))
    msg = resolve_error(LOCAL, e)
    assert msg == ("critic.ppo_mini_batch_size=0 (= the actor's 8) x rollout.n=1 = 8 samples is not divisible by "
                   "data-parallel size 2 x critic.ppo_micro_batch_size_per_gpu=3 = 6; valid micro-batch sizes: 1, 2, 4")
    ok = resolve(LOCAL, exp(**batches(train=8, mini=4, micro=2), critic=CriticSection(ppo_mini_batch_size=8,
                                                                                      ppo_epochs=2)))
    assert (ok.critic_mini_batch_samples, ok.mini_batches_per_epoch_critic, ok.critic_ppo_epochs) == (8, 1, 2)
    assert ok.mini_batches_per_epoch_actor == 2
    # No critic with GRPO: its batch settings are not checked at all.
    grpo = resolve(LOCAL, attrs.evolve(e, algorithm=AlgorithmSection(adv_estimator="grpo"),
                                       rollout=RolloutSection(n=2)))
    assert grpo.needs_critic is False and grpo.critic_micro_batch_per_rank == 0


def test_more_gpus_than_the_site_has():
    msg = resolve_error(gpu_site(8), exp(**batches(), resources=ResourcesSection(gpus_per_node=16)))
    assert msg == ("resources.gpus_per_node=16: more GPUs per node than site 'g' has (8); use 0 (all) or a value up "
                   "to 8")
    msg = resolve_error(CPU_SLURM, exp(**batches(), resources=ResourcesSection(gpus_per_node=1)))
    assert msg.startswith("resources.gpus_per_node=1: more GPUs per node than site 'c' has (0)")


def test_time_over_the_site_maximum():
    msg = resolve_error(CPU_SLURM, exp(**batches(), resources=ResourcesSection(time="03:00:00")))
    assert msg.startswith("resources.time='03:00:00' is longer than site 'c' allows (max_time='02:00:00'); use at most "
                          "02:00:00")


def test_time_shorter_than_the_signal_lead():
    msg = resolve_error(CPU_SLURM, exp(**batches(), resources=ResourcesSection(time="00:04:00")))
    assert "slurm.signal_lead_s=300" in msg
    no_ckpt = exp(**batches(), resources=ResourcesSection(time="00:04:00"),
                  checkpoint=CheckpointSection(save_on_preempt=False))
    assert resolve(CPU_SLURM, no_ckpt).time_limit_s == 240


def test_too_many_nodes():
    msg = resolve_error(CPU_SLURM, exp(**batches(), resources=ResourcesSection(nodes=3)))
    assert msg == "resources.nodes=3 is more than site 'c' allows (slurm.max_nodes=2); use at most 2"
    msg = resolve_error(LOCAL, exp(**batches(), resources=ResourcesSection(nodes=2)))
    assert "runs locally on one machine; use nodes = 1" in msg


def test_rollout_checks():
    # vLLM's CPU backend has no sleep mode: said at compile (tensor parallelism it can do)
    assert resolve_error(LOCAL, exp(**{**batches(), "rollout": RolloutSection(engine="vllm")})) == (
        "rollout.free_cache_engine=true: vLLM's CPU backend has no sleep mode (levels 1 and 2 are both refused), and "
        "site 'l' computes on the CPU; set rollout.free_cache_engine = false (the CPU sites' default)")
    resolve(LOCAL, exp(**{**batches(), "rollout": RolloutSection(engine="vllm", free_cache_engine=False)}))
    resolve(LOCAL, exp(**{**batches(), "rollout": RolloutSection(engine="vllm", free_cache_engine=False,
                                                                 tensor_parallel_size=2)}))
    assert "needs rollout.engine='vllm'" in resolve_error(gpu_site(), exp(**{**batches(train=16, mini=16, micro=1),
                                                                          "rollout": RolloutSection(tensor_parallel_size=2)}))
    msg = resolve_error(gpu_site(6), exp(**{**batches(train=12, mini=12, micro=1),
                                          "rollout": RolloutSection(engine="vllm", tensor_parallel_size=4)}))
    assert msg == ("rollout.tensor_parallel_size=4 does not divide the ranks per node (6); valid values: 1, 2, 3, 6")
    for est in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        msg = resolve_error(LOCAL, exp(**batches(), algorithm=AlgorithmSection(adv_estimator=est)))
        assert msg.startswith(f"algorithm.adv_estimator={est!r} compares responses to the same prompt and needs "
                              f"rollout.n >= 2 (got 1)")


def test_reference_rules():
    kl_reward = AlgorithmSection(use_kl_in_reward=True)
    assert resolve(LOCAL, exp(**batches(), algorithm=kl_reward)).needs_reference is True
    assert resolve(LOCAL, exp(**batches(), reference=ReferenceSection(enable="on"))).needs_reference is True
    assert resolve(LOCAL, exp(**batches())).needs_reference is False
    msg = resolve_error(LOCAL, exp(**batches(), algorithm=kl_reward, reference=ReferenceSection(enable="off")))
    assert msg.startswith("reference.enable='off' but algorithm.use_kl_in_reward = true needs the reference policy")


def test_validation_and_warmup_checks():
    msg = resolve_error(LOCAL, exp(**{**batches(), "trainer": TrainerSection(train_batch_size=8, test_freq=5)}))
    assert msg.startswith("trainer.test_freq asks for validation but data.val_files is empty")
    e = exp(**{**batches(), "trainer": TrainerSection(train_batch_size=8, total_steps=5)},
            critic=CriticSection(warmup_updates=5))
    assert "the actor would never be updated" in resolve_error(LOCAL, e)


def test_dtypes_and_clip_ratios_resolve():
    e = exp(**batches(clip_ratio=0.2, clip_ratio_high=0.28), model=ModelSection(path="/m", dtype="bfloat16"))
    plan = resolve(LOCAL, e)
    assert (plan.clip_ratio_low, plan.clip_ratio_high) == (0.2, 0.28)
    assert (plan.actor_param_dtype, plan.critic_param_dtype) == ("bfloat16", "bfloat16")


def test_shipped_dev_cluster_plan():
    plan = resolve(load_site("local-slurm"), exp(**batches(), resources=ResourcesSection(nodes=2, time="00:30:00")))
    assert (plan.scheduler, plan.nodes, plan.ranks_per_node, plan.device, plan.signal_lead_s) == ("slurm", 2, 1, "cpu", 60)


def test_deterministic_refuses_float_cumsum_on_cuda():
    """torch raises on a floating-point cumsum of a CUDA tensor under use_deterministic_algorithms: ReMax's returns
    and the hf engine's nucleus filter are refused on GPU sites, allowed on CPU sites and without the flag."""
    on, off = TrainerSection(train_batch_size=16, deterministic=True), TrainerSection(train_batch_size=16)
    b = batches(train=16, mini=16, micro=1)
    remax = AlgorithmSection(adv_estimator="remax")
    msg = resolve_error(gpu_site(), exp(**{**b, "trainer": on}, algorithm=remax))
    assert msg.startswith("algorithm.adv_estimator='remax' sums its returns with a floating-point cumsum, which torch "
                          "refuses on a CUDA tensor under trainer.deterministic = true")
    assert msg.endswith("set trainer.deterministic = false or choose another estimator")
    for rollout, key in ((RolloutSection(top_p=0.9), "rollout.top_p=0.9"),
                         (RolloutSection(val_temperature=0.7, val_top_p=0.95), "rollout.val_top_p=0.95")):
        msg = resolve_error(gpu_site(), exp(**{**b, "trainer": on, "rollout": rollout}))
        assert msg.startswith(f"{key} with rollout.engine='hf': the nucleus filter takes a floating-point cumsum")
    resolve(gpu_site(), exp(**{**b, "trainer": off}, algorithm=remax))
    resolve(LOCAL, exp(**{**b, "trainer": on}, algorithm=remax))
    resolve(LOCAL, exp(**{**b, "trainer": on, "rollout": RolloutSection(top_p=0.9)}))
    resolve(gpu_site(), exp(**{**b, "trainer": on, "rollout": RolloutSection(val_top_p=0.9)}))  # greedy val
    resolve(gpu_site(), exp(**{**b, "trainer": on, "rollout": RolloutSection(engine="vllm", top_p=0.9)}))
