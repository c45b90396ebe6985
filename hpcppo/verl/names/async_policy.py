"""verl's asynchronous recipes' keys in hpcppo terms (a part of the table, :mod:`hpcppo.verl.names.table`). No torch.

verl b178a3c has two recipes that generate on GPUs of their own (``actor_rollout_ref.hybrid_engine=False``, which
verl's own trainer refuses: ``assert self.hybrid_engine`` in ``RayPPOTrainer.__init__``):

- ``verl.experimental.one_step_off_policy.main_ppo``: generation of step k + 1 overlaps training on step k
  (``OneStepOffRayTrainer``): samples one policy version old, hpcppo's ``rollout.max_staleness = 1``;
- ``verl.experimental.fully_async_policy.fully_async_main``: a rollouter streams samples into a queue;
  ``FullyAsyncRollouter.set_max_required_samples`` lets it run ``(1 + staleness_threshold) x
  trigger_parameter_sync_step x require_batches x ppo_mini_batch_size`` samples ahead of a weight sync, and the
  trainer (``FullyAsyncTrainer``) syncs after ``trigger_parameter_sync_step`` local updates of ``require_batches``
  mini-batches. With one update per sync and a whole ``staleness_threshold`` k, a sample is at most k versions old:
  hpcppo's ``rollout.max_staleness = k`` with a step of ``require_batches x ppo_mini_batch_size`` prompts. A fraction,
  more updates per sync and ``partial_rollout`` (a generation interrupted by a sync and continued with new weights)
  have no hpcppo counterpart.

Both recipes give their rollout its own resource pool, ``rollout.nnodes x rollout.n_gpus_per_node`` GPUs beside the
trainer's ``trainer.nnodes x trainer.n_gpus_per_node`` (``create_resource_pool_manager`` in fully_async_main.py and
one_step_off_policy/main_ppo.py): the importer turns the two pools into one allocation (hpcppo.verl.importer's
``_split_resources``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcppo.verl.names.convert import ARR, Entry, Ignored, Untranslatable, freq, ign, m, uns, whole_number

__all__ = ["VERL_DOC", "async_entries", "is_split", "split_layout", "step_prompts", "ASYNC", "NODE_GPUS", "RECIPE_DEFAULTS"]

ASYNC = "async_training."
# The GPUs of a node a verl run has unless trainer.n_gpus_per_node says otherwise (verl's default, 8): two pools
# on the same nodes fit when their GPUs together do not exceed it.
NODE_GPUS = 8
SPEED = "speed only: the samples and the updates are the same"


# The recipes' own defaults where they differ from verl's trainer (their config/*_ppo_trainer.yaml at b178a3c; the
# recipes' workers assert hybrid_engine is false). An input that leaves them unset ran with these.
RECIPE_DEFAULTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "one_step_off": ((ARR + "hybrid_engine", False), ("rollout.nnodes", 1), ("rollout.n_gpus_per_node", 8),
                     ("algorithm.rollout_correction.bypass_mode", True)),
    "fully_async": ((ARR + "hybrid_engine", False), ("rollout.nnodes", 1), ("rollout.n_gpus_per_node", 8),
                    (ASYNC + "staleness_threshold", 0.1), (ASYNC + "trigger_parameter_sync_step", 4),
                    (ASYNC + "require_batches", 1), (ASYNC + "partial_rollout", True),
                    (ASYNC + "use_rollout_log_probs", True)),
}


def is_split(ctx: Mapping[str, Any]) -> bool:
    """Whether verl's settings run the rollout on GPUs of its own (the asynchronous recipes)."""
    return ctx.get(ARR + "hybrid_engine") is False


def split_layout(ctx: Mapping[str, Any]) -> tuple[str, int, int, int]:
    """(how, nodes, GPUs per node, rollout nodes or rollout GPUs per node) of the allocation holding verl's trainer
    and rollout pools: ``per-node`` (the same nodes, each holding both pools' GPUs) or ``whole-nodes`` (the
    rollout's nodes after the trainer's); ``Untranslatable`` when the pools fit neither."""
    tn, tg = whole_number(ctx.get("trainer.nnodes"), 1), whole_number(ctx.get("trainer.n_gpus_per_node"), 8)
    rn, rg = whole_number(ctx.get("rollout.nnodes"), 1), whole_number(ctx.get("rollout.n_gpus_per_node"), 8)
    if tn == rn and tg + rg <= NODE_GPUS:
        return "per-node", tn, tg + rg, rg
    if tg == rg:
        return "whole-nodes", tn + rn, tg, rn
    raise Untranslatable(f"the trainer's {tn} x {tg} GPUs and the rollout's {rn} x {rg} (trainer.nnodes x "
                         f"n_gpus_per_node, rollout.nnodes x n_gpus_per_node) fit neither of hpcppo's splits: the "
                         f"same nodes with at most {NODE_GPUS} GPUs each, or whole nodes of as many GPUs")


def _placement(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value is True:
        return "colocated"
    if value is False:
        return "split"
    raise Untranslatable(f"{value!r}: verl takes true (generation on the trainer's GPUs) or false (its recipes' own "
                         f"rollout GPUs)")


def _rollout_gpus(value: Any, ctx: Mapping[str, Any]) -> Any:
    if not is_split(ctx):
        raise Ignored("verl reads it only with hybrid_engine=False (its asynchronous recipes)")
    how, _, _, rollout = split_layout(ctx)
    if how != "per-node":
        raise Ignored("the rollout takes whole nodes here (rollout.nnodes -> resources.rollout_nodes)")
    return rollout


def _rollout_nodes(value: Any, ctx: Mapping[str, Any]) -> Any:
    if not is_split(ctx):
        raise Ignored("verl reads it only with hybrid_engine=False (its asynchronous recipes)")
    how, _, _, rollout = split_layout(ctx)
    if how != "whole-nodes":
        raise Ignored("the rollout shares the trainer's nodes here (rollout.n_gpus_per_node -> "
                      "resources.rollout_ranks_per_node)")
    return rollout


def _staleness(value: Any, ctx: Mapping[str, Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise Untranslatable(f"{value!r}: verl takes a number >= 0")
    if float(value) != int(value):
        raise Untranslatable(f"{value:g} is a fraction of a sync period's samples generated ahead; hpcppo bounds "
                             f"staleness in whole policy versions (rollout.max_staleness): use 0, 1, 2 ...")
    return int(value)


def step_prompts(ctx: Mapping[str, Any]) -> int:
    """Prompts per fully async update, hpcppo's step: ``require_batches x ppo_mini_batch_size``
    (``FullyAsyncRollouter.required_samples``)."""
    return whole_number(ctx.get(ASYNC + "require_batches"), 1) * whole_number(ctx.get(ARR + "actor.ppo_mini_batch_size"),
                                                                              256)


def _total_steps(value: Any, ctx: Mapping[str, Any]) -> Any:
    total = whole_number(value, 0)
    if not total:
        raise Untranslatable(f"{value!r}: verl takes a count of prompts")
    return max(1, total // step_prompts(ctx))


def async_entries() -> list[Entry]:
    """The table's rows for the keys of verl's one-step-off and fully async recipes."""
    return [
        m(ARR + "hybrid_engine", "rollout.placement", "false (verl's asynchronous recipes: the rollout on GPUs of its "
                                                      "own) -> split; true -> colocated", _placement),
        m("rollout.n_gpus_per_node", "resources.rollout_ranks_per_node",
          "with hybrid_engine=False, when the rollout shares the trainer's nodes (trainer.nnodes = rollout.nnodes, "
          "at most 8 GPUs a node together); resources.gpus_per_node becomes the sum", _rollout_gpus, context=True),
        m("rollout.nnodes", "resources.rollout_nodes",
          "with hybrid_engine=False, when the rollout takes whole nodes of trainer.n_gpus_per_node GPUs; "
          "resources.nodes becomes trainer.nnodes + rollout.nnodes", _rollout_nodes, context=True),
        m("rollout.total_epochs", "trainer.total_epochs", "the fully async recipe's epochs"),
        m(ASYNC + "staleness_threshold", "rollout.max_staleness",
          "whole numbers k (k versions behind, with trigger_parameter_sync_step = 1); a fraction is refused",
          _staleness),
        uns(ASYNC + "trigger_parameter_sync_step", "hpcppo broadcasts weights after every update (a step of "
                                                   "require_batches x ppo_mini_batch_size prompts)", ok=(1,)),
        m(ASYNC + "require_batches", "trainer.train_batch_size",
          "x actor_rollout_ref.actor.ppo_mini_batch_size prompts per step (a weight sync per step)",
          lambda v, ctx: step_prompts({**ctx, ASYNC + "require_batches": v}), context=True),
        m("rollout.total_rollout_steps", "trainer.total_steps", "prompts in all / (require_batches x "
                                                                "ppo_mini_batch_size): the fully async recipe's "
                                                                "total_train_steps", _total_steps, context=True),
        m("rollout.test_freq", "trainer.test_freq", "validate every N weight syncs (steps here); <= 0 -> -1 (never)",
          freq),
        uns(ASYNC + "partial_rollout", "hpcppo finishes every generation with the weights it started with: no "
                                       "interrupted rollouts continued with new weights", ok=(False,)),
        m(ASYNC + "use_rollout_log_probs", "algorithm.rollout_correction.bypass_mode",
          "the engine's log-probs are the old log-probs"),
        uns(ASYNC + "compute_prox_log_prob", "hpcppo computes no proximal log-probs beside the rollout's",
            ok=(False,)),
        uns(ASYNC + "compute_advantage_in_rollout", "advantages are computed by the trainers", ok=(False,)),
        ign(ASYNC + "use_trainer_do_validate", "validation runs where hpcppo runs it (the trainers)"),
        ign(ASYNC + "parallel_validate_and_rollout", SPEED),
        ign(ASYNC + "checkpoint_engine", "verl's weight-transfer engine; hpcppo broadcasts weights over its own "
                                         "bridge: " + SPEED, prefix=True),
        ign(ARR + "checkpoint_engine", "verl's weight-transfer engine: " + SPEED, prefix=True),
        ign("data.gen_batch_size", "the fully async recipe's prompts per request (1): " + SPEED),
        ign("filter", "the fully async recipe's default filter keeps every trajectory", prefix=True),
        ign("super_sample", "the fully async recipe's default keeps every trajectory", prefix=True),
    ]


VERL_DOC = """**Asynchronous training** (verl's recipes `verl.experimental.one_step_off_policy.main_ppo` and
`verl.experimental.fully_async_policy.fully_async_main`, both with `actor_rollout_ref.hybrid_engine=False`) becomes
`rollout.placement = "split"` (docs/placement.md): verl's trainer pool (`trainer.nnodes x n_gpus_per_node`) and
rollout pool (`rollout.nnodes x n_gpus_per_node`) become one allocation, the rollout sharing the trainer's nodes
(`resources.rollout_ranks_per_node`, when both pools have the same nodes and at most 8 GPUs a node together) or taking
whole nodes after them (`resources.rollout_nodes`, when both have the same GPUs per node); other shapes are refused in
one line. `tensor_model_parallel_size = k` makes engines of k rollout ranks of one node. **One-step-off** generates step k + 1 while step k trains: `rollout.max_staleness = 1`, and the recipe's
`algorithm.rollout_correction.bypass_mode = true` (its config/one_step_off_ppo_trainer.yaml). **Fully async**: the
rollouter may run `(1 + staleness_threshold) x trigger_parameter_sync_step x require_batches x ppo_mini_batch_size`
samples ahead of a weight sync (`FullyAsyncRollouter.set_max_required_samples`), the trainer syncs after
`trigger_parameter_sync_step` updates of `require_batches x ppo_mini_batch_size` prompts (`FullyAsyncTrainer`). With
`trigger_parameter_sync_step = 1` and a whole `staleness_threshold = k`, a sample is at most k policy versions old:
`rollout.max_staleness = k`, a step of `require_batches x ppo_mini_batch_size` prompts (`trainer.train_batch_size`;
verl's `data.train_batch_size` is then not the step), `rollout.total_rollout_steps` prompts in all /(that step) =
`trainer.total_steps`. Refused, one line each: a fractional `staleness_threshold` (verl's default 0.1: a share of a
sync period generated ahead, where hpcppo counts whole versions), `trigger_parameter_sync_step` other than 1 (several
updates per weight sync), `partial_rollout = true` (verl's default: a generation interrupted at a sync continues with
the new weights, so one sample carries two versions; hpcppo finishes a generation with the weights it began with),
`compute_prox_log_prob`. The recipes' defaults apply where the input leaves a key unset. **prime-rl**'s
`max_async_level` (its docs' `async_level` k: inference may generate from a policy up to k steps behind the trainer;
default 2) is `rollout.max_staleness`, and so is verl's integer `staleness_threshold` above; prime-rl runs its
inference and trainer as separate jobs, hpcppo in one allocation. One difference in kind: verl's rollouter and
prime-rl's inference generate with whatever weights they hold within the bound (how old depends on timing), while
hpcppo generates step `t` with step `t - max_staleness`'s weights exactly (`docs/rollout-phase.md`, "Versions and
the fixed lag"): the same bound, at the bound, and a run that repeats itself and resumes exactly. Validation runs
on the rollout side (verl b178a3c, `verl/experimental/fully_async_policy/fully_async_rollouter.py`,
`FullyAsyncRollouter.update_param_version`, validates after a parameter sync every `rollout.test_freq` versions
unless `async_training.use_trainer_do_validate`; hpcppo's rollout ranks generate the validation set with the weights
after the step's update, and the trainer ranks score it).
"""
