"""Per-GPU memory budget and step-time estimate of a colocated run, from the compiled config alone (no torch).

The arithmetic follows what the trainer does (hpcppo/train/build.py, hpcppo/distributed/fsdp.py,
hpcppo/train/optim.py, hpcppo/models/):

* actor, critic and reference are loaded in float32 and FSDP2-sharded over the mesh's ``shard`` dimension (all ranks,
  or the ranks of a node with HSDP); ``param_dtype`` (model.dtype unless set) is only the compute dtype of gathered
  layers. Per parameter and shard: 4 B master weights, 4 B gradients (FSDP2 keeps sharded grads in the parameter's
  dtype; ``zero_grad(set_to_none=True)`` frees them after each optimizer step), 8 B for AdamW's two moments: the
  16 B/param of the ZeRO paper's mixed-precision Adam, with a different split.
* ``param_offload``: shards, gradients and optimizer state live on the host (FSDP2's CPUOffloadPolicy); only gathered
  layers are on the GPU. ``optimizer_offload``: the moments are on the host between updates and come back before the
  update's first optimizer step (OptimizerStateOffload). ``reference.offload``: the reference's shards on the host.
* Gathered while a model computes: FSDP's root unit (embeddings, LM head, final norm) for the whole forward/backward,
  the running and the prefetched layer, and in backward one layer's unsharded gradients.
* Activations: one micro-batch of ``max_prompt_length + max_response_length`` tokens; the log-prob path materialises
  the logits of one chunk of response positions at a time (``LOGITS_CHUNK_ELEMENTS``, or the whole
  ``[micro, response + 1, vocab]`` when they fit one), in the compute dtype, a float32 copy and float32 temporaries
  (logsumexp, and the entropy's softmax in an update with ``actor.entropy_coeff > 0``).
* vLLM takes ``gpu_memory_utilization`` x the device memory while awake (a per-instance limit); its weights (model.dtype,
  split over tensor parallelism) and profiling activations come out of that share and the rest is KV cache. With
  ``rollout.free_cache_engine`` the engine sleeps (level 2) during the update and frees its share.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from hpcppo import engines
from hpcppo.config.experiment import Experiment, FsdpSection
from hpcppo.config.plan import RunPlan
from hpcppo.config.site import Site
from hpcppo.sizing.accumulation import grad_item_label, grads_in_flight
from hpcppo.sizing.budget import ADAM_BYTES, MASTER_BYTES, Budget, Item, Phase, dtype_bytes
from hpcppo.sizing.catalog import ASSUMPTIONS, GIB, GPUS, KNOWN_MODELS, ModelShape
from hpcppo.sizing.lora import adapter_params, loads_reference, lora_note
from hpcppo.sizing.steptime import compare_placements, step_time

__all__ = ["Item", "Phase", "Budget", "model_shape", "estimate", "dtype_bytes"]

# ------------------------------------------------------------------------------------------------ model shape
def _from_config_json(path: Path) -> ModelShape:
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    heads, kind = int(cfg["num_attention_heads"]), cfg.get("model_type")
    return ModelShape(
        name=path.parent.name, hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]), tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=int(cfg.get("head_dim") or 0),
        attention_bias=bool(cfg.get("attention_bias", kind in ("qwen2", "qwen2_moe"))),
        qk_norm=kind in ("qwen3", "qwen3_moe"), source=str(path), **_moe_fields(cfg))


_UNKNOWN_MOE_KEYS = ("n_routed_experts", "num_experts_per_token", "moe_num_experts")


def _moe_fields(cfg: dict) -> dict[str, int]:
    """The expert layout of a config.json, as ModelShape fields (none for a dense model).

    Qwen3-MoE and Qwen2-MoE (transformers' ``Qwen3MoeConfig`` / ``Qwen2MoeConfig``): experts of
    ``moe_intermediate_size`` (their number is ``num_experts`` on the hub; transformers 5 saves it as
    ``num_local_experts``), ``num_experts_per_tok`` per token, in the layers not listed in ``mlp_only_layers`` whose
    index + 1 is a multiple of ``decoder_sparse_step``; Qwen2-MoE adds a shared expert of
    ``shared_expert_intermediate_size``. Mixtral: ``num_local_experts`` experts of ``intermediate_size`` in every
    layer. Another expert layout (DeepSeek's ``n_routed_experts``, ...) raises ValueError: the plan does not guess it.
    """
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if not experts:
        unknown = [k for k in _UNKNOWN_MOE_KEYS if cfg.get(k)]
        if unknown:
            raise ValueError(f"mixture-of-experts keys {unknown} of model_type {cfg.get('model_type')!r} are not "
                             "a layout the plan knows (Qwen3-MoE, Qwen2-MoE, Mixtral)")
        return {}
    layers, step = int(cfg["num_hidden_layers"]), int(cfg.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in cfg.get("mlp_only_layers") or []}
    return {"num_experts": experts, "experts_per_token": int(cfg["num_experts_per_tok"]),
            "moe_intermediate": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
            "moe_layers": sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0),
            "shared_expert_intermediate": int(cfg.get("shared_expert_intermediate_size") or 0)}


def _known(name: str) -> ModelShape | None:
    key = name.lower()
    for suffix in ("-instruct-2507", "-thinking-2507", "-instruct", "-chat", "-base"):
        key = key.removesuffix(suffix)
    return KNOWN_MODELS.get(key)


def model_shape(path: str) -> tuple[ModelShape | None, str]:
    """The shape of the model at ``path``: its config.json when it is here, else the known architecture its
    directory (or hub) name names. ``(None, why)`` when neither."""
    config = Path(path) / "config.json"
    try:
        if config.is_file():
            return _from_config_json(config), f"from {config}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{config} is not a usable decoder config ({type(exc).__name__}: {exc})"
    shape = _known(os.path.basename(os.path.normpath(path)))
    if shape is not None:
        return shape, f"{shape.name} from the known table ({shape.source}); {config} is not here"
    known = ", ".join(m.name for m in KNOWN_MODELS.values())
    return None, f"no {config} here and {os.path.basename(path)!r} is not a known architecture ({known})"


# ------------------------------------------------------------------------------------------------ memory
@dataclass
class _Trained:
    """GPU bytes of one trained model (actor or critic) on one rank."""

    params: int
    grads: int
    optim: int
    optim_between_updates: int  # 0 when optimizer_offload keeps the moments on the host between updates


def _trained(n: int, shard: int, fsdp: FsdpSection, adapters: int = 0) -> _Trained:
    """``n`` parameters; with LoRA ``adapters`` > 0 of them more, and only those have gradients and moments."""
    if fsdp.param_offload:
        return _Trained(0, 0, 0, 0)
    trained = adapters or n
    params = math.ceil((n + adapters) * MASTER_BYTES / shard)
    grads, optim = (math.ceil(trained * b / shard) for b in (MASTER_BYTES, ADAM_BYTES))
    return _Trained(params, grads, optim, 0 if fsdp.optimizer_offload else optim)


def _gathered(m: ModelShape, n_layer_params: int, pbytes: int, *, reshard: bool) -> int:
    """Unsharded parameters while a model computes (their gradients in backward: :func:`_update_grads`).

    The root unit (embeddings, LM head, final norm) is gathered from the model's pre-forward to its post-forward
    and again over the whole backward; hpcppo passes ``reshard_after_forward`` explicitly, so torch 2.13 does not
    keep the root gathered between them (``auto_reshard_after_forward`` is only set for ``None``:
    torch/distributed/fsdp/_fully_shard/_fully_shard.py and _fsdp_state.py ``_lazy_init``)."""
    layers = 2 if reshard else m.layers  # running + prefetched, or all of them kept from forward to backward
    return m.root_params * pbytes + layers * n_layer_params * pbytes


def _update_grads(role: str, m: ModelShape, shard_bytes: int, param_dtype: str, reduce_dtype: str) -> Item:
    """An update's gradient line: the fp32 shard accumulated over the micro-batches (0 with ``param_offload``: on the
    host) plus at most one layer's unsharded gradients in flight (hpcppo.sizing.accumulation)."""
    flight = grads_in_flight(m, m.layer_params, dtype_bytes(param_dtype), dtype_bytes(reduce_dtype))
    return Item(grad_item_label(role, shard_bytes, flight, param_dtype, reduce_dtype), shard_bytes + flight)


def _layer_acts(m: ModelShape, tokens: int, abytes: int, *, checkpointing: bool) -> int:
    one = tokens * m.activation_elems_per_token_layer() * abytes
    if checkpointing:
        # Layer inputs + one layer recomputed in backward, with its activation gradients: a quarter more than its
        # saved tensors, as tests/unit/test_plan_activations.py measures.
        return m.layers * tokens * m.hidden * abytes + one * 5 // 4
    return m.layers * one


LOGITS_CHUNK_ELEMENTS = 1 << 26
"""hpcppo.models.LOGITS_CHUNK_ELEMENTS (this package imports no torch; tests/unit/test_plan_activations.py checks
that the two agree)."""


def logit_chunk_positions(micro: int, response: int, vocab: int, chunk_elements: int = LOGITS_CHUNK_ELEMENTS) -> int:
    """Response positions per chunk of the log-prob pass (hpcppo.models.forward._chunk_positions): ``response`` when a
    micro-batch's logits fit one chunk."""
    return min(response, max(1, chunk_elements // max(1, micro * vocab)))


def _logits(m: ModelShape, micro: int, response: int, abytes: int, *, update: bool, entropy_bonus: bool = True,
            chunk_elements: int = LOGITS_CHUNK_ELEMENTS) -> int:
    # The log-prob pass runs over chunks of response positions (hpcppo.models.forward_log_probs). Per logit of the
    # chunk in flight: without autograd a float32 copy and a float32 logsumexp temporary (8 B; the compute-dtype
    # logits are freed once copied). In an update backward holds the compute-dtype logits, the float32 copy, the
    # softmax and the float32 gradients of the gather, logsumexp (and entropy) paths: abytes + 14 without an entropy
    # bonus (the entropy is then a metric, algos.entropy_metric), abytes + 16 with one, abytes + 18 when backward
    # recomputes a checkpointed chunk (an upper bound: 1.1-1.3x what was measured with 4 and 8 chunks).
    # All measured on CPU by tests/unit/test_plan_activations.py.
    positions = logit_chunk_positions(micro, response, m.vocab, chunk_elements)
    if positions >= response:
        per = (abytes + (16 if entropy_bonus else 14)) if update else 8
        return micro * (response + 1) * m.vocab * per
    per = (abytes + (18 if entropy_bonus else 14)) if update else 8
    return micro * positions * m.vocab * per


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def estimate(site: Site, exp: Experiment, plan: RunPlan, *, val_prompts: int | None = None,
             compare: bool = True) -> Budget:
    """The memory budget per GPU and the time estimate of one step (and of one validation, given the number of
    validation prompts). Never raises for a model it cannot size: the budget then has no phases and says why in
    ``model_note``. ``compare``: also estimate the other placement of the same GPUs (``budget.placements``)."""
    gpu = GPUS.get(site.gpu) if site.gpu else None
    shard = plan.mesh_shape[-1]
    shape, note = model_shape(exp.model.path)
    budget = Budget(model=shape, model_note=note, gpu=gpu, world_size=plan.world_size, shard_size=shard,
                    device=plan.device)
    if gpu is not None:
        budget.constants.extend(gpu.constants())
    budget.constants.extend(ASSUMPTIONS.values())
    if shape is None:
        return budget
    critic_shape = shape
    if exp.model.critic_path and plan.needs_critic:
        critic_shape = model_shape(exp.model.critic_path)[0] or shape
    budget.model_note += lora_note(exp, plan, shape, critic_shape)
    _memory(budget, exp, plan, shape, critic_shape)
    _host_startup(budget, site, exp, plan, shape, critic_shape)
    if gpu is not None:
        _judge(budget, exp, plan)
        step_time(budget, exp, plan, shape, critic_shape, gpu, reward_model_shape(exp), val_prompts)
        if compare:
            compare_placements(budget, site, exp, plan, lambda other, other_plan: estimate(
                site, other, other_plan, val_prompts=val_prompts, compare=False))
    return budget


def _memory(budget: Budget, exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape) -> None:
    shard = budget.shard_size
    ro, data = exp.rollout, exp.data
    L, R = plan.max_sequence_length, data.max_response_length
    mbytes = dtype_bytes(exp.model.dtype)
    pbytes = dtype_bytes(plan.actor_param_dtype)
    reserve = int(ASSUMPTIONS["framework reserve"].value * GIB) if plan.device == "cuda" else 0

    actor = _trained(m.params, shard, exp.actor.fsdp, adapter_params(m, exp.actor.lora))
    critic = _trained(cm.critic_params, shard, exp.critic.fsdp, adapter_params(cm, exp.critic.lora)) \
        if plan.needs_critic else _Trained(0, 0, 0, 0)
    ref = 0 if (not loads_reference(exp, plan) or exp.reference.offload) \
        else math.ceil(m.params * MASTER_BYTES / shard)
    rm_shape = reward_model_shape(exp)
    rm = 0 if rm_shape is None or exp.reward_model.offload else math.ceil(rm_shape.critic_params * MASTER_BYTES / shard)

    vllm_share, vllm_asleep = _vllm_memory(budget, exp, plan, m, mbytes)

    def resident(skip: str = "") -> list[Item]:
        items = [Item("framework reserve (CUDA context, NCCL)", reserve)]
        if actor.params and skip != "actor":
            items.append(Item("actor params (fp32 shard)", actor.params))
        if actor.optim_between_updates and skip != "actor":
            items.append(Item("actor AdamW moments (fp32 shard)", actor.optim_between_updates))
        if critic.params and skip != "critic":
            items.append(Item("critic params (fp32 shard)", critic.params))
        if critic.optim_between_updates and skip != "critic":
            items.append(Item("critic AdamW moments (fp32 shard)", critic.optim_between_updates))
        if ref:
            items.append(Item("reference params (fp32 shard)", ref))
        if rm:
            items.append(Item("reward model params (fp32 shard)", rm))
        return items

    phases = []
    split = plan.placement == "split"
    if split:
        # Rollout ranks hold a whole engine and no trainer state; trainer ranks no engine (hpcppo.placement).
        phases.append(_rollout_rank_phase(exp, plan, m, vllm_share, reserve))
        vllm_asleep = 0
    elif engines.lookup(ro.engine).kv_cache_share:
        label = "vLLM: weights + kv_cache_memory_mb" if ro.kv_cache_memory_mb else "vLLM share (gpu_memory_utilization)"
        phases.append(Phase("rollout (vLLM awake)", resident() + [Item(label, vllm_share)]))
    else:
        hf_cache = plan.prompts_per_rank * ro.n * L * m.kv_bytes_per_token(mbytes)
        phases.append(Phase("rollout (hf generate)", resident() + [
            Item("gathered layers (compute dtype)", _gathered(m, m.layer_params, pbytes, reshard=True)),
            Item("KV cache of the batch", hf_cache)]))
    asleep = [Item("vLLM while asleep" if ro.free_cache_engine else "vLLM share (no sleep mode)", vllm_asleep)] \
        if vllm_asleep else []

    lm, lm_tokens, lm_what = _micro_batch(plan.logprob_micro_batch_per_rank, ro.max_tokens_per_micro_batch, L, R)
    fwd = resident() + asleep + [
        Item("gathered layers (compute dtype)", _gathered(m, m.layer_params, pbytes, reshard=True)),
        # Without autograd nothing is kept across layers: the MLP's gate, up and product, plus the residual stream.
        Item(f"one layer's working set ({lm_what})", lm_tokens * m.working_elems_per_token() * pbytes),
        Item(f"log-prob logits ({lm} x {logit_chunk_positions(lm, R, m.vocab)} of {R} x {m.vocab})",
             _logits(m, lm, R, pbytes, update=False))]
    phases.append(Phase("old log-probs / reference / values", fwd))
    if rm_shape is not None:
        phases.append(_reward_model_phase(exp, plan, rm_shape, resident() + asleep))

    phases += _actor_phases(exp, plan, m, actor, resident(skip="actor") + asleep)
    if plan.needs_critic:
        phases += _critic_phases(exp, plan, cm, critic, resident(skip="critic") + asleep)
    budget.phases = [Phase(p.name, [i for i in p.items if i.bytes]) for p in phases]


ROLLOUT_RANK = "rollout rank"  # the phase of a split run's rollout ranks (its name starts with it)


def _rollout_rank_phase(exp: Experiment, plan: RunPlan, m: ModelShape, vllm_share: int, reserve: int) -> Phase:
    """What a split run's rollout rank holds: its engine, awake all the time (weights in model.dtype, split by
    tensor parallelism, and the KV cache: vLLM's share, or the HF loop's cache of its whole batch), no trainer state."""
    ro, mbytes = exp.rollout, dtype_bytes(exp.model.dtype)
    items = [Item("framework reserve (CUDA context, NCCL)", reserve)]
    if engines.lookup(ro.engine).kv_cache_share:
        label = "vLLM: weights + kv_cache_memory_mb" if ro.kv_cache_memory_mb else "vLLM share (gpu_memory_utilization)"
        return Phase(f"{ROLLOUT_RANK} (vLLM, never sleeps)", items + [Item(label, vllm_share)])
    return Phase(f"{ROLLOUT_RANK} (hf generate)", items + [
        Item("engine weights (model.dtype)", m.params * mbytes),
        Item("KV cache of the batch", plan.prompts_per_rank * ro.n * plan.max_sequence_length * m.kv_bytes_per_token(mbytes))])


def reward_model_shape(exp: Experiment) -> ModelShape | None:
    """The ``[reward_model]``'s shape when it is enabled and its config can be read (its head has one output: the
    critic's parameter count)."""
    return model_shape(exp.reward_model.path)[0] if exp.reward_model.enable else None


def _reward_model_phase(exp: Experiment, plan: RunPlan, rm: ModelShape, resident: list[Item]) -> Phase:
    """The reward model's forward (hpcppo.train.reward_phase): its gathered layers and one layer's working set of a
    micro-batch of re-templated sequences (at most ``max_length`` tokens each)."""
    rmc = exp.reward_model
    pbytes = dtype_bytes(rmc.dtype or exp.model.dtype)
    seq = rmc.max_length or plan.max_sequence_length
    rows, tokens, what = _micro_batch(rmc.micro_batch_size_per_gpu or plan.logprob_micro_batch_per_rank,
                                      rmc.max_tokens_per_micro_batch, seq, 1)
    return Phase("reward model", resident + [
        Item("gathered reward-model layers (compute dtype)",
             _gathered(rm, rm.layer_params, pbytes, reshard=True)),
        Item(f"one layer's working set ({what})", tokens * rm.working_elems_per_token() * pbytes)])


def _micro_batch(rows: int, budget: int, seq_len: int, response: int) -> tuple[int, int, str]:
    """A forward/backward's worst case: (rows for the logits bound, tokens in flight, how to say it).

    Fixed-size micro-batches hold ``rows`` sequences padded to ``seq_len``. A token budget (``max_tokens_per_micro_
    batch``, padding included, hpcppo.train.batching) holds at most ``budget`` tokens however many rows share them, so
    activations scale with the budget; its response positions are at most ``budget`` too, as many as
    ``budget // response`` full-length responses (the bound used for the logits)."""
    if budget <= 0:
        return rows, rows * seq_len, f"{rows} x {seq_len} tokens"
    return max(1, budget // max(1, response)), budget, f"a budget of {budget} tokens"


def _actor_phases(exp: Experiment, plan: RunPlan, m: ModelShape, actor: _Trained, resident: list[Item]) -> list[Phase]:
    """The actor's update (and its optimizer step when the offloaded moments come back for it alone); ``resident``:
    what stays on the GPU meanwhile."""
    L, R, ckpt = plan.max_sequence_length, exp.data.max_response_length, exp.model.gradient_checkpointing
    pbytes = dtype_bytes(plan.actor_param_dtype)
    am, am_tokens, am_what = _micro_batch(plan.actor_micro_batch_per_rank, exp.actor.max_tokens_per_micro_batch, L, R)
    bonus = bool(exp.actor.entropy_coeff)  # else the entropy is a metric, not in the graph (train/update.py)
    optimizer_steps = plan.actor_optimizer_steps_per_step
    # With optimizer_offload the moments come back before the first optimizer step and stay for the update's later
    # mini-batches; with a single optimizer step they are never beside the activations.
    actor_optim_with_acts = actor.optim if (actor.optim_between_updates or optimizer_steps > 1) else 0
    update = resident + [
        Item("actor params (fp32 shard)", actor.params),
        _update_grads("actor", m, actor.grads, plan.actor_param_dtype, exp.actor.fsdp.reduce_dtype),
        Item("actor AdamW moments (fp32 shard)", actor_optim_with_acts),
        Item("gathered layers (compute dtype)",
             _gathered(m, m.layer_params, pbytes, reshard=exp.actor.fsdp.reshard_after_forward)),
        Item(f"activations ({am_what}{', checkpointed' if ckpt else ''})",
             _layer_acts(m, am_tokens, pbytes, checkpointing=ckpt)),
        Item(f"policy logits{' + entropy' if bonus else ''} ({am} x {logit_chunk_positions(am, R, m.vocab)} of {R} x "
             f"{m.vocab})",
             _logits(m, am, R, pbytes, update=True, entropy_bonus=bonus))]
    phases = [Phase("actor update", [i for i in update if i.bytes])]
    if actor.optim and not actor_optim_with_acts:  # offloaded moments back for the one optimizer step
        phases.append(Phase("actor optimizer step", resident + [
            Item("actor params (fp32 shard)", actor.params), Item("actor grads (fp32 shard)", actor.grads),
            Item("actor AdamW moments (fp32 shard)", actor.optim)]))
    return phases


def _critic_phases(exp: Experiment, plan: RunPlan, cm: ModelShape, critic: _Trained,
                   resident: list[Item]) -> list[Phase]:
    """The critic's update (and its optimizer step when the moments come back for it alone); ``resident``: what
    stays on the GPU meanwhile."""
    L, ckpt = plan.max_sequence_length, exp.model.gradient_checkpointing
    cpbytes = dtype_bytes(plan.critic_param_dtype)
    phases = []
    cmb, cmb_tokens, cmb_what = _micro_batch(plan.critic_micro_batch_per_rank, exp.critic.max_tokens_per_micro_batch,
                                             L, exp.data.max_response_length)
    c_optim = critic.optim if (critic.optim_between_updates or plan.critic_ppo_epochs * plan.mini_batches_per_epoch_critic > 1) else 0
    cupdate = resident + [
        Item("critic params (fp32 shard)", critic.params),
        _update_grads("critic", cm, critic.grads, plan.critic_param_dtype, exp.critic.fsdp.reduce_dtype),
        Item("critic AdamW moments (fp32 shard)", c_optim),
        Item("gathered layers (compute dtype)",
             _gathered(cm, cm.layer_params, cpbytes, reshard=exp.critic.fsdp.reshard_after_forward)),
        Item(f"activations ({cmb_what}{', checkpointed' if ckpt else ''})",
             _layer_acts(cm, cmb_tokens, cpbytes, checkpointing=ckpt))]
    phases.append(Phase("critic update", [i for i in cupdate if i.bytes]))
    if critic.optim and not c_optim:
        phases.append(Phase("critic optimizer step", resident + [
            Item("critic params (fp32 shard)", critic.params), Item("critic grads (fp32 shard)", critic.grads),
            Item("critic AdamW moments (fp32 shard)", critic.optim)]))
    return phases


def _vllm_memory(budget: Budget, exp: Experiment, plan: RunPlan, m: ModelShape, mbytes: int) -> tuple[int, int]:
    """vLLM's bytes per GPU while awake and while asleep (0, 0 without vLLM or a known GPU); fills ``budget.kv``."""
    ro, gpu = exp.rollout, budget.gpu
    if not engines.lookup(ro.engine).kv_cache_share or gpu is None:
        return 0, 0
    # vLLM v1's Worker.init_device (vllm/v1/worker/gpu_worker.py): requested = total memory x
    # gpu_memory_utilization, refused at start-up when less is free, so it is a per-instance share of the whole
    # device, not of what training leaves. LLM.sleep(level=2) (vllm/entrypoints/llm.py) discards weights and KV
    # cache; what stays is outside its CuMem pool (CUDA graphs), counted as "vLLM while asleep".
    vllm_share = int(ro.gpu_memory_utilization * gpu.memory_bytes)
    graphs = 0 if ro.enforce_eager else int(ASSUMPTIONS["vLLM CUDA graphs"].value * GIB)
    if ro.kv_cache_memory_mb:
        # An explicit KV cache replaces the share: Worker.determine_available_memory (vllm/v1/worker/
        # gpu_worker.py, 0.32.0) still runs the profile pass, then reserves exactly kv_cache_memory_bytes,
        # "This does not respect the gpu_memory_utilization config". Awake: weights + that pass + graphs + cache.
        weights, profile = _vllm_weights_and_profile(plan, m, mbytes)
        vllm_share = weights + profile + graphs + ro.kv_cache_memory_mb * 2**20
    vllm_asleep = graphs if ro.free_cache_engine else vllm_share
    _kv_cache(budget, exp, plan, m, vllm_share, graphs, mbytes)
    return vllm_share, vllm_asleep


def _vllm_weights_and_profile(plan: RunPlan, m: ModelShape, mbytes: int) -> tuple[int, int]:
    """Bytes per GPU of vLLM's weights and of its start-up profile pass (activations of one batch of
    ``vLLM batched tokens`` plus the sampler's logits)."""
    tp = plan.tensor_parallel_size
    weights = math.ceil(m.params * mbytes / tp)
    batched = int(ASSUMPTIONS["vLLM batched tokens"].value)
    return weights, batched * m.activation_elems_per_token_layer() * mbytes // tp + 256 * m.vocab * 4


def _kv_cache(budget: Budget, exp: Experiment, plan: RunPlan, m: ModelShape, share: int, graphs: int,
              mbytes: int) -> None:
    tp = plan.tensor_parallel_size
    weights, profile = _vllm_weights_and_profile(plan, m, mbytes)
    kv_bytes = share - weights - profile - graphs
    # vLLM's ModelConfig.get_num_kv_heads: max(1, kv_heads // tp), i.e. KV heads are replicated when tp > kv_heads.
    kv_heads_per_gpu = max(1, m.kv_heads // tp)
    per_token = 2 * m.layers * kv_heads_per_gpu * m.hd * mbytes
    max_len = plan.max_sequence_length
    seqs = plan.prompts_per_rank * exp.rollout.n
    tokens = max(0, kv_bytes) // per_token
    concurrent = min(seqs, tokens // max_len)
    budget.kv = {
        "share_from": "kv_cache_memory_mb" if exp.rollout.kv_cache_memory_mb else "gpu_memory_utilization",
        "vllm_share_bytes": share, "weights_bytes": weights, "profile_activation_bytes": profile,
        "cuda_graphs_bytes": graphs, "kv_cache_bytes": kv_bytes, "kv_bytes_per_token_per_gpu": per_token,
        "kv_bytes_per_token_model": m.kv_bytes_per_token(mbytes), "kv_tokens": tokens, "max_model_len": max_len,
        "sequences_per_engine": seqs, "concurrent_sequences": concurrent,
        "waves": math.ceil(seqs / concurrent) if concurrent else 0,
    }


# ------------------------------------------------------------------------------------------------ judgement
def _fixes(exp: Experiment, plan: RunPlan, phase: str) -> list[str]:
    a, ro = exp.actor, exp.rollout
    out: list[str] = []
    if phase.startswith(ROLLOUT_RANK):  # an engine and nothing else: more GPUs per engine, or a smaller cache
        what = (f"lower rollout.kv_cache_memory_mb (now {ro.kv_cache_memory_mb})" if ro.kv_cache_memory_mb else
                f"lower rollout.gpu_memory_utilization (now {ro.gpu_memory_utilization})"
                if engines.lookup(ro.engine).kv_cache_share else "a smaller batch per rollout rank")
        return [what, f"a larger rollout.tensor_parallel_size (now {ro.tensor_parallel_size})"]
    if phase.startswith("rollout") and engines.lookup(ro.engine).kv_cache_share:
        out.append(f"lower rollout.kv_cache_memory_mb (now {ro.kv_cache_memory_mb})" if ro.kv_cache_memory_mb else
                   f"lower rollout.gpu_memory_utilization (now {ro.gpu_memory_utilization})")
    if not a.fsdp.optimizer_offload and not a.fsdp.param_offload:
        out.append("actor.fsdp.optimizer_offload = true")
    if not a.fsdp.param_offload:
        out.append("actor.fsdp.param_offload = true")
    if loads_reference(exp, plan) and not exp.reference.offload:
        out.append("reference.offload = true")
    if exp.reward_model.enable and not exp.reward_model.offload:
        out.append("reward_model.offload = true")
    if phase == "actor update":
        if not exp.model.gradient_checkpointing:
            out.append("model.gradient_checkpointing = true")
        if plan.actor_micro_batch_per_rank > 1:
            out.append(f"a smaller actor.ppo_micro_batch_size_per_gpu (now {plan.actor_micro_batch_per_rank})")
    if phase == "critic update" and not exp.critic.fsdp.param_offload:
        out.append("critic.fsdp.param_offload = true")
    if phase.startswith("old log-probs") and plan.logprob_micro_batch_per_rank > 1:
        out.append(f"a smaller rollout.micro_batch_size_per_gpu (now {plan.logprob_micro_batch_per_rank})")
    if (not phase.startswith("rollout") and engines.lookup(ro.engine).sleeps and not ro.free_cache_engine
            and plan.placement != "split"):
        out.append("rollout.free_cache_engine = true (vLLM sleeps during the update)")
    out.append(f"more GPUs (resources.nodes, now {plan.nodes}) to shard over")
    return out


_SLURM_MEM_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def slurm_mem_bytes(value: str) -> int | None:
    """A Slurm memory size (``"120G"``, ``"512000"`` = MB) in bytes; None for ``""`` (the partition's default)."""
    if not value:
        return None
    unit = value[-1].upper()
    return int(value[:-1]) * _SLURM_MEM_UNITS[unit] if unit in _SLURM_MEM_UNITS else int(value) * 2**20


def _host_startup(budget: Budget, site: Site, exp: Experiment, plan: RunPlan, m: ModelShape,
                  cm: ModelShape) -> None:
    """Host memory of a rank and of a node while actor, reference and critic load (hpcppo.train.build.load_sharded).

    Each rank reads only its rows of each tensor (safetensors ``get_slice``) straight into its shards: the shards
    stay in host memory when the models compute there (CPU ranks) or FSDP2 offloads them (``param_offload``,
    ``reference.offload``), else they go to the GPU and the host holds one tensor's rows at a time (the largest, the
    embedding or LM head, vocab x hidden, or a layer's fused experts: ``ModelShape.largest_tensor_elems`` / shard,
    counted at 4 B per element). On top of it the rank's process
    (Python, torch, transformers; the CUDA context's host side on GPUs): ``rank process host``. The old path (every
    rank building the whole float32 model before sharding) is shown beside it. ``site.slurm.mem_per_task`` is what
    each rank gets (the job script asks ``--mem`` = that x ranks per node): a start-up that needs more is a problem.
    """
    shard, on_gpu = budget.shard_size, plan.device == "cuda"
    process = int(ASSUMPTIONS["rank process host"].value * GIB)
    loads = [("actor", m.params, exp.actor.fsdp.param_offload)]
    if loads_reference(exp, plan):
        loads.append(("reference", m.params, exp.reference.offload))
    if plan.needs_critic:
        loads.append(("critic", cm.critic_params, exp.critic.fsdp.param_offload))
    rm = reward_model_shape(exp)
    if rm is not None:
        loads.append(("reward model", rm.critic_params, exp.reward_model.offload))
    held = sum(math.ceil(n * MASTER_BYTES / shard) for _, n, offload in loads if offload or not on_gpu)
    slice_bytes = math.ceil(max(m.largest_tensor_elems, cm.largest_tensor_elems) * MASTER_BYTES / shard)
    per_rank = process + held + slice_bytes
    old_per_rank = process + held + max(n for _, n, _ in loads) * MASTER_BYTES
    ranks = plan.ranks_per_node
    limit = slurm_mem_bytes(site.slurm.mem_per_task) if site.scheduler == "slurm" else None
    budget.host = {"per_rank_bytes": per_rank, "per_node_bytes": per_rank * ranks, "ranks_per_node": ranks,
                   "shards_on_host_bytes": held, "largest_slice_bytes": slice_bytes, "process_bytes": process,
                   "old_path_per_rank_bytes": old_per_rank, "old_path_per_node_bytes": old_per_rank * ranks,
                   "limit_per_rank_bytes": limit}
    if limit is not None and per_rank > limit:
        budget.problems.append(
            f"host memory at start-up: {_gib(per_rank)} per rank ({_gib(per_rank * ranks)} per node of {ranks} "
            f"ranks: shards on the host {_gib(held)}, the largest tensor's rows {_gib(slice_bytes)}, the process "
            f"{_gib(process)}) > site.slurm.mem_per_task = {site.slurm.mem_per_task}; raise mem_per_task or use more "
            "ranks per shard group")


def _judge(budget: Budget, exp: Experiment, plan: RunPlan) -> None:
    gpu = budget.gpu
    assert gpu is not None
    for phase in budget.phases:
        over = phase.total - gpu.memory_bytes
        if over > 0:
            big = sorted(phase.items, key=lambda i: -i.bytes)[:3]
            budget.problems.append(
                f"{phase.name} needs {_gib(phase.total)} per GPU, {_gib(over)} over the {gpu.kind}'s "
                f"{_gib(gpu.memory_bytes)} (largest: {', '.join(f'{i.what} {_gib(i.bytes)}' for i in big)}); "
                f"change: {'; or '.join(_fixes(exp, plan, phase.name))}")
    kv = budget.kv
    if kv:
        explicit = exp.rollout.kv_cache_memory_mb
        if kv["kv_tokens"] < kv["max_model_len"] and explicit:
            budget.problems.append(
                f"rollout.kv_cache_memory_mb = {explicit} holds {kv['kv_tokens']} tokens, fewer than one sequence of "
                f"max_model_len {kv['max_model_len']} ({kv['kv_bytes_per_token_per_gpu']} bytes per token per GPU); "
                f"change: raise it to at least {math.ceil(kv['max_model_len'] * kv['kv_bytes_per_token_per_gpu'] / 2**20)},"
                f" or set it to 0 (use rollout.gpu_memory_utilization)")
        elif kv["kv_tokens"] < kv["max_model_len"]:
            budget.problems.append(
                f"vLLM's share ({_gib(kv['vllm_share_bytes'])} = rollout.gpu_memory_utilization "
                f"{exp.rollout.gpu_memory_utilization} x {_gib(gpu.memory_bytes)}) leaves {_gib(max(0, kv['kv_cache_bytes']))}"
                f" of KV cache after {_gib(kv['weights_bytes'])} of weights: {kv['kv_tokens']} tokens, fewer than one "
                f"sequence of max_model_len {kv['max_model_len']}; change: raise rollout.gpu_memory_utilization, or "
                f"rollout.tensor_parallel_size (now {plan.tensor_parallel_size}), or shorten data.max_response_length")
        elif kv["concurrent_sequences"] < kv["sequences_per_engine"]:
            budget.warnings.append(
                f"vLLM's KV cache holds {kv['concurrent_sequences']} of the {kv['sequences_per_engine']} sequences per "
                f"engine at max_model_len {kv['max_model_len']}: generation runs in {kv['waves']} waves (raise "
                f"rollout.gpu_memory_utilization or rollout.tensor_parallel_size for fewer)")
