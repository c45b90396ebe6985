"""LoRA in the memory plan: how many parameters the adapters add and train (no torch).

With ``[actor.lora]`` / ``[critic.lora]`` (hpcppo.models.lora) the base weights stay in the model, frozen: their
float32 shards are still held, but FSDP2 makes no gradient for them and AdamW holds no moments for them; the adapters
(``r x (in + out)`` per adapted linear layer) get all three. The actor's reference is the actor with its adapters
disabled: no reference copy is loaded.
"""

from __future__ import annotations

from hpcppo.config.experiment import Experiment
from hpcppo.config.lora import ALL_LINEAR, LoraSection
from hpcppo.config.plan import RunPlan
from hpcppo.sizing.catalog import ModelShape

__all__ = ["adapter_params", "loads_reference", "lora_note"]


def loads_reference(exp: Experiment, plan: RunPlan) -> bool:
    """Whether the job loads a reference copy: not with the actor's LoRA (hpcppo.train.build: ``ref_in_actor``)."""
    return plan.needs_reference and not exp.actor.lora.enabled


def _linear_shapes(m: ModelShape, intermediate: int) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each linear layer of one decoder layer of a Llama/Qwen2-style model whose MLP (or
    shared expert) has ``intermediate`` features; none for the MLP when it is 0."""
    h, hd, i = m.hidden, m.hd, intermediate
    mlp = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)} if i else {}
    return {"q_proj": (h, m.heads * hd), "k_proj": (h, m.kv_heads * hd), "v_proj": (h, m.kv_heads * hd),
            "o_proj": (m.heads * hd, h), **mlp}


def adapter_params(m: ModelShape, lora: LoraSection) -> int:
    """Parameters of ``lora``'s adapters on model ``m`` (0 when LoRA is off): lora_A ``[r, in]`` and lora_B
    ``[out, r]`` on every targeted linear layer of every decoder layer. In a mixture of experts' expert layers the
    routed experts are fused 3-D parameters in transformers 5 (``mlp.experts.gate_up_proj``): peft 0.21 adapts them
    and the router too (``ParamWrapper``, peft/tuners/lora/layer.py), which is not counted here (``lora_note`` says
    so); attention and a shared expert's projections are."""
    if not lora.enabled:
        return 0
    moe_layers = m.moe_layers if m.is_moe else 0

    def per_layer(intermediate: int) -> int:
        shapes = _linear_shapes(m, intermediate)
        names = set(shapes) if lora.target_modules == [ALL_LINEAR] else set(lora.target_modules) & set(shapes)
        return sum(lora.rank * sum(shapes[name]) for name in names - set(lora.exclude_modules))

    return (m.layers - moe_layers) * per_layer(m.intermediate) + moe_layers * per_layer(m.shared_expert_intermediate)


def lora_note(exp: Experiment, plan: RunPlan, m: ModelShape, cm: ModelShape) -> str:
    """What ``hpcppo plan`` says about LoRA after the model line ("" without it)."""
    parts = []
    for role, lora, shape in (("actor", exp.actor.lora, m), ("critic", exp.critic.lora, cm)):
        if lora.enabled and (role == "actor" or plan.needs_critic):
            experts = " (not counted: adapters peft puts on the fused experts and the router)" if shape.is_moe else ""
            parts.append(f"LoRA on the {role}: rank {lora.rank}, {adapter_params(shape, lora) / 1e6:.1f}M adapter "
                         f"parameters trained{experts}, the base frozen")
    if exp.actor.lora.enabled and plan.needs_reference:
        parts.append("the reference is the actor without its adapters (no copy)")
    return "".join(f"; {p}" for p in parts)
