"""verl's mixture-of-experts keys in hpcppo terms (a part of the table, :mod:`hpcppo.verl.names.table`). No torch.

hpcppo trains a mixture-of-experts model as any other: every rank holds all of a layer's experts, and FSDP2 shards
their weights like the rest; the router is trained with the model and routes each token itself, in the trainer
and in the engine. So verl's MoE keys are kept where their value is what hpcppo does (no expert parallelism, no
routing replay, a router that trains), and refused otherwise: expert parallelism is not in hpcppo's scope. The keys
and their defaults: ``verl/trainer/config/_generated_ppo_trainer.yaml`` and
``_generated_ppo_megatron_trainer.yaml`` at verl b178a3c; ``RouterReplayConfig`` (modes disabled, R2, R3) and
``RolloutConfig.expert_parallel_size`` in ``verl/workers/config/actor.py`` and ``rollout.py``.
"""

from __future__ import annotations

from hpcppo.verl.names.convert import A, MODEL, R, REF, Entry, ign, uns

__all__ = ["moe_entries"]

NO_EP = "expert parallelism is not in hpcppo's scope: every rank holds all experts, FSDP2 shards them"
NO_REPLAY = ("MoE routing replay (R2: the trainer's recorded routes, R3: the rollout's) is not in hpcppo: the trainer "
             "routes each token itself")
ROUTER_TRAINS = "hpcppo trains the router with the rest of the model"


def _megatron_ep(section: str) -> list[Entry]:
    """``<section>megatron.expert_*``: kept at verl's defaults (1, null), refused otherwise (more precise than the
    ``megatron.*`` row that refuses the rest of verl's Megatron options)."""
    return [uns(section + "megatron.expert_model_parallel_size", NO_EP, ok=(1,)),
            uns(section + "megatron.expert_tensor_parallel_size", NO_EP, ok=(None, 1))]


def _router_replay(section: str) -> list[Entry]:
    return [uns(section + "router_replay.mode", NO_REPLAY, ok=("disabled",)),
            ign(section + "router_replay", "only with router_replay.mode R2 or R3", prefix=True)]


def moe_entries() -> list[Entry]:
    """The table's rows for verl's mixture-of-experts keys."""
    return [
        *_megatron_ep(A), *_router_replay(A),
        *_megatron_ep(REF), *_router_replay(REF),
        uns(R + "expert_parallel_size", NO_EP, ok=(1,)),
        uns(R + "enable_rollout_routing_replay", NO_REPLAY, ok=(False,)),
        *_megatron_ep("critic."),
        *_megatron_ep("reward_model."),
        uns(MODEL + "override_config.moe_config.freeze_moe_router", ROUTER_TRAINS, ok=(False,)),
        uns("critic.model.override_config.moe_config.freeze_moe_router", ROUTER_TRAINS, ok=(False,)),
    ]
