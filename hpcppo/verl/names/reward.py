"""verl's ``reward_model.*`` and ``reward_manager.*`` keys in hpcppo terms: the rows of the import table
(:mod:`hpcppo.verl.names.table`) for a reward model and the DAPO reward manager. No torch here.

What verl does with them at b178a3c (verl/trainer/config/reward_model/dp_reward_loop.yaml is the default
``reward_model`` group, so ``use_reward_loop`` is true unless a script says otherwise):

- the reward loop (verl/experimental/reward_loop/reward_loop.py, ``RewardLoopManager.compute_rm_score``) serves the
  model with vLLM or SGLang (``reward_model.rollout.*``) and asks for each re-templated sequence's last-token logit;
- the legacy worker (``use_reward_loop=False``; verl/workers/fsdp_workers.py, ``RewardModelWorker``) runs it with
  FSDP and reads the same logit, re-templating unless ``model.input_tokenizer`` is null.

hpcppo runs the model with FSDP2 like its reference and always re-templates (``hpcppo.data.rm_inputs``): the scores
of both of verl's paths. What only changes speed or placement is ignored with its reason; what would change the
scores and has no counterpart is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcppo.verl.names.convert import Entry, Ignored, Untranslatable, ign, m, uns, \
    dynamic_bsz, none_is_default, per_gpu, token_budget

__all__ = ["reward_entries"]

RM = "reward_model."
KW = RM + "reward_kwargs."
OB = KW + "overlong_buffer_cfg."
SPEED = "speed only: the scores are the same"
PLACEMENT = "hpcppo colocates every model on the job's GPUs"
#: verl's registered reward managers (verl/workers/reward_manager/__init__.py at b178a3c) hpcppo does not have.
_OTHER_MANAGERS = ("prime", "batch", "limited", "remote")


def manager_name(value: Any, ctx: Mapping[str, Any]) -> Any:
    if value in ("naive", "dapo"):
        return value
    if value in _OTHER_MANAGERS:
        raise Untranslatable(f"{value!r}: verl's {value} reward manager is not in hpcppo (naive and dapo are)")
    raise Untranslatable(f"{value!r} is not a reward manager hpcppo has; allowed: naive, dapo")


def input_tokenizer(value: Any, ctx: Mapping[str, Any]) -> Any:
    # Only the legacy worker reads it (RewardModelWorker._build_model); the reward loop always re-templates.
    if value is None and ctx.get(RM + "use_reward_loop") is False:
        raise Untranslatable("null: verl's legacy worker then feeds the actor's tokens to the reward model as they "
                             "are; hpcppo always re-templates with the reward model's chat template, as verl's "
                             "default does")
    raise Ignored("hpcppo decodes the response with the actor's tokenizer (model.tokenizer_path) and re-templates "
                  "it with the reward model's, as verl does by default")


def reward_entries() -> list[Entry]:
    """The table's rows for ``reward_model.*`` and ``reward_manager.*``."""
    return [
    m(RM + "enable", "reward_model.enable", "the model's score replaces the rule-based one in training "
                                             "(verl's rm_scores); validation stays rule-based, as in verl"),
    m(RM + "model.path", "reward_model.path", "a *ForSequenceClassification directory with num_labels = 1"),
    m(RM + "model.input_tokenizer", "reward_model.tokenizer_path", "hpcppo always re-templates (verl's default); "
       "null only with use_reward_loop=False is refused", input_tokenizer, context=True),
    m(RM + "micro_batch_size_per_gpu", "reward_model.micro_batch_size_per_gpu", "null -> 0 (the log-prob "
       "micro-batch)", none_is_default),
    m(RM + "micro_batch_size", "reward_model.micro_batch_size_per_gpu", "global, divided by the GPUs", per_gpu,
       context=True),
    m(RM + "max_length", "reward_model.max_length", "null -> 0 (prompt + response length, verl's default); "
       "longer inputs are cut from the right, as verl's worker", none_is_default),
    uns(RM + "truncation", "hpcppo cuts a long reward-model input from the right, the worker's default",
         ok=("right",)),
    m(RM + "use_dynamic_bsz", "reward_model.max_tokens_per_micro_batch", "true: forward_max_token_len_per_gpu "
       "tokens per forward", dynamic_bsz(RM + "forward_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"),
       context=True),
    m(RM + "forward_max_token_len_per_gpu", "reward_model.max_tokens_per_micro_batch", "only with use_dynamic_bsz",
       token_budget(RM + "use_dynamic_bsz"), context=True),
    m(RM + "model.fsdp_config.param_offload", "reward_model.offload", "the reward model's shards stay on the CPU"),
    ign(RM + "use_reward_loop", "verl's two reward-model paths (vLLM server or FSDP worker) give the same "
                                 "last-token score; hpcppo runs the model with FSDP2"),
    ign(RM + "rollout", "the vLLM/SGLang server of verl's reward loop; hpcppo runs the reward model with FSDP2 "
                         "(the same scores)", prefix=True),
    ign(RM + "strategy", "hpcppo always shards with FSDP2 (fully_shard)"),
    ign(RM + "model.fsdp_config", "FSDP wrapping and prefetch details: " + SPEED, prefix=True),
    uns(RM + "model.fsdp_config.fsdp_size", "hpcppo shards every model over all ranks (or HSDP)", ok=(-1,)),
    ign(RM + "model.use_remove_padding", SPEED),
    ign(RM + "model.use_fused_kernels", SPEED),
    ign(RM + "model.use_shm", "loading from shared memory: " + SPEED),
    uns(RM + "model.trust_remote_code", "hpcppo loads the reward model with model.trust_remote_code", ok=(False,)),
    uns(RM + "model.external_lib", "hpcppo imports no external model library", ok=(None,)),
    uns(RM + "model.override_config", "hpcppo takes the reward model's config.json as it is", ok=(None, {})),
    uns(RM + "ulysses_sequence_parallel_size", "no sequence parallelism in hpcppo", ok=(1,)),
    uns(RM + "enable_resource_pool", PLACEMENT, ok=(False,)),
    ign(RM + "n_gpus_per_node", "only with enable_resource_pool: " + PLACEMENT),
    ign(RM + "nnodes", "only with enable_resource_pool: " + PLACEMENT),
    ign(RM + "num_workers", "Ray workers of verl's reward loop; hpcppo scores on every rank"),
    ign(RM + "launch_reward_fn_async", "verl overlaps rule-based scoring with other work: " + SPEED),
    m(RM + "reward_manager", "reward_manager.name", "naive or dapo (verl's older key)", manager_name),
    m("reward_manager.name", "reward_manager.name", "naive or dapo", manager_name),
    uns("reward_manager.source", "hpcppo's reward managers are built in", ok=("register",)),
    ign("reward_manager.module", "only with reward_manager.source = importlib", prefix=True),
    uns(RM + "reward_loop_source", "hpcppo's reward managers are built in", ok=("register",)),
    uns(RM + "reward_loop_module_path", "no custom reward-loop classes in hpcppo", ok=(None,)),
    uns(RM + "reward_loop_class_name", "no custom reward-loop classes in hpcppo", ok=(None,)),
    uns(RM + "sandbox_fusion.url", "no code-execution sandbox in hpcppo", ok=(None,)),
    ign(RM + "sandbox_fusion", "only with sandbox_fusion.url", prefix=True),
    uns(RM + "megatron", "hpcppo runs every model with FSDP2 only", prefix=True),
    ign(RM + "load_weight", "an option of verl's Megatron workers"),
    ign(RM + "nccl_timeout", "one timeout for every collective here: trainer.collective_timeout_s"),
    ign(RM + "profiler", "profiling is not in hpcppo's config", prefix=True),
    m(OB + "enable", "reward_manager.overlong_buffer.enable", "with reward_manager = dapo"),
    m(OB + "len", "reward_manager.overlong_buffer.len"),
    m(OB + "penalty_factor", "reward_manager.overlong_buffer.penalty_factor"),
    m(OB + "log", "reward_manager.overlong_buffer.log", "logged as reward_manager/overlong_* metrics"),
    m(KW + "max_resp_len", "reward_manager.max_resp_len"),
    uns(RM + "reward_kwargs", "keyword arguments of verl's reward manager: hpcppo's dapo takes overlong_buffer_cfg "
                               "and max_resp_len, naive none", ok=({},), prefix=True),
    ]
