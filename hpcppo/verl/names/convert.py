"""verl's keys in hpcppo terms, part 1: the :class:`Entry` of the table and the value translations its ``map``
entries use (``save_freq = 0`` -> ``-1`` ...), each citing the verl code it follows (verl b178a3c).
:mod:`hpcppo.verl.names.table` holds the entries, :mod:`hpcppo.verl.names` the lookups. No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Entry", "Untranslatable", "Ignored", "VerlNameWarning", "Convert", "MAP", "NOT_VERL", "IGNORED",
           "UNSUPPORTED", "VERL_COMMIT", "whole_number", "run_name", "REWARD_KWARGS", "ARR", "A", "R", "REF", "MODEL",
           "m", "ign", "uns"]

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
MAP, NOT_VERL, IGNORED, UNSUPPORTED = "map", "not-verl", "ignored", "unsupported"


class Untranslatable(ValueError):
    """This value of a mapped key has no hpcppo counterpart (the message says why)."""


class Ignored(ValueError):
    """This value of a mapped key needs no hpcppo setting (the message says why)."""


class VerlNameWarning(UserWarning):
    """A verl key name was accepted and translated (``-o actor_rollout_ref.actor.clip_ratio=0.2``)."""


Convert = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Entry:
    verl: str
    kind: str
    hpcppo: str = ""
    note: str = ""
    convert: Convert | None = None
    context: bool = False  # convert reads other verl keys (a lone -o cannot be translated)
    ok: tuple[Any, ...] = ()  # unsupported: values that match what hpcppo does
    prefix: bool = False  # covers every key below ``verl``
    section: str = field(default="", compare=False)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is one of ``ok`` (1 and 1.0 alike; True is not 1)."""
        return any(value is ok if isinstance(value, bool) or isinstance(ok, bool) else value == ok for ok in self.ok)


def m(verl: str, hpcppo: str, note: str = "", convert: Convert | None = None, context: bool = False) -> Entry:
    """A verl key translated to an hpcppo key (the tables' rows: ``table``, ``reward``)."""
    return Entry(verl, MAP, hpcppo, note, convert, context)


def ign(verl: str, note: str, prefix: bool = False) -> Entry:
    """A verl key hpcppo does without, giving the same result."""
    return Entry(verl, IGNORED, note=note, prefix=prefix)


def uns(verl: str, note: str, ok: tuple[Any, ...] = (), prefix: bool = False) -> Entry:
    """A verl key hpcppo cannot honour, except for the values ``ok``."""
    return Entry(verl, UNSUPPORTED, note=note, ok=ok, prefix=prefix)




ARR = "actor_rollout_ref."
A, R, REF, MODEL = ARR + "actor.", ARR + "rollout.", ARR + "ref.", ARR + "model."
FSDP2 = "hpcppo always shards with FSDP2 (fully_shard)"
NO_RAY = "hpcppo runs one process per GPU under Slurm, without Ray"
PERF_VLLM = "a vLLM tuning knob hpcppo does not expose; vLLM's default applies (speed and memory only)"
LOGGING = "hpcppo records every metric in the run's HDF5 log (hpcppo metrics export/plot)"
ONE_TOKENIZER = "hpcppo uses one tokenizer for every model (model.tokenizer_path)"


# ------------------------------------------------------------------------------------------------ value translation

def dtype(value: Any, ctx: Mapping[str, Any]) -> str:
    names = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
             "fp32": "float32", "float32": "float32", "float": "float32"}
    if str(value) not in names:
        raise Untranslatable(f"{value!r} is not a dtype hpcppo knows (bf16, fp16, fp32)")
    return names[str(value)]


def freq(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl saves/validates only when freq > 0 (ray_trainer.py: `save_freq > 0 and (is_last_step or ...)`): 0 and
    # -1 both mean never; hpcppo's -1 means never, 0 would mean "at the end" for save_every.
    return -1 if isinstance(value, int) and not isinstance(value, bool) and value <= 0 else value


def files(value: Any, ctx: Mapping[str, Any]) -> Any:
    return [value] if isinstance(value, str) else value


def engine(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value in ("vllm", "hf"):
        return value
    raise Untranslatable(f"rollout engine {value!r}: hpcppo has vllm and hf (use vllm)")


def whole_number(value: Any, default: int) -> int:
    """``value`` as a positive integer when it is one (``2``, ``"2"``), else ``default``: a value that is not a
    count (``"1;touch x"``, ``$NNODES`` left as written) is reported where its key is translated, not here."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if value > 0 else default
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isascii() and text.isdigit() and 0 < len(text) <= 9 and int(text) > 0 else default


def _world(ctx: Mapping[str, Any]) -> int:
    return whole_number(ctx.get("trainer.nnodes"), 1) * whole_number(ctx.get("trainer.n_gpus_per_node"), 8)


def per_gpu(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl divides the global micro-batch by the data-parallel size (fsdp_workers.py: ppo_micro_batch_size //=
    # device_mesh.size() // ulysses_sequence_parallel_size) and uses it as the per-GPU one.
    if value is None:
        raise Ignored("null: the *per_gpu key decides")
    world = _world(ctx)
    if not isinstance(value, int) or value % world:
        raise Untranslatable(f"{value} samples over {world} GPUs (trainer.nnodes x n_gpus_per_node) is not a whole "
                             f"number per GPU; give the *per_gpu key instead")
    return value // world


def null_is_unlimited(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl's tool agent loop stops on a turn limit only when it is set (tool_agent_loop.py, ToolAgentLoop:
    # `if self.max_assistant_turns and ...`): null is no limit, hpcppo's 0.
    return 0 if value is None else value


MULTI_TURN_ENABLE = "actor_rollout_ref.rollout.multi_turn.enable"


def with_multi_turn(inner: Convert | None = None) -> Convert:
    """A multi_turn.* key that acts only with ``multi_turn.enable`` true (verl builds its tool agent loop only then):
    in an import where enable is not true it is ignored, not written (a composed verl YAML lists them all). A lone
    ``-o`` (no context) is translated as it is."""
    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        if ctx and ctx.get(MULTI_TURN_ENABLE) is not True:
            raise Ignored("only with multi_turn.enable=true, which the input does not set")
        return inner(value, ctx) if inner else value
    return convert


def tool_format(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl's tool parsers (experimental/agent_loop/tool_parser.py): hermes, gpt-oss; hpcppo has hermes and compact.
    if value == "hermes":
        return value
    raise Untranslatable(f"tool-call format {value!r}: hpcppo parses hermes (and its own compact format)")


def none_is_default(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value is None:
        raise Ignored("null: hpcppo's default applies")
    return value


def warmup(value: Any, ctx: Mapping[str, Any]) -> Any:
    # Both count training steps: verl steps its scheduler once per update_actor/update_critic (fsdp_workers.py).
    if value is None or (isinstance(value, int) and value < 0):
        raise Ignored("-1: verl then uses lr_warmup_steps_ratio (see that key)")
    return value


def warmup_ratio(key: str) -> Convert:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        # fsdp_workers.py (_build_model_optimizer): the ratio applies only when lr_warmup_steps < 0 (default -1).
        steps = ctx.get(key, -1)
        if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0:
            raise Ignored(f"verl uses {key}={steps} instead (the ratio only when lr_warmup_steps is -1)")
        return value
    return convert


def clip_ratio(value: Any, ctx: Mapping[str, Any]) -> Any:
    # At verl b178a3c ActorConfig (verl/workers/config/actor.py) sets clip_ratio_low = clip_ratio_high = 0.2, not
    # None, and compute_policy_loss_vanilla (verl/trainer/ppo/core_algos.py) clips with those, falling back to
    # clip_ratio only where one is None. verl's ppo_trainer.yaml has set both to 0.2 since 3a27a9864 (2025-04-04,
    # the DAPO integration); before it there was only clip_ratio, which set both bounds.
    low, high = ctx.get(A + "clip_ratio_low", 0.2), ctx.get(A + "clip_ratio_high", 0.2)
    if low is not None and high is not None:
        raise Ignored(f"verl clips with clip_ratio_low = {low} and clip_ratio_high = {high} (both default to 0.2 in "
                      f"verl's ActorConfig): clip_ratio alone changes nothing there; set clip_ratio_low/high")
    return value


def schedule(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value is None:
        raise Ignored("null: lr_scheduler_type decides")
    if value in ("constant", "cosine"):
        return value
    raise Untranslatable(f"{value!r}: hpcppo's schedules are constant, cosine and linear")


def keep(value: Any, ctx: Mapping[str, Any]) -> Any:
    return 0 if value is None or value == 0 else value  # verl: null keeps all; hpcppo: 0 keeps all


def total_steps(value: Any, ctx: Mapping[str, Any]) -> Any:
    return 0 if value is None else value


def resume(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value in ("auto", "disable"):
        return {"auto": "auto", "disable": "never"}[value]
    raise Untranslatable(f"resume_mode {value!r}: hpcppo resumes from its run directory (auto) or not at all "
                         f"(disable); `hpcppo rollback RUN --to STEP` picks a checkpoint")


NAME_MAX = 64


def run_name(value: Any, ctx: Mapping[str, Any] | None = None) -> str:
    """A verl experiment name as an hpcppo ``name`` (letters, digits, ``_.-``; other characters become ``-``)."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(value)).strip("-._")
    text = re.sub(r"\.{2,}", ".", text)[:NAME_MAX].rstrip("-._")
    if not text:
        raise Untranslatable(f"{value!r} has no letters or digits for a run name")
    return text


def reward_path(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value in (None, ""):
        raise Ignored("null: verl scores by data_source, as hpcppo's data.reward_fn = \"auto\" does")
    name = ctx.get("custom_reward_function.name") or "compute_score"
    return f"{value}:{name}"


def reward_name(value: Any, ctx: Mapping[str, Any]) -> Any:
    if not ctx.get("custom_reward_function.path"):
        raise Ignored("without custom_reward_function.path verl ignores it too")
    return reward_path(ctx["custom_reward_function.path"], ctx)


REWARD_KWARGS = "custom_reward_function.reward_kwargs"


def reward_kwargs(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl binds them to the custom function only (get_custom_reward_fn in verl/trainer/ppo/reward.py: a partial
    # over reward_fn_config.reward_kwargs); without a path it scores with default_compute_score and drops them.
    if not isinstance(value, dict):
        raise Untranslatable(f"{value!r}: verl takes a mapping of keyword arguments")
    if not value:
        raise Ignored("{}: no keyword arguments")
    if not ctx.get("custom_reward_function.path"):
        raise Ignored("without custom_reward_function.path verl scores with default_compute_score and does not "
                      "pass them")
    return value


def critic_warmup(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl counts steps from 1 and updates the actor once `critic_warmup <= global_steps` (ray_trainer.py): N means
    # N - 1 critic-only steps. hpcppo skips the actor while `step <= warmup_updates` (train/trainer.py).
    return max(0, value - 1) if isinstance(value, int) and not isinstance(value, bool) else value


def top_k(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl's HF rollout passes max(0, top_k) "to be compatible with vllm" (hf_rollout.py): 0 and -1 both mean off.
    return -1 if value == 0 else value


def hsdp(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl's create_device_mesh: fsdp_size < 0 or >= world size -> one FSDP dimension over every GPU; otherwise
    # (replicate, shard) with shard = fsdp_size.
    gpus = whole_number(ctx.get("trainer.n_gpus_per_node"), 8)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise Untranslatable(f"fsdp_size {show_value(value)}: verl takes an integer (-1: every GPU)")
    if value is None or value < 0 or value >= _world(ctx):
        return "off"
    if value == gpus:
        return "on"
    raise Untranslatable(f"fsdp_size {value}: hpcppo shards within a node (hsdp on) or over every GPU (off), "
                         f"not over groups of {value}")


def show_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if value == {}:
        return "{}"
    return str(value)


def logger(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl's Tracking (verl/utils/tracking.py) takes one name or a list; hpcppo's check names the trackers it lacks.
    return [value] if isinstance(value, str) else value


def project_name(value: Any, ctx: Mapping[str, Any]) -> Any:
    # verl passes project_name to every tracker (and to default_local_dir); hpcppo only to wandb.
    loggers = logger(ctx.get("trainer.logger", []), ctx) or []
    if "wandb" not in loggers:
        raise Ignored("wandb's project in hpcppo, and trainer.logger does not name wandb here")
    return value


# ------------------------------------------------------------------------------------------------ token budgets
# verl's dynamic micro-batches (use_dynamic_bsz: micro-batches of at most *_max_token_len_per_gpu tokens,
# verl/utils/seqlen_balancing.py rearrange_micro_batches) are hpcppo's <section>.max_tokens_per_micro_batch (0 =
# fixed-size micro-batches). Defaults as in verl's _generated_ppo_trainer.yaml at b178a3c: the rollout's, the
# reference's and the critic's flags follow actor.use_dynamic_bsz; the actor's budget and the log-prob budgets
# (which follow the actor's) are 16384 tokens, the critic's 32768, and its forward budget follows its
# ppo_max_token_len_per_gpu. The budget is per GPU there and here (ulysses_sequence_parallel_size is 1 here).
DYNAMIC_BSZ = A + "use_dynamic_bsz"
ACTOR_TOKENS = A + "ppo_max_token_len_per_gpu"
CRITIC_TOKENS = "critic.ppo_max_token_len_per_gpu"


def dynamic_on(flag_key: str, ctx: Mapping[str, Any]) -> bool:
    """Whether verl runs ``flag_key``'s role with dynamic micro-batches (an unset flag follows the actor's)."""
    return ctx.get(flag_key, ctx.get(DYNAMIC_BSZ, False)) is True


def _budget(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Untranslatable(f"{key}={value!r} is not a positive number of tokens")
    return value


def dynamic_bsz(budget_key: str, default: int | str) -> Convert:
    """A ``*use_dynamic_bsz`` flag: false -> fixed-size micro-batches (hpcppo's default); true -> the budget that
    ``budget_key`` gives (``default``: a number, or the key whose value verl's default copies)."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        if value is False:
            raise Ignored("false: fixed-size micro-batches, hpcppo's default (max_tokens_per_micro_batch = 0)")
        if value is not True:
            raise Untranslatable(f"{value!r} is not true or false")
        fallback = ctx.get(default, 16384 if default == ACTOR_TOKENS else 32768) if isinstance(default, str) \
            else default
        return _budget(ctx.get(budget_key, fallback), budget_key)

    return convert


def token_budget(flag_key: str) -> Convert:
    """A ``*max_token_len_per_gpu`` budget: the tokens per micro-batch where ``flag_key`` is on, else ignored (as
    verl ignores it)."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        if not dynamic_on(flag_key, ctx):
            raise Ignored(f"only with {flag_key}=true, as in verl (fixed-size micro-batches otherwise)")
        return _budget(value, flag_key.rpartition(".")[0] + "...")

    return convert


def lora_setting(rank_key: str, inner: Convert | None = None) -> Convert:
    """A LoRA setting, translated only when ``rank_key`` (verl's ``lora_rank``) is above 0: verl builds the adapter
    from it only then (fsdp_workers.py: ``_is_lora``, ``_build_model_optimizer``)."""
    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        if whole_number(ctx.get(rank_key), 0) <= 0:
            raise Ignored("only with lora_rank > 0 (verl builds no adapter otherwise)")
        return inner(value, ctx) if inner is not None else value

    return convert


def lora_modules(value: Any, ctx: Mapping[str, Any]) -> Any:
    """verl's ``target_modules`` / ``exclude_modules`` as peft takes them: ``"all-linear"``, a list of layer names,
    or null (none excluded); any other string is a regular expression over module paths in peft."""
    if value is None:
        raise Ignored("null: no module excluded")
    if isinstance(value, str):
        if value == "all-linear":
            return [value]
        raise Untranslatable(f"{value!r}: peft reads a string other than \"all-linear\" as a regular expression over "
                             f"module paths; give the layer names as a list (e.g. [q_proj,v_proj])")
    return list(value)


def without_lora(rank_key: str, adapter_key: str) -> Convert:
    """A setting of verl's reference worker: with the actor's LoRA verl builds none (main_ppo.py: ``ref_in_actor =
    lora_rank > 0 or lora_adapter_path is not None``; ``need_reference_policy(config) and not ref_in_actor``), the
    actor with its adapters disabled is the reference, and the setting does nothing there as here."""
    def convert(value: Any, ctx: Mapping[str, Any]) -> Any:
        if whole_number(ctx.get(rank_key), 0) > 0 or ctx.get(adapter_key) is not None:
            raise Ignored("with LoRA verl loads no reference model (ref_in_actor): the actor without its adapters")
        return value

    return convert
