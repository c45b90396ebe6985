"""verl's keys in hpcppo terms, part 2: the table itself, one :class:`~hpcppo.verl.names.convert.Entry` per verl
key (verl/trainer/config/_generated_ppo_trainer.yaml at verl b178a3c), grouped as verl groups them. No torch here.
"""

from __future__ import annotations

from hpcppo.verl.names.convert import (A, ACTOR_TOKENS, ARR, CRITIC_TOKENS, MODEL, NOT_VERL, R, REF, REWARD_KWARGS,
                                        Entry, clip_ratio, ign, m, uns, critic_warmup, dtype, dynamic_bsz, engine, files, freq, hsdp,
                                        keep, logger, lora_modules, lora_setting, none_is_default, without_lora, per_gpu, project_name, resume, reward_kwargs,
                                        reward_name, reward_path, run_name, schedule, token_budget, top_k, total_steps, warmup,
                                        warmup_ratio)

from hpcppo.verl.names.async_policy import async_entries
from hpcppo.verl.names.moe import moe_entries
from hpcppo.verl.names.reward import reward_entries

__all__ = ["ENTRIES", "m", "alias", "ign", "uns"]

FSDP2 = "hpcppo always shards with FSDP2 (fully_shard)"
NO_RAY = "hpcppo runs one process per GPU under Slurm, without Ray"
PERF_VLLM = "a vLLM tuning knob hpcppo does not expose; vLLM's default applies (speed and memory only)"
LOGGING = "hpcppo records every metric in the run's HDF5 log (hpcppo metrics export/plot)"
ONE_TOKENIZER = "hpcppo uses one tokenizer for every model (model.tokenizer_path)"


def alias(verl: str, hpcppo: str, note: str) -> Entry:
    return Entry(verl, NOT_VERL, hpcppo, note)


def _optim(verl: str, role: str) -> list[Entry]:
    o = verl + "optim."
    return [
        m(o + "lr", f"{role}.lr"),
        m(o + "weight_decay", f"{role}.weight_decay"),
        m(o + "betas", f"{role}.betas"),
        m(o + "lr_warmup_steps", f"{role}.warmup_steps", "training steps in both; -1 = use lr_warmup_steps_ratio",
          warmup),
        m(o + "lr_warmup_steps_ratio", f"{role}.warmup_ratio", "only when lr_warmup_steps is -1, as in verl",
          warmup_ratio(o + "lr_warmup_steps"), context=True),
        m(o + "clip_grad", f"{role}.grad_clip"),
        m(o + "min_lr_ratio", f"{role}.min_lr_ratio", "", none_is_default),
        m(o + "lr_scheduler_type", f"{role}.lr_schedule", "constant or cosine", schedule),
        m(o + "warmup_style", f"{role}.lr_schedule", "verl's older name of lr_scheduler_type", schedule),
        uns(o + "num_cycles", "hpcppo's cosine is one half cosine (verl's default num_cycles = 0.5)", ok=(0.5,)),
        uns(o + "optimizer", "hpcppo trains with AdamW (torch.optim)", ok=("AdamW", "adamw")),
        uns(o + "optimizer_impl", "hpcppo trains with torch.optim.AdamW", ok=("torch.optim",)),
        uns(o + "override_optimizer_config", "hpcppo takes no extra optimizer arguments", ok=(None, {})),
        ign(o + "total_training_steps", "set by verl's trainer at run time; hpcppo knows it from trainer.*"),
        *[ign(o + k, "an option of verl's Megatron optimizer; hpcppo trains with FSDP2 and AdamW")
          for k in ("lr_warmup_init", "lr_decay_steps", "lr_decay_style", "min_lr", "weight_decay_incr_style",
                    "lr_wsd_decay_style", "lr_wsd_decay_steps", "use_checkpoint_opt_param_scheduler")],
        ign(o + "_target_", "Hydra's class to build; not a setting"),
    ]


def _fsdp(verl: str, role: str) -> list[Entry]:
    """``<role>.fsdp_config.*``: actor and critic have their own ``[*.fsdp]``; the reference shares the actor's."""
    f = verl + "fsdp_config."
    own = role in ("actor", "critic")
    out = [
        m(f + "param_offload", f"{role}.fsdp.param_offload",
          "verl moves the parameter shards to the CPU between phases; hpcppo's param_offload is FSDP2's "
          "CPUOffloadPolicy (verl's offload_policy): the GPU holds no shards, the optimizer step runs on the CPU")
        if own else m(f + "param_offload", "reference.offload", "the reference's shards stay on the CPU; not with "
                      "LoRA (no reference copy)", without_lora(MODEL + "lora_rank", MODEL + "lora_adapter_path"),
                      context=True),
        m(f + "offload_policy", f"{role}.fsdp.param_offload", "FSDP2's CPUOffloadPolicy, as verl's offload_policy")
        if own else ign(f + "offload_policy", "verl gives the reference CPUOffloadPolicy under FSDP2 in any case; "
                                              "hpcppo: reference.offload"),
        m(f + "optimizer_offload", f"{role}.fsdp.optimizer_offload") if own
        else ign(f + "optimizer_offload", "the reference has no optimizer"),
        m(f + "reshard_after_forward", f"{role}.fsdp.reshard_after_forward") if own
        else ign(f + "reshard_after_forward", "the reference uses actor.fsdp's settings"),
        m(f + "mixed_precision.param_dtype", f"{role}.fsdp.param_dtype", "bf16/fp16/fp32 -> bfloat16/float16/float32",
          dtype) if own else ign(f + "mixed_precision.param_dtype", "the reference uses actor.fsdp's settings"),
        m(f + "dtype", f"{role}.fsdp.param_dtype", "verl's engine config: the compute (param) dtype", dtype) if own
        else ign(f + "dtype", "the reference uses actor.fsdp's settings"),
        m(f + "mixed_precision.reduce_dtype", f"{role}.fsdp.reduce_dtype", "", dtype) if own
        else ign(f + "mixed_precision.reduce_dtype", "no gradients are reduced for the reference"),
        ign(f + "mixed_precision.buffer_dtype", "buffers keep the dtype of model.dtype"),
        # verl passes forward_prefetch only to FSDP1's constructor (fsdp_workers.py, the `fsdp_strategy == "fsdp"`
        # branch); torch's fully_shard has no such argument (its signature: mesh, reshard_after_forward,
        # shard_placement_fn, mp_policy, offload_policy, ignored_params), it overlaps the next all-gather itself.
        ign(f + "forward_prefetch", "an FSDP1 option; FSDP2's fully_shard has none and overlaps the next "
                                    "all-gather on its own"),
        ign(f + "use_orig_params", "an FSDP1 option; FSDP2 always keeps the original parameters"),
        ign(f + "wrap_policy", "hpcppo shards each transformer block and the root, whatever the size", prefix=True),
        uns(f + "model_dtype", "hpcppo always keeps float32 master weights (verl's actor default); the compute dtype "
                               f"is {'actor' if not own else role}.fsdp.param_dtype", ok=("fp32", "float32")),
        uns(f + "strategy", FSDP2, ok=("fsdp", "fsdp2")),
        uns(f + "ulysses_sequence_parallel_size", "no sequence parallelism in hpcppo", ok=(1,)),
        ign(f + "seed", "hpcppo seeds everything from the experiment's seed"),
        m(f + "full_determinism", "trainer.deterministic") if role == "actor"
        else ign(f + "full_determinism", "hpcppo: trainer.deterministic"),
        ign(f + "use_torch_compile", "hpcppo does not torch.compile (speed only)"),
        ign(f + "entropy_from_logits_with_chunking", "a memory optimisation of verl's entropy; same values"),
        ign(f + "entropy_checkpointing", "a memory optimisation of verl's entropy; same values"),
        ign(f + "forward_only", "set by verl per role"),
        ign(f + "_target_", "Hydra's class to build; not a setting"),
    ]
    if role == "actor":
        out.append(m(f + "fsdp_size", "resources.hsdp", "-1 (all GPUs) -> off; = n_gpus_per_node -> on", hsdp,
                     context=True))
    else:
        out.append(ign(f + "fsdp_size", "one device mesh for every model in hpcppo (resources.hsdp)"))
    return out


def _lora(verl: str, role: str) -> list[Entry]:
    """``<model>.lora_*``: peft's LoraConfig in verl's FSDP workers (fsdp_workers.py, ``_build_model_optimizer``,
    ``_build_critic_model_optimizer``). Merged weights reach the rollout engine (hpcppo.models.lora says why)."""
    rank = verl + "lora_rank"
    out = [
        m(rank, f"{role}.lora.rank", "0 = full fine-tuning, as in verl"),
        m(verl + "lora_alpha", f"{role}.lora.alpha", "only with lora_rank > 0", lora_setting(rank), context=True),
        m(verl + "target_modules", f"{role}.lora.target_modules", "\"all-linear\" or a list of layer names; only "
          "with lora_rank > 0", lora_setting(rank, lora_modules), context=True),
    ]
    if role == "actor":
        out.append(m(verl + "exclude_modules", "actor.lora.exclude_modules", "a list of layer names; only with "
                     "lora_rank > 0", lora_setting(rank, lora_modules), context=True))
        out.append(m(verl + "lora_adapter_path", "actor.lora.adapter_path", "verl takes r, alpha and the target "
                     "modules from the adapter; hpcppo checks that actor.lora has the adapter's", none_is_default))
    else:  # verl's critic builds its LoraConfig without exclude_modules
        out.append(ign(verl + "exclude_modules", "verl's critic LoRA takes no exclude_modules"))
        out.append(uns(verl + "lora_adapter_path", "verl's critic adapter carries its score head (modules_to_save); "
                                                   "hpcppo's value head is not in a peft adapter", ok=(None,)))
    return out


def _model(verl: str, actor: bool) -> list[Entry]:
    return [
        m(verl + "path", "model.path" if actor else "model.critic_path",
          "a Hugging Face hub id must be downloaded first: hpcppo loads model directories"),
        m(verl + "tokenizer_path", "model.tokenizer_path", "", none_is_default) if actor
        else ign(verl + "tokenizer_path", ONE_TOKENIZER),
        m(verl + "trust_remote_code", "model.trust_remote_code"),
        m(verl + "enable_gradient_checkpointing", "model.gradient_checkpointing",
          "one setting for the actor and the critic here"),
        m(verl + "use_remove_padding", "model.remove_padding", "rows packed into one sequence per micro-batch; one "
          "setting for the actor, the reference and the critic here"),
        uns(verl + "override_config", "hpcppo loads the model's config as it is", ok=({},), prefix=True),
        uns(verl + "lora.rank", "verl's Megatron-backend LoRA (model.lora.*); verl's FSDP workers read lora_rank, "
                                "which hpcppo translates", ok=(0,)),
        ign(verl + "lora", "only with verl's Megatron-backend LoRA (lora.rank > 0)", prefix=True),
        uns(verl + "external_lib", "hpcppo imports no extra library for the model", ok=(None,)),
        *_lora(verl, "actor" if actor else "critic"),
        ign(verl + "use_shm", "hpcppo reads the model directory directly"),
        uns(verl + "enable_activation_offload", "no activation offload in hpcppo (model.gradient_checkpointing "
                                                "saves memory instead)", ok=(False,)),
        ign(verl + "use_liger", "a kernel library; hpcppo uses transformers' own (model.attn_implementation)"),
        ign(verl + "use_fused_kernels", "fused kernels are a speed-up; same results"),
        ign(verl + "fused_kernel_options", "fused kernels are a speed-up; same results", prefix=True),
        uns(verl + "custom_chat_template", "hpcppo applies the tokenizer's own chat template", ok=(None,)),
        ign(verl + "hf_config_path", "hpcppo reads the config from the model directory"),
        ign(verl + "tiled_mlp", "a memory optimisation; same results", prefix=True),
        uns(verl + "mtp.enable", "no multi-token prediction in hpcppo", ok=(False,)),
        ign(verl + "mtp", "only with mtp.enable", prefix=True),
        ign(verl + "_target_", "Hydra's class to build; not a setting"),
    ]


def _data_entries() -> list[Entry]:
    """The table's rows for data and model."""
    return [
    # data
    m("data.train_files", "data.train_files", "a file, a list or a directory of Parquet files", files),
    m("data.val_files", "data.val_files", "", files),
    m("data.prompt_key", "data.prompt_key"),
    m("data.max_prompt_length", "data.max_prompt_length"),
    m("data.max_response_length", "data.max_response_length"),
    m("data.train_batch_size", "trainer.train_batch_size", "prompts per step, as in verl"),
    m("data.truncation", "data.truncation"),
    m("data.filter_overlong_prompts", "data.filter_overlong_prompts"),
    ign("data.filter_overlong_prompts_workers", "hpcppo filters in the loading process"),
    m("data.shuffle", "data.shuffle"),
    m("data.seed", "seed", "one seed for data order, sampling and initialisation here", none_is_default),
    m("data.tokenizer", "model.tokenizer_path", "", none_is_default),
    m("data.trust_remote_code", "model.trust_remote_code"),
    uns("data.reward_fn_key", "hpcppo dispatches rewards on the data_source column", ok=("data_source",)),
    uns("data.train_max_samples", "hpcppo trains on every row (cut the Parquet file instead)", ok=(-1, None)),
    uns("data.val_max_samples", "hpcppo validates on every row (cut the Parquet file instead)", ok=(-1, None)),
    ign("data.val_batch_size", "deprecated in verl; hpcppo validates in batches of its own size"),
    ign("data.return_raw_input_ids", "a detail of verl's dataset output"),
    ign("data.return_raw_chat", "a detail of verl's dataset output"),
    ign("data.return_full_prompt", "a detail of verl's dataset output"),
    ign("data.return_multi_modal_inputs", "hpcppo trains on text prompts"),
    ign("data.image_key", "on a command line, import-verl refuses the run (vision-language); in a YAML, verl's "
                          "default: compile refuses data with an images column"),
    ign("data.video_key", "on a command line, import-verl refuses the run (vision-language); in a YAML, verl's "
                          "default: compile refuses data with a videos column"),
    ign("data.image_patch_size", "hpcppo trains on text prompts"),
    ign("data.dataloader_num_workers", "hpcppo tokenises in the training process"),
    ign("data.use_shm", "hpcppo reads the Parquet files directly"),
    uns("data.validation_shuffle", "hpcppo validates in file order", ok=(False,)),
    uns("data.custom_cls.path", "hpcppo reads verl's Parquet schema with its own dataset class", ok=(None,)),
    ign("data.custom_cls.name", "only with data.custom_cls.path"),
    uns("data.sampler.class_path", "hpcppo's sampler is its own (seeded, resumable)", ok=(None,)),
    ign("data.sampler.class_name", "only with data.sampler.class_path"),
    uns("data.datagen.path", "no dynamic data generation in hpcppo", ok=(None,)),
    ign("data.datagen.name", "only with data.datagen.path"),
    uns("data.apply_chat_template_kwargs", "hpcppo calls the chat template without extra arguments", ok=({},)),
    uns("data.tool_config_path", "no tool calling in hpcppo", ok=(None,)),
    # model
    *_model(MODEL, actor=True),
    ]


def _actor_entries() -> list[Entry]:
    """The table's rows for actor_rollout_ref.actor and .model."""
    return [
    # actor
    m(A + "ppo_mini_batch_size", "actor.ppo_mini_batch_size", "prompts per optimizer step, as in verl"),
    m(A + "ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size_per_gpu", "samples per GPU, as in verl",
      none_is_default),
    m(A + "ppo_micro_batch_size", "actor.ppo_micro_batch_size_per_gpu",
      "verl's deprecated global micro-batch, divided by nnodes x n_gpus_per_node", per_gpu, context=True),
    m(A + "ppo_epochs", "actor.ppo_epochs"),
    m(A + "clip_ratio", "actor.clip_ratio", "only where clip_ratio_low/high are null: verl defaults both to 0.2",
      clip_ratio, context=True),
    m(A + "clip_ratio_low", "actor.clip_ratio_low", "", none_is_default),
    m(A + "clip_ratio_high", "actor.clip_ratio_high", "", none_is_default),
    m(A + "clip_ratio_c", "actor.clip_ratio_c", "the dual-clip bound (> 1)"),
    m(A + "loss_agg_mode", "actor.loss_agg_mode"),
    m(A + "entropy_coeff", "actor.entropy_coeff"),
    m(A + "use_kl_loss", "actor.use_kl_loss"),
    m(A + "kl_loss_coef", "actor.kl_loss_coef"),
    m(A + "kl_loss_type", "actor.kl_loss_type"),
    m(A + "grad_clip", "actor.grad_clip"),
    m(A + "checkpoint.async_save", "checkpoint.async_save"),
    ign(A + "checkpoint", "hpcppo checkpoints model, optimizer and the rest of the state, always", prefix=True),
    uns(A + "strategy", FSDP2, ok=("fsdp", "fsdp2")),
    uns(A + "megatron", "hpcppo trains with FSDP2 only", prefix=True),
    ign(A + "load_weight", "an option of verl's Megatron workers"),
    m(A + "use_dynamic_bsz", "actor.max_tokens_per_micro_batch", "true: micro-batches under "
      "ppo_max_token_len_per_gpu tokens (16384 unless given); false: fixed-size ones (0)",
      dynamic_bsz(A + "ppo_max_token_len_per_gpu", 16384), context=True),
    m(A + "ppo_max_token_len_per_gpu", "actor.max_tokens_per_micro_batch", "tokens per GPU micro-batch, only with "
      "use_dynamic_bsz; hpcppo counts the padding of its trimmed micro-batches in them",
      token_budget(A + "use_dynamic_bsz"), context=True),
    uns(A + "ulysses_sequence_parallel_size", "no sequence parallelism in hpcppo", ok=(1,)),
    m(A + "policy_loss.loss_mode", "actor.policy_loss.loss_mode",
      "vanilla, gspo, cispo, gpg, clip_cov, kl_cov, sapo, geo_mean; bypass_mode comes with "
      "algorithm.rollout_correction.bypass_mode"),
    m(A + "policy_loss.clip_cov_ratio", "actor.policy_loss.clip_cov_ratio"),
    m(A + "policy_loss.clip_cov_lb", "actor.policy_loss.clip_cov_lb"),
    m(A + "policy_loss.clip_cov_ub", "actor.policy_loss.clip_cov_ub"),
    m(A + "policy_loss.kl_cov_ratio", "actor.policy_loss.kl_cov_ratio"),
    m(A + "policy_loss.ppo_kl_coef", "actor.policy_loss.ppo_kl_coef"),
    ign(A + "policy_loss._target_", "Hydra's class to build; not a setting"),
    m(A + "tau_pos", "actor.policy_loss.tau_pos", "sapo's gate temperature (A > 0)"),
    m(A + "tau_neg", "actor.policy_loss.tau_neg", "sapo's gate temperature (A <= 0)"),
    uns(A + "loss_scale_factor", "hpcppo aggregates with loss_agg_mode only", ok=(None,)),
    uns(A + "shuffle", "hpcppo does not reshuffle samples between mini-batches", ok=(False,)),
    ign(A + "data_loader_seed", "hpcppo seeds everything from the experiment's seed"),
    ign(A + "use_torch_compile", "hpcppo does not torch.compile (speed only)"),
    ign(A + "use_fused_kernels", "fused kernels are a speed-up; same results"),
    ign(A + "use_remove_padding", "verl copies model.use_remove_padding here; hpcppo: model.remove_padding"),
    ign(A + "entropy_from_logits_with_chunking", "a memory optimisation of verl's entropy; same values"),
    ign(A + "entropy_checkpointing", "a memory optimisation of verl's entropy; same values"),
    ign(A + "calculate_entropy", "hpcppo always logs the entropy"),
    uns(A + "use_prefix_grouper", "not in hpcppo", ok=(False,)),
    uns(A + "calculate_sum_pi_squared", "not in hpcppo", ok=(False,)),
    ign(A + "sum_pi_squared_checkpointing", "only with calculate_sum_pi_squared"),
    ign(A + "freeze_vision_tower", "hpcppo trains text models"),
    ign(A + "rollout_n", "verl copies rollout.n here"),
    ign(A + "_target_", "Hydra's class to build; not a setting"),
    *_optim(A, "actor"),
    *_fsdp(A, "actor"),
    ]


def _reference_entries() -> list[Entry]:
    """The table's rows for actor_rollout_ref.ref."""
    return [
    # reference
    m(REF + "log_prob_micro_batch_size_per_gpu", "rollout.micro_batch_size_per_gpu",
      "one log-prob/value micro-batch for every model here (the smallest given)", none_is_default),
    m(REF + "log_prob_micro_batch_size", "rollout.micro_batch_size_per_gpu", "global, divided by the GPUs",
      per_gpu, context=True),
    m(REF + "log_prob_use_dynamic_bsz", "rollout.max_tokens_per_micro_batch", "true: log_prob_max_token_len_per_gpu "
      "(verl's default: the actor's ppo_max_token_len_per_gpu); one budget for every log-prob/value pass here",
      dynamic_bsz(REF + "log_prob_max_token_len_per_gpu", ACTOR_TOKENS), context=True),
    m(REF + "log_prob_max_token_len_per_gpu", "rollout.max_tokens_per_micro_batch",
      "only with log_prob_use_dynamic_bsz (the smallest budget given wins)", token_budget(REF + "log_prob_use_dynamic_bsz"),
      context=True),
    *_fsdp(REF, "reference"),
    uns(REF + "strategy", FSDP2, ok=("fsdp", "fsdp2")),
    uns(REF + "megatron", "hpcppo trains with FSDP2 only", prefix=True),
    ign(REF + "load_weight", "an option of verl's Megatron workers"),
    uns(REF + "ulysses_sequence_parallel_size", "no sequence parallelism in hpcppo", ok=(1,)),
    ign(REF + "use_torch_compile", "hpcppo does not torch.compile (speed only)"),
    ign(REF + "entropy_from_logits_with_chunking", "a memory optimisation; same values"),
    ign(REF + "entropy_checkpointing", "a memory optimisation; same values"),
    ign(REF + "rollout_n", "verl copies rollout.n here"),
    ign(REF + "_target_", "Hydra's class to build; not a setting"),
    ]


def _rollout_entries() -> list[Entry]:
    """The table's rows for actor_rollout_ref.rollout."""
    return [
    # rollout
    m(R + "name", "rollout.engine", "vllm (or hf); sglang is not in hpcppo", engine),
    m(R + "n", "rollout.n"),
    m(R + "temperature", "rollout.temperature"),
    m(R + "top_p", "rollout.top_p"),
    m(R + "top_k", "rollout.top_k", "0 and -1 both mean off (-1 here)", top_k),
    m(R + "gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    m(R + "tensor_model_parallel_size", "rollout.tensor_parallel_size"),
    m(R + "enforce_eager", "rollout.enforce_eager"),
    m(R + "free_cache_engine", "rollout.free_cache_engine"),
    m(R + "log_prob_micro_batch_size_per_gpu", "rollout.micro_batch_size_per_gpu",
      "one log-prob/value micro-batch for every model here (the smallest given)", none_is_default),
    m(R + "log_prob_micro_batch_size", "rollout.micro_batch_size_per_gpu", "global, divided by the GPUs",
      per_gpu, context=True),
    m(R + "prompt_length", "data.max_prompt_length", "verl's default copies data.max_prompt_length"),
    m(R + "response_length", "data.max_response_length", "verl's default copies data.max_response_length"),
    m(R + "val_kwargs.temperature", "rollout.val_temperature", "0 = greedy"),
    # verl's agent loop (rollout.mode = async, the default) validates at val_kwargs.temperature/top_p/top_k and
    # never reads do_sample (experimental/agent_loop/agent_loop.py); only the HF rollout does.
    ign(R + "val_kwargs.do_sample", "verl's vLLM rollout (mode async, its default) does not read it either: "
                                    "validation samples at val_kwargs.temperature (0 = greedy)"),
    m(R + "val_kwargs.n", "rollout.val_n", "> 1 adds mean@n, std@n, best@k, worst@k, maj@k per data source"),
    m(R + "val_kwargs.top_p", "rollout.val_top_p"),
    uns(R + "val_kwargs.top_k", "hpcppo validates without top-k", ok=(-1, 0)),
    ign(R + "val_kwargs._target_", "Hydra's class to build; not a setting"),
    uns(R + "do_sample", "hpcppo's training rollouts always sample", ok=(True,)),
    uns(R + "ignore_eos", "hpcppo stops at the end-of-sequence token", ok=(False,)),
    uns(R + "multi_turn.enable", "no multi-turn rollouts in hpcppo", ok=(False,)),
    ign(R + "multi_turn", "only with multi_turn.enable", prefix=True),
    ign(R + "agent", "verl's agent loop: hpcppo generates single-turn", prefix=True),
    ign(R + "mode", "hpcppo generates synchronously, colocated with training"),
    uns(R + "data_parallel_size", "hpcppo derives it (GPUs / tensor_model_parallel_size)", ok=(1,)),
    uns(R + "pipeline_model_parallel_size", "no pipeline parallelism in hpcppo", ok=(1,)),
    uns(R + "over_sample_rate", "hpcppo waits for every response", ok=(0, 0.0)),
    uns(R + "quantization", "hpcppo generates with the training weights' dtype", ok=(None,)),
    uns(R + "skip_rollout", "hpcppo always generates", ok=(False,)),
    m(R + "log_prob_use_dynamic_bsz", "rollout.max_tokens_per_micro_batch", "true: log_prob_max_token_len_per_gpu "
      "(verl's default: the actor's ppo_max_token_len_per_gpu); one budget for every log-prob/value pass here",
      dynamic_bsz(R + "log_prob_max_token_len_per_gpu", ACTOR_TOKENS), context=True),
    m(R + "log_prob_max_token_len_per_gpu", "rollout.max_tokens_per_micro_batch",
      "only with log_prob_use_dynamic_bsz (the smallest budget given wins)", token_budget(R + "log_prob_use_dynamic_bsz"),
      context=True),
    ign(R + "calculate_log_probs", "hpcppo always keeps the engine's log-probs (rollout/logprob_gap; the rollout "
                                   "correction uses them)"),
    ign(R + "logprobs_mode", "hpcppo recomputes old log-probs with the training model"),
    *[ign(R + k, PERF_VLLM) for k in ("dtype", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                                      "enable_chunked_prefill", "enable_prefix_caching", "cudagraph_capture_sizes",
                                      "load_format", "disable_log_stats", "scheduling_policy",
                                      "multi_stage_wake_up", "skip_tokenizer_init", "quantization_config_file")],
    ign(R + "engine_kwargs", PERF_VLLM, prefix=True),
    ign(R + "layered_summon", "verl's LoRA sync gathers the adapters for vLLM layer by layer; hpcppo sends merged "
                              "weights one bucket of parameters at a time, never the whole model at once"),
    ign(R + "layer_name_map", "an option of verl's Megatron weight sync", prefix=True),
    ign(R + "checkpoint_engine", "hpcppo streams weights to vLLM parameter by parameter", prefix=True),
    ign(R + "trace", "rollout tracing: not in hpcppo", prefix=True),
    ign(R + "prometheus", LOGGING, prefix=True),
    ign(R + "mtp", "multi-token prediction: not in hpcppo", prefix=True),
    ign(R + "skip_dump_dir", "only with skip_rollout"),
    ign(R + "_target_", "Hydra's class to build; not a setting"),
    m(ARR + "nccl_timeout", "trainer.collective_timeout_s", "seconds, as in verl"),
    ]


def _critic_and_algorithm_entries() -> list[Entry]:
    """The table's rows for critic and algorithm."""
    return [
    # critic
    *_model("critic.model.", actor=False),
    *_fsdp("critic.model.", "critic"),
    *_optim("critic.", "critic"),
    m("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "", none_is_default),
    m("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu", "", none_is_default),
    m("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", "global, divided by the GPUs",
      per_gpu, context=True),
    m("critic.forward_micro_batch_size_per_gpu", "rollout.micro_batch_size_per_gpu",
      "one log-prob/value micro-batch for every model here (the smallest given)", none_is_default),
    m("critic.forward_micro_batch_size", "rollout.micro_batch_size_per_gpu", "global, divided by the GPUs",
      per_gpu, context=True),
    m("critic.ppo_epochs", "critic.ppo_epochs"),
    m("critic.cliprange_value", "critic.cliprange_value"),
    m("critic.loss_agg_mode", "critic.loss_agg_mode"),
    m("critic.grad_clip", "critic.grad_clip"),
    uns("critic.enable", "hpcppo trains a critic exactly when the estimator needs values (gae)", ok=(None,)),
    uns("critic.strategy", FSDP2, ok=("fsdp", "fsdp2")),
    uns("critic.megatron", "hpcppo trains with FSDP2 only", prefix=True),
    ign("critic.load_weight", "an option of verl's Megatron workers"),
    ign("critic.nccl_timeout", "one timeout for every collective here: trainer.collective_timeout_s "
                               "(actor_rollout_ref.nccl_timeout)"),
    m("critic.use_dynamic_bsz", "critic.max_tokens_per_micro_batch", "true: micro-batches under "
      "ppo_max_token_len_per_gpu tokens (32768 unless given); false: fixed-size ones (0)",
      dynamic_bsz(CRITIC_TOKENS, 32768), context=True),
    m("critic.ppo_max_token_len_per_gpu", "critic.max_tokens_per_micro_batch", "only with use_dynamic_bsz",
      token_budget("critic.use_dynamic_bsz"), context=True),
    m("critic.forward_max_token_len_per_gpu", "rollout.max_tokens_per_micro_batch", "only with use_dynamic_bsz; "
      "one budget for every log-prob/value pass here (the smallest given wins)",
      token_budget("critic.use_dynamic_bsz"), context=True),
    uns("critic.ulysses_sequence_parallel_size", "no sequence parallelism in hpcppo", ok=(1,)),
    uns("critic.shuffle", "hpcppo does not reshuffle samples between mini-batches", ok=(False,)),
    ign("critic.data_loader_seed", "hpcppo seeds everything from the experiment's seed"),
    ign("critic.checkpoint", "hpcppo checkpoints model, optimizer and the rest of the state, always", prefix=True),
    ign("critic.rollout_n", "verl copies rollout.n here"),
    ign("critic._target_", "Hydra's class to build; not a setting"),
    # algorithm
    m("algorithm.adv_estimator", "algorithm.adv_estimator"),
    m("algorithm.gamma", "algorithm.gamma"),
    m("algorithm.lam", "algorithm.lam"),
    m("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"),
    m("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    m("algorithm.kl_penalty", "algorithm.kl_penalty"),
    m("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type"),
    m("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.kl_coef"),
    m("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon"),
    m("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.target_kl"),
    ign("algorithm.kl_ctrl._target_", "Hydra's class to build; not a setting"),
    uns("algorithm.use_pf_ppo", "no preference-feedback PPO in hpcppo", ok=(False,)),
    ign("algorithm.pf_ppo", "only with use_pf_ppo", prefix=True),
    *_rollout_correction_entries(),
    ign("algorithm._target_", "Hydra's class to build; not a setting"),
    ]


def _rollout_correction_entries() -> list[Entry]:
    """``algorithm.rollout_correction.*`` (verl's RolloutCorrectionConfig): the same names in hpcppo; null = off."""
    rc = "algorithm.rollout_correction."
    off = "null (verl's default) = off"
    return [
        m(rc + "rollout_is", rc + "rollout_is", f"token or sequence; {off}", none_is_default),
        m(rc + "rollout_is_threshold", rc + "rollout_is_threshold"),
        m(rc + "rollout_is_batch_normalize", rc + "rollout_is_batch_normalize"),
        m(rc + "rollout_rs", rc + "rollout_rs", f"comma-separated options; {off}", none_is_default),
        m(rc + "rollout_rs_threshold", rc + "rollout_rs_threshold", "a number or a string such as \"0.6_1.6,2.5\"",
          none_is_default),
        m(rc + "bypass_mode", rc + "bypass_mode", "the engine's log-probs are the old log-probs: no old-log-prob "
                                                  "pass"),
        m(rc + "loss_type", rc + "loss_type", "ppo_clip or reinforce, bypass mode's loss"),
    ]


def _trainer_entries() -> list[Entry]:
    """The table's rows for trainer, rewards and infrastructure."""
    return [
    # trainer
    m("trainer.total_epochs", "trainer.total_epochs"),
    m("trainer.total_training_steps", "trainer.total_steps", "null -> 0 (from total_epochs)", total_steps),
    m("trainer.save_freq", "checkpoint.save_every", "<= 0 -> -1 (never, not even at the end, as in verl)", freq),
    m("trainer.test_freq", "trainer.test_freq", "<= 0 -> -1 (never); verl also validates after the last step, "
                                                "hpcppo every test_freq steps only", freq),
    m("trainer.val_before_train", "trainer.val_before_train"),
    m("trainer.nnodes", "resources.nodes"),
    m("trainer.n_gpus_per_node", "resources.gpus_per_node"),
    m("trainer.experiment_name", "name", "characters outside letters, digits and _.- become -", run_name),
    m("trainer.critic_warmup", "critic.warmup_updates", "N -> N - 1: verl updates the actor from step N on",
      critic_warmup),
    m("trainer.resume_mode", "checkpoint.resume", "auto -> auto, disable -> never", resume),
    m("trainer.max_actor_ckpt_to_keep", "checkpoint.keep_last", "null -> 0 (keep all)", keep),
    m("trainer.max_critic_ckpt_to_keep", "checkpoint.keep_last", "null -> 0 (keep all); one value for both",
      keep),
    m("trainer.project_name", "trainer.project_name", "wandb's project; only with wandb in trainer.logger",
      project_name, context=True),
    m("trainer.logger", "trainer.logger", "console, tensorboard, wandb (offline); beside the HDF5 log. Unset: "
                                          "console only (verl's default adds wandb)", logger),
    ign("trainer.log_val_generations", LOGGING),
    uns("trainer.rollout_data_dir", "hpcppo does not dump rollouts", ok=(None,)),
    uns("trainer.validation_data_dir", "hpcppo does not dump validation generations", ok=(None,)),
    ign("trainer.default_local_dir", "checkpoints live in the run directory (the site's runs root)"),
    uns("trainer.default_hdfs_dir", "no HDFS copies in hpcppo", ok=(None,)),
    uns("trainer.resume_from_path", "hpcppo resumes from its own run directory; `hpcppo rollback RUN --to STEP` "
                                    "picks a checkpoint", ok=(None,)),
    uns("trainer.del_local_ckpt_after_load", "hpcppo keeps checkpoints by checkpoint.keep_last", ok=(False,)),
    uns("trainer.val_only", "hpcppo has no validation-only mode", ok=(False,)),
    ign("trainer.esi_redundant_time", "hpcppo checkpoints when Slurm signals the time limit "
                                      "(checkpoint.save_on_preempt, the site's signal_lead_s)"),
    ign("trainer.balance_batch", "verl reorders samples across GPUs to balance tokens; hpcppo's losses do not "
                                 "depend on the split (speed only)"),
    ign("trainer.ray_wait_register_center_timeout", NO_RAY),
    ign("trainer.device", "the site decides (GPU sites: cuda)"),
    ign("trainer.use_legacy_worker_impl", "a choice between verl's worker implementations"),
    # rewards
    m("custom_reward_function.path", "data.reward_fn", "path:name (name defaults to compute_score, as in verl)",
      reward_path, context=True),
    m("custom_reward_function.name", "data.reward_fn", "combined with custom_reward_function.path", reward_name,
      context=True),
    m(REWARD_KWARGS, "data.reward_kwargs", "keyword arguments of the function custom_reward_function.path names",
      reward_kwargs, context=True),
    *reward_entries(),
    # infrastructure
    ign("ray_kwargs", NO_RAY, prefix=True),
    ign("ray_init", NO_RAY, prefix=True),
    ign("global_profiler", "profiling is not in hpcppo's config", prefix=True),
    uns("transfer_queue.enable", "not in hpcppo", ok=(False,)),
    ign("hydra", "Hydra's own settings", prefix=True),
    *[ign(p + "profiler", "profiling is not in hpcppo's config", prefix=True) for p in (A, REF, R, "critic.")],
    ]


def _alias_entries() -> list[Entry]:
    """The table's rows for keys verl does not have, as people type them."""
    return [
    # keys verl does not have, as people type them
    alias(A + "use_dual_clip", "actor.clip_ratio_c",
          "verl has no use_dual_clip: its vanilla loss always dual-clips, bounded by "
          "actor_rollout_ref.actor.clip_ratio_c (default 3.0)"),
    alias("critic.vf_clip_param", "critic.cliprange_value", "verl's key is critic.cliprange_value"),
    alias("critic.clip_ratio", "critic.cliprange_value", "verl's key is critic.cliprange_value"),
    alias(A + "kl_coef", "actor.kl_loss_coef", "verl's key is actor_rollout_ref.actor.kl_loss_coef"),
    alias("algorithm.kl_coef", "algorithm.kl_ctrl.kl_coef", "verl's key is algorithm.kl_ctrl.kl_coef"),
    alias(A + "lr", "actor.lr", "verl's key is actor_rollout_ref.actor.optim.lr"),
    alias("critic.lr", "critic.lr", "verl's key is critic.optim.lr"),
    alias(R + "tensor_parallel_size", "rollout.tensor_parallel_size",
          "verl's key is actor_rollout_ref.rollout.tensor_model_parallel_size"),
    alias(R + "tp_size", "rollout.tensor_parallel_size",
          "verl's key is actor_rollout_ref.rollout.tensor_model_parallel_size"),
    alias("data.batch_size", "trainer.train_batch_size", "verl's key is data.train_batch_size"),
    alias("trainer.total_steps", "trainer.total_steps", "verl's key is trainer.total_training_steps"),
    alias("trainer.seed", "seed", "verl's key is data.seed"),
    ]


def _build_entries() -> list[Entry]:
    return [*_data_entries(), *_actor_entries(), *_reference_entries(), *_rollout_entries(),
            *_critic_and_algorithm_entries(), *_trainer_entries(), *moe_entries(), *async_entries(),
            *_alias_entries()]


# Indexed (and checked for keys listed twice) where it is looked up: hpcppo.verl.names.
ENTRIES: tuple[Entry, ...] = tuple(_build_entries())
