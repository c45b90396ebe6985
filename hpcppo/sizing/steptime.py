"""One step's time, worst case, and GPU-hours of a run (``hpcppo plan``'s time table), from the compiled config and
the GPU's data sheet; the constants are :data:`hpcppo.sizing.catalog.ASSUMPTIONS`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from hpcppo import engines
from hpcppo.config.experiment import Experiment
from hpcppo.config.multi_turn import MultiTurnSection
from hpcppo.config.plan import VALIDATION_PROMPTS_PER_CALL, RunPlan
from hpcppo.config.resolve import resolve
from hpcppo.config.site import Site
from hpcppo.errors import ResolveError
from hpcppo.placement import placement_of
from hpcppo.estimators import needs_greedy_baseline
from hpcppo.sizing.accumulation import micro_batches_per_optimizer_step, reduce_scatter_bytes
from hpcppo.sizing.budget import ADAM_BYTES, MASTER_BYTES, Budget, dtype_bytes
from hpcppo.sizing.catalog import ASSUMPTIONS, GpuSpec, ModelShape
from hpcppo.sizing.lora import adapter_params, loads_reference

__all__ = ["step_time", "compare_placements", "tool_calls_per_trajectory", "UNLIMITED_TOOL_TURNS"]

#: Tool turns per trajectory the plan assumes when neither turn limit is set (only the response budget limits them).
UNLIMITED_TOOL_TURNS = 4


def tool_calls_per_trajectory(mt: MultiTurnSection) -> tuple[int, bool]:
    """(tool calls one trajectory makes at most, whether the turn count is assumed): a tool turn follows every
    assistant turn but the last and runs up to ``max_parallel_calls`` calls; the turn limit is the smaller of
    ``max_user_turns`` and ``max_assistant_turns`` that is set, else :data:`UNLIMITED_TOOL_TURNS` assumed."""
    limits = [n for n in (mt.max_user_turns, mt.max_assistant_turns) if n > 0]
    turns = min(limits) if limits else UNLIMITED_TOOL_TURNS
    return turns * mt.max_parallel_calls, not limits


def _replica_grad_sync_bytes(exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape, shard: int) -> float:
    """Bytes each GPU all-reduces across the HSDP replicas in a step (0 without replicas)."""
    replicas = plan.mesh_shape[0] if plan.hsdp else 1
    total = 0.0
    if replicas > 1:
        for fsdp, n, opt_steps in ((exp.actor.fsdp, m.params, plan.actor_optimizer_steps_per_step),
                                   (exp.critic.fsdp, cm.critic_params,
                                    plan.critic_ppo_epochs * plan.mini_batches_per_epoch_critic)):
            total += opt_steps * 2 * (replicas - 1) / replicas * n * dtype_bytes(fsdp.reduce_dtype) / shard
    return total


def _grad_reduce_scatters(t: dict[str, float], exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape,
                          gpu: GpuSpec, shard: int, train_factor: int, job_flops_s: float) -> None:
    """The gradient reduce-scatters of a step (hpcppo.sizing.accumulation): one per micro-batch of each update, each
    of the trained model's gradients in the reduce dtype over the FSDP shard group (NVLink within a node, the network
    across nodes). FSDP2 issues each layer's reduce-scatter on its own stream while the next layer's backward
    computes (``foreach_reduce``'s ``reduce_scatter_stream``), so the step counts only what the link time exceeds
    the backward compute of the same micro-batches (``(train_factor - 2) N`` FLOPs per token at the assumed MFU)."""
    A = {k: c.value for k, c in ASSUMPTIONS.items()}
    L, tokens = plan.max_sequence_length, plan.samples_per_step * plan.max_sequence_length
    link = gpu.nvlink_bytes_s if (plan.hsdp or placement_of(exp, plan).trainer_nodes == 1) else gpu.network_bytes_s
    count, sent, link_s, exposed = 0, 0.0, 0.0, 0.0
    a, c = exp.actor, exp.critic
    # (gradients reduce-scattered, active parameters, token budget, reduce dtype, samples per optimizer step and rank,
    # rows per micro-batch, optimizer steps, epochs) of each trained model
    models = [(adapter_params(m, a.lora) or m.params, m.active_params, a.max_tokens_per_micro_batch,
               a.fsdp.reduce_dtype, plan.actor_mini_batch_per_rank, plan.actor_micro_batch_per_rank,
               plan.actor_optimizer_steps_per_step, plan.actor_ppo_epochs)]
    if plan.needs_critic:
        models.append((adapter_params(cm, c.lora) or cm.critic_params, cm.critic_active_params,
                       c.max_tokens_per_micro_batch, c.fsdp.reduce_dtype, plan.critic_mini_batch_per_rank,
                       plan.critic_micro_batch_per_rank, plan.critic_ppo_epochs * plan.mini_batches_per_epoch_critic,
                       plan.critic_ppo_epochs))
    for n, active, budget, reduce_dtype, per_rank, rows, opt_steps, epochs in models:
        k = opt_steps * micro_batches_per_optimizer_step(per_rank, rows, budget, L)
        b = k * reduce_scatter_bytes(n, dtype_bytes(reduce_dtype), shard)
        s = b / (link * A["collective efficiency"])
        backward_s = (train_factor - 2) * active * tokens * epochs / job_flops_s
        count, sent, link_s, exposed = count + k, sent + b, link_s + s, exposed + max(0.0, s - backward_s)
    t["grad_reduce_scatters"] = count
    t["grad_reduce_scatter_bytes_per_gpu"] = sent
    t["grad_reduce_scatter_link_s"] = link_s
    t["grad_reduce_scatter_s"] = exposed


def _offload_bytes(exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape, shard: int,
                   rm: ModelShape | None = None) -> float:
    """Host <-> device bytes per GPU in a step: offloaded parameter shards (up for forward and backward, gradients
    down, per micro-batch), offloaded AdamW moments (down and up once), an offloaded reference."""
    host = 0.0
    for fsdp, n, micro_batches in (
            (exp.actor.fsdp, m.params, plan.actor_ppo_epochs * plan.samples_per_rank / plan.actor_micro_batch_per_rank),
            (exp.critic.fsdp, cm.critic_params,
             plan.critic_ppo_epochs * plan.samples_per_rank / max(1, plan.critic_micro_batch_per_rank))):
        if fsdp is exp.critic.fsdp and not plan.needs_critic:
            continue
        shard_bytes = n * MASTER_BYTES / shard
        if fsdp.param_offload:
            host += micro_batches * 3 * shard_bytes
        elif fsdp.optimizer_offload:
            host += 2 * n * ADAM_BYTES / shard
    if loads_reference(exp, plan) and exp.reference.offload:
        host += math.ceil(plan.samples_per_rank / plan.logprob_micro_batch_per_rank) * m.params * MASTER_BYTES / shard
    if rm is not None and exp.reward_model.offload:  # up once per forward, like the reference
        rows = exp.reward_model.micro_batch_size_per_gpu or plan.logprob_micro_batch_per_rank
        host += math.ceil(plan.samples_per_rank / rows) * rm.critic_params * MASTER_BYTES / shard
    return host


def step_time(budget: Budget, exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape, gpu: GpuSpec,
              rm: ModelShape | None = None, val_prompts: int | None = None) -> None:
    """``budget.time``: one step's phases, worst case, the checkpoint and GPU-hours; a warning when the preemption
    signal's lead is shorter than a step and a checkpoint. ``rm``: the ``[reward_model]``'s shape (one forward of
    every sample)."""
    A = {k: c.value for k, c in ASSUMPTIONS.items()}
    P, R, L = exp.data.max_prompt_length, exp.data.max_response_length, plan.max_sequence_length
    # the ranks that train: all of them colocated, the trainer ranks split (hpcppo.placement)
    tp, world, shard = plan.tensor_parallel_size, plan.train_dp_size, budget.shard_size
    split = plan.placement == "split"
    mbytes = dtype_bytes(exp.model.dtype)
    peak = gpu.bf16_flops if mbytes == 2 else gpu.bf16_flops / 16  # fp32 without TF32 tensor cores: ~1/16
    t: dict[str, float] = {}

    # Generation, per engine (one TP group), worst case: every response runs to max_response_length.
    def generation(seqs: int) -> tuple[float, float]:
        """(decode_s, prefill_s) of one engine call generating ``seqs`` sequences, in as many waves as its KV
        cache needs (``budget.kv``: the sequences of max_model_len it holds at once)."""
        fits = budget.kv.get("kv_tokens", 0) // max(1, budget.kv.get("max_model_len", L))
        waves = max(1, math.ceil(seqs / fits)) if fits else 1
        kv_tok = budget.kv.get("kv_bytes_per_token_per_gpu") or m.kv_bytes_per_token(mbytes) / tp
        # weights read per token step (of a mixture of experts, the experts the wave's tokens are routed to) + KV
        step_bytes = m.params_read(seqs / waves) * mbytes / tp + seqs / waves * (P + R / 2) * kv_tok
        return (waves * R * step_bytes / (gpu.hbm_bytes_s * A["decode bandwidth use"]),
                2 * m.active_params * seqs * P / (tp * peak * A["prefill MFU"]))

    # Colocated: one engine call per step of the group's prompts. Split: the busiest rollout engine's calls, one
    # per trainer share of the step's prompts it is dealt (hpcppo.rollout.worker generates share by share).
    share = plan.prompts_per_step // plan.train_dp_size if split else plan.prompts_per_rank
    calls = plan.prompts_per_rank // share
    decode_s, prefill_s = generation(share * exp.rollout.n)
    t["decode_s"], t["prefill_s"] = calls * decode_s, calls * prefill_s
    t["generate_s"] = t["decode_s"] + t["prefill_s"]
    t["generated_tokens_per_s"] = plan.samples_per_step * R / t["generate_s"]
    # ReMax's baseline: one greedy response per prompt, a second engine call (hpcppo.rollout.source.ColocatedSource.collect).
    t["baseline_generate_s"] = calls * sum(generation(share)) if needs_greedy_baseline(
        exp.algorithm.adv_estimator) else 0.0

    flops = _update_flops(exp, plan, m, cm, rm)
    t["update_flops"] = flops
    t["forward_and_update_s"] = flops / (world * peak * A["train MFU"])

    # Weight sync: every rank all-gathers the actor in the engine dtype over the FSDP shard group. Split: the trainers
    # gather the full parameters (iter_full_params) and trainer rank 0 broadcasts them to the rollout ranks over the
    # bridge: each link of the broadcast carries the model once, across nodes unless the job has one.
    trainer_nodes = placement_of(exp, plan).trainer_nodes  # the nodes the FSDP shard groups span
    link = gpu.nvlink_bytes_s if (plan.hsdp or trainer_nodes == 1) else gpu.network_bytes_s
    sync_bytes = m.params * mbytes
    t["weight_sync_bytes"] = sync_bytes
    gather_s = sync_bytes * (shard - 1) / shard / (link * A["collective efficiency"])
    if split:
        bridge = gpu.nvlink_bytes_s if plan.nodes == 1 else gpu.network_bytes_s
        t["weight_broadcast_s"] = sync_bytes / (bridge * A["collective efficiency"])
        t["weight_sync_s"] = gather_s + t["weight_broadcast_s"]
    else:
        t["weight_sync_s"] = gather_s if engines.lookup(exp.rollout.engine).timed_weight_sync else 0.0

    # HSDP: each optimizer step all-reduces the gradient shards (reduce dtype) across the replicas (nodes), over the
    # network (ring all-reduce: 2 (r - 1) / r of the bytes). Sharding collectives inside a node overlap compute.
    t["replica_grad_sync_s"] = _replica_grad_sync_bytes(exp, plan, m, cm, shard) / (
        gpu.network_bytes_s * A["collective efficiency"])

    train_factor = 8 if exp.model.gradient_checkpointing else 6  # as _update_flops counts a trained token
    _grad_reduce_scatters(t, exp, plan, m, cm, gpu, shard, train_factor, world * peak * A["train MFU"])

    # Host <-> device traffic of the offloads, over each GPU's PCIe link.
    host = _offload_bytes(exp, plan, m, cm, shard, rm)
    t["offload_bytes_per_gpu"] = host
    t["offload_s"] = host / gpu.pcie_bytes_s
    _tool_time(t, exp, plan)
    t["rollout_side_s"] = t["generate_s"] + t["baseline_generate_s"] + t["tool_s"]  # tools run on the generating side
    t["trainer_side_s"] = (t["forward_and_update_s"] + t["grad_reduce_scatter_s"] + t["replica_grad_sync_s"]
                           + t["offload_s"])
    if split and exp.rollout.max_staleness > 0:
        # the rollout ranks generate the next batches while the trainers train on this one: the slower side sets the
        # pace, and each step adds the weight transfer (both sides take part in it)
        t["step_s"] = max(t["rollout_side_s"], t["trainer_side_s"]) + t["weight_sync_s"]
    else:  # colocated, or split on-policy (max_staleness = 0: the trainers wait for samples of their weights)
        t["step_s"] = t["rollout_side_s"] + t["trainer_side_s"] + t["weight_sync_s"]
    _validation_time(t, exp, plan, val_prompts, generation)

    # A checkpoint: fp32 weights and AdamW moments of actor and critic, written once (DCP deduplicates replicas).
    state = 12 * m.params + (12 * cm.critic_params if plan.needs_critic else 0)
    t["checkpoint_bytes"] = state
    t["checkpoint_s"] = state / (trainer_nodes * A["checkpoint write per node"] * 1e9)  # the trainers write
    if split and exp.rollout.max_staleness > 0:
        # a split checkpoint holds the units of the next max_staleness steps (docs/rollout-phase.md, "Resume: the
        # queue is checkpointed") and waits for them: worst case (the rollout side the slower one, so nothing is
        # queued ahead) the generation of all of them
        t["checkpoint_queue_wait_s"] = exp.rollout.max_staleness * t["rollout_side_s"]
    if plan.total_steps:
        t["total_steps"] = plan.total_steps
        validations = t.get("validation_s", 0.0) * _validations(exp, plan.total_steps)
        t["gpu_hours"] = (plan.total_steps * t["step_s"] + validations) * plan.world_size / 3600
    # validations included: every test_freq steps (and the one before training, in the run's total); every GPU of
    # the allocation counts, rollout ranks too
    t["gpu_hours_per_100_steps"] = (100 * t["step_s"] + t.get("validation_s", 0.0) * _validations(
        exp, 100, before=False)) * plan.world_size / 3600
    budget.time = t
    _check_signal_lead(budget, exp, plan, t)


def _tool_time(t: dict[str, float], exp: Experiment, plan: RunPlan) -> None:
    """``t["tool_s"]``: the tool calls of a multi-turn step. Each rank's tool worker (hpcppo.agent.worker) answers one
    call at a time, so a rank's trajectories wait for each other's calls: samples per rank x calls per trajectory x
    ``expected_tool_s``. The tool turns' tokens are inside the response budget (``data.max_response_length`` covers
    every turn), which the generation and the forwards above already count as decoded, worst case."""
    mt = exp.rollout.multi_turn
    if not mt.enable:
        t["tool_s"] = 0.0
        return
    calls, assumed = tool_calls_per_trajectory(mt)
    t["tool_calls_per_trajectory"] = calls
    t["tool_turns_assumed"] = float(assumed)
    t["tool_s"] = plan.samples_per_rank * calls * mt.expected_tool_s


def _update_flops(exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape, rm: ModelShape | None) -> float:
    """The forwards and updates of one step: 2N per token forward, 6N to train (8N with activation checkpointing:
    one more forward), N the parameters a token runs through (a mixture of experts: its active parameters)."""
    tokens = plan.samples_per_step * plan.max_sequence_length
    train_factor = 8 if exp.model.gradient_checkpointing else 6
    n, cn = m.active_params, cm.critic_active_params
    # old log-probs; none in the rollout correction's bypass mode (the engine's stand in for them)
    flops = 0 if exp.algorithm.rollout_correction.bypass_mode else 2 * n * tokens
    if plan.needs_reference:
        flops += 2 * n * tokens
    if rm is not None:
        flops += 2 * rm.critic_active_params * tokens
    if plan.needs_critic:
        flops += 2 * cn * tokens + train_factor * cn * tokens * plan.critic_ppo_epochs
    flops += train_factor * n * tokens * plan.actor_ppo_epochs
    return flops


def _check_signal_lead(budget: Budget, exp: Experiment, plan: RunPlan, t: dict[str, float]) -> None:
    """A warning when the preemption signal's lead is shorter than a step and a checkpoint (in split placement with
    staleness, the checkpoint's wait for the queued units too)."""
    lead = plan.signal_lead_s
    queued = t.get("checkpoint_queue_wait_s", 0.0)
    need = t["step_s"] + t["checkpoint_s"] + queued
    if lead and exp.checkpoint.save_on_preempt and lead < need:
        parts, sums = "step + checkpoint", f"{t['step_s']:.0f} s + {t['checkpoint_s']:.0f} s"
        if queued:
            parts += f" + its wait for the next {exp.rollout.max_staleness} steps' samples"
            sums += f" + {queued:.0f} s"
        budget.warnings.append(
            f"slurm.signal_lead_s = {lead} s is shorter than an estimated {parts} ({sums}): the USR2 checkpoint may "
            f"not finish before the time limit and the job would end in TIMEOUT, which Slurm does not requeue; raise "
            f"it to at least {math.ceil(1.5 * need)} (-o site.slurm.signal_lead_s=...)")


def _validations(exp: Experiment, total_steps: int, *, before: bool = True) -> int:
    """How many validations ``total_steps`` steps make: one every ``test_freq`` steps and, for a whole run
    (``before``), one before training (``val_before_train``), as the trainer's loop validates."""
    tr = exp.trainer
    if not exp.data.val_files:
        return 0
    return int(before and tr.val_before_train) + (total_steps // tr.test_freq if tr.test_freq > 0 else 0)


def _validation_time(t: dict[str, float], exp: Experiment, plan: RunPlan, val_prompts: int | None,
                     generation: Callable[[int], tuple[float, float]]) -> None:
    """``t["validation_s"]``: one validation, worst case, when the number of validation prompts is known: each
    rollout group decodes its share of them, ``rollout.val_n`` responses each, 64 prompts per engine call
    (``hpcppo.train.trainer.Trainer.validate``)."""
    if not val_prompts or not exp.data.val_files:
        return
    share = math.ceil(val_prompts / plan.dp_size)
    calls, last = divmod(share, VALIDATION_PROMPTS_PER_CALL)
    n = exp.rollout.val_n
    t["validation_prompts"] = val_prompts
    t["validation_s"] = calls * sum(generation(VALIDATION_PROMPTS_PER_CALL * n)) + (sum(generation(last * n)) if last
                                                                                 else 0.0)


# ------------------------------------------------------------------------------------------------ placements

# vLLM's share of a GPU in the alternatives: a rollout rank holds its engine alone, so it takes vLLM's own default
# (EngineArgs.gpu_memory_utilization = 0.9); a colocated alternative of a split run keeps the spec's share if its
# phases fit beside the trainer's state, else hpcppo's default (rollout.gpu_memory_utilization = 0.5).
SPLIT_SHARE, COLOCATED_SHARE = 0.9, 0.5

EstimateFn = Callable[[Experiment, RunPlan], Budget]


def _candidates(exp: Experiment, plan: RunPlan) -> list[list[Experiment]]:
    """The other placements of the same job, each as the variants to try (the fastest that fits counts):
    colocated for a split run; for a colocated run every split that keeps whole tensor-parallel groups on the
    rollout side (rollout ranks on every node, or whole nodes)."""
    ro, res = exp.rollout, exp.resources
    vllm_share = engines.lookup(ro.engine).kv_cache_share and not ro.kv_cache_memory_mb
    if plan.placement == "split":
        colocated = attrs.evolve(exp, rollout=attrs.evolve(ro, placement="colocated"),
                                 resources=attrs.evolve(res, rollout_ranks_per_node=0, rollout_nodes=0))
        variants = [colocated]
        if vllm_share and ro.gpu_memory_utilization > COLOCATED_SHARE:
            variants.append(attrs.evolve(colocated, rollout=attrs.evolve(colocated.rollout,
                                                                         gpu_memory_utilization=COLOCATED_SHARE)))
        return [variants]
    # Each alternative split tries engines of 1, 2, 4 ... GPUs of one node (and the spec's size): the fastest that
    # fits counts (more engines generate more at once, but a big model on few GPUs leaves little KV cache).
    share = max(SPLIT_SHARE, ro.gpu_memory_utilization) if vllm_share else ro.gpu_memory_utilization

    def splits(rollout_ranks_per_node: int, rollout_nodes: int) -> list[Experiment]:
        group = rollout_ranks_per_node or plan.ranks_per_node  # an engine's GPUs are rollout ranks of one node
        sizes = sorted({1 << i for i in range(group.bit_length()) if group % (1 << i) == 0}
                       | ({ro.tensor_parallel_size} if group % ro.tensor_parallel_size == 0 else set()))
        if not engines.lookup(ro.engine).tensor_parallel:
            sizes = [1]
        return [attrs.evolve(exp, rollout=attrs.evolve(ro, placement="split", tensor_parallel_size=tp,
                                                       gpu_memory_utilization=share),
                             resources=attrs.evolve(res, rollout_ranks_per_node=rollout_ranks_per_node,
                                                    rollout_nodes=rollout_nodes)) for tp in sizes]

    return ([splits(k, 0) for k in range(1, plan.ranks_per_node)]
            + [splits(0, k) for k in range(1, plan.nodes)])


def _row(exp: Experiment, plan: RunPlan, budget: Budget) -> dict[str, Any]:
    p, t = placement_of(exp, plan), budget.time
    return {"placement": p.kind, "layout": p.describe(), "rollout_gpus": len(p.rollout_ranks) or plan.world_size,
            "trainer_gpus": plan.train_dp_size, "max_staleness": exp.rollout.max_staleness,
            "gpu_memory_utilization": exp.rollout.gpu_memory_utilization,
            "tensor_parallel_size": exp.rollout.tensor_parallel_size, "fits": not budget.problems,
            **{k: t[k] for k in ("step_s", "rollout_side_s", "trainer_side_s", "weight_sync_s",
                                 "gpu_hours_per_100_steps")}}


def compare_placements(budget: Budget, site: Site, exp: Experiment, plan: RunPlan, estimate: EstimateFn) -> None:
    """``budget.placements``: this run's step (from ``budget.time``) and the fastest other placement of the same GPUs
    that compiles and fits (colocated for a split run, the best split for a colocated one), each estimated whole
    (``estimate``: memory, KV cache, step time) with its own plan; ``budget.placement_verdict`` says which is faster
    and why."""
    this = _row(exp, plan, budget)
    others, refused = [], ""
    for variants in _candidates(exp, plan):
        rows = []
        for v in variants:
            try:
                other_plan = resolve(site, v)
            except ResolveError as exc:
                refused = refused or str(exc)
                continue
            b = estimate(v, other_plan)
            if b.time:
                rows.append(_row(v, other_plan, b))
        fitting = [r for r in rows if r["fits"]]
        others += [min(fitting, key=lambda r: r["step_s"])] if fitting else rows[-1:]
    budget.placements = [this]
    what = "colocated" if plan.placement == "split" else "split"
    if not others:
        budget.placement_verdict = (f"no {what} placement of these {plan.world_size} GPUs compiles"
                                    + (f" ({refused})" if refused else ""))
        return
    best = min(others, key=lambda r: (not r["fits"], r["step_s"]))
    budget.placements.append(best)
    budget.placement_verdict = _verdict(this, best) + ("" if best["fits"] else
                                                       f" The {what} placement does not fit the GPUs' memory.")
    changed = [f"{key} = {best[key]}" for key in ("gpu_memory_utilization", "tensor_parallel_size")
               if best[key] != getattr(exp.rollout, key)]
    if best["placement"] == "split" and changed:
        budget.placement_verdict += (f" Split counted with rollout.{' and rollout.'.join(changed)}: a rollout rank "
                                     f"holds its engine (or its share of one) and nothing else.")


def _side(row: dict[str, Any]) -> str:
    if row["placement"] == "colocated":
        return (f"colocated generates ({row['rollout_side_s']:,.0f} s) and trains ({row['trainer_side_s']:,.0f} s) "
                f"one after the other on all {row['trainer_gpus']} GPUs")
    overlap = ("overlapping" if row["max_staleness"] > 0 else
               "not overlapping (max_staleness = 0: the trainers wait for samples of their own weights)")
    return (f"split generates on {row['rollout_gpus']} GPUs ({row['rollout_side_s']:,.0f} s) and trains on "
            f"{row['trainer_gpus']} ({row['trainer_side_s']:,.0f} s), {overlap}, plus "
            f"{row['weight_sync_s']:,.1f} s of weight transfer")


def _verdict(this: dict[str, Any], other: dict[str, Any]) -> str:
    """Which placement is faster per step, by how much, and why (the phases' times on each side)."""
    fast, slow = (this, other) if this["step_s"] <= other["step_s"] else (other, this)
    ratio = slow["step_s"] / fast["step_s"] if fast["step_s"] else 1.0
    split = fast if fast["placement"] == "split" else slow
    if fast["placement"] == "split":
        why = ("generation and training overlap (and the rollout ranks give the KV cache their whole memory)"
               if split["max_staleness"] > 0 else "each side is faster on GPUs of its own")
    else:
        why = ("each side on fewer GPUs takes longer than the overlap saves"
               if split["max_staleness"] > 0 else "split on-policy overlaps nothing")
    first = _side(fast)
    return (f"{fast['placement']} is faster: {fast['step_s']:,.0f} s a step against {slow['step_s']:,.0f} s for "
            f"{slow['layout']} ({ratio:.2f}x): {why}. {first[0].upper() + first[1:]}; {_side(slow)}. Worst case "
            f"as above: the long tail of response lengths, which split hides (colocated waits for each step's "
            f"longest response), is not modelled.")
