"""Experiment spec schema (``exp.toml``): one frozen attrs class per section.

Names and semantics follow verl's where one exists (``ppo_mini_batch_size`` counts prompts, the
``*_per_gpu`` micro-batches count samples, ``loss_agg_mode``, ``kl_penalty`` ...). Relative paths
(``model.path``, ``data.train_files`` ...) are relative to the spec file's directory; the loader makes
them absolute.
"""

from __future__ import annotations

from typing import Any

import attrs

from hpcppo import engines, estimators
from hpcppo.placement import PLACEMENTS
from hpcppo.config.fields import FieldValueError, opt, parse_slurm_time
from hpcppo.config.debug import DebugSection, InjectSection
from hpcppo.config.reward import RewardManagerSection, RewardModelSection
from hpcppo.config.lora import LoraSection
from hpcppo.config.multi_turn import MultiTurnSection
from hpcppo.config.rollout_corr import RolloutCorrectionSection
from hpcppo.config.watchdog import Rule, WatchdogSection

__all__ = ["Experiment", "ModelSection", "DataSection", "RolloutSection", "FsdpSection", "ActorSection",
           "CriticSection", "ReferenceSection", "KlCtrlSection", "AlgorithmSection", "TrainerSection",
           "CheckpointSection", "ResourcesSection", "WatchdogSection", "Rule", "DebugSection", "InjectSection", "KL_ESTIMATORS", "NAME_PATTERN", "DTYPE_NAMES"]

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""Dtype names a spec may use; hpcppo.models.DTYPES maps each to its torch dtype."""
_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS = _KL_BASE + tuple(k + "+" for k in _KL_BASE)
_LR_SCHEDULES = ("constant", "cosine", "linear")
_LOSS_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


NAME_ALLOWED = "1-64 letters, digits, '_', '.', '-', starting with a letter or digit, no '..'"


def _check_name(value: str) -> str | None:
    # The pattern alone would take "a..b", which no run id may contain (a path component of '..' escapes).
    return f"{value!r} contains '..'; allowed: {NAME_ALLOWED}" if ".." in value else None


def _check_betas(value: list[float]) -> str | None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        return f"{value} must be two numbers in [0, 1), e.g. [0.9, 0.999]"
    return None


_TIME_ALLOWED = "Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def _check_time(value: str) -> str | None:
    try:
        seconds = parse_slurm_time(value)
    except ValueError as exc:
        return str(exc)
    return None if seconds > 0 else f"{value!r} must be a positive duration"


# The built-in scorers data.reward_fn can name (hpcppo.data.rewards.BUILTINS; a test keeps the two in step).
REWARD_BUILTINS = ("gsm8k", "math", "math_verify", "math_dapo", "arith")


def _check_reward_fn(value: str) -> str | None:
    if value == "auto" or value in REWARD_BUILTINS:
        return None
    module, sep, func = value.partition(":")
    if not sep or not module or not func.isidentifier():
        return (f"{value!r} must be \"auto\", a built-in ({', '.join(REWARD_BUILTINS)}) or \"module:function\" "
                f"(e.g. \"my_rewards:score\")")
    return None


@attrs.frozen(kw_only=True)
class ModelSection:
    """``[model]``: the policy (actor) checkpoint and how it is loaded."""

    path: str = opt(help="Hugging Face model directory the actor starts from (relative to the spec file).", path=True)
    critic_path: str = opt("", path=True, help="Model directory the critic starts from; \"\" = model.path.")
    tokenizer_path: str = opt("", path=True, help="Tokenizer directory; \"\" = model.path.")
    dtype: str = opt("bfloat16", choices=DTYPE_NAMES, help="Dtype the weights are loaded in.")
    trust_remote_code: bool = opt(False, help="Allow the model directory's own Python code (transformers trust_remote_code).")
    gradient_checkpointing: bool = opt(False, help="Recompute activations in backward to save memory.")
    attn_implementation: str = opt("sdpa", choices=("sdpa", "eager", "flash_attention_2", "flash_attention_3"),
                                   help="transformers attention implementation; compile checks it against the "
                                        "family in the installed transformers (its _supports_sdpa/_supports_flash_attn "
                                        "flags, read as text): the default sdpa becomes eager for a family without "
                                        "it (Gemma2 at transformers 5.25), a value you set that the family lacks is "
                                        "refused.")
    remove_padding: bool = opt(False, help="Run each micro-batch of every training forward and backward (actor, "
                                           "reference, critic) with its rows packed into one sequence, position ids "
                                           "restarting per row, no attention mask: no padding computed (verl's "
                                           "use_remove_padding); token budgets then count real tokens. Every "
                                           "attn_implementation here supports it (flash_attention_2/3: varlen "
                                           "kernels; sdpa and eager: a block-diagonal mask).")


@attrs.frozen(kw_only=True)
class DataSection:
    """``[data]``: prompt datasets (Parquet in verl's schema) and the reward."""

    train_files: list[str] = opt(help="Parquet files of training prompts, or directories of them (their *.parquet, "
                                      "sorted by name); relative to the spec file.", path=True)
    val_files: list[str] = opt(factory=list, path=True, help="Parquet files (or directories) of validation prompts; "
                                                             "[] = no validation.")
    prompt_key: str = opt("prompt", help="Column holding the prompt: chat messages (list of {role, content}), or "
                                         "plain text, which becomes one user message.")
    max_prompt_length: int = opt(512, ge=1, help="Longest prompt in tokens (after the chat template).")
    max_response_length: int = opt(512, ge=1, help="Most tokens generated per response.")
    truncation: str = opt("error", choices=("error", "left", "right", "middle"),
                          help="A prompt longer than max_prompt_length: error = fail (at compile when the tokenizer "
                               "is local), left = keep its end, right = keep its start, middle = keep both ends "
                               "(max//2 first tokens + the rest from the end), as verl's data.truncation.")
    filter_overlong_prompts: bool = opt(False, help="Drop prompts longer than max_prompt_length when loading "
                                                    "(before truncation applies), as verl's "
                                                    "data.filter_overlong_prompts; compile reports how many.")
    shuffle: bool = opt(True, help="Shuffle the training prompts each epoch (seeded).")
    reward_fn: str = opt("auto", check=_check_reward_fn,
                         help="\"auto\" = dispatch on each row's data_source as verl's default_compute_score does "
                              "(openai/gsm8k, lighteval/MATH, HuggingFaceH4/MATH-500, math_dapo, aime* ...; "
                              "docs/data.md); a built-in for every row (gsm8k, math, math_verify, math_dapo, arith); "
                              "or \"module:function\" / \"path/to/file.py:function\" for your own scorer.")
    reward_kwargs: dict[str, Any] = opt(factory=dict,
                                        help="Keyword arguments for the reward function data.reward_fn names (a "
                                             "built-in or yours), as verl's custom_reward_function.reward_kwargs; "
                                             "not with \"auto\".")
    gsm8k_method: str = opt("strict", choices=("strict", "flexible"),
                            help="GSM8K scoring: strict = verl's rule (the last '#### ' + number, compared as a "
                                 "string: '18.00' is not '18'); flexible = the last number anywhere, compared "
                                 "numerically.")

    def __attrs_post_init__(self) -> None:
        if not self.train_files:
            raise FieldValueError("train_files", "needs at least one Parquet file")
        if self.reward_kwargs and self.reward_fn == "auto":
            raise FieldValueError("reward_kwargs", "needs a named reward_fn (a built-in or \"module:function\"): "
                                                   "\"auto\" picks a scorer per row (its option is gsm8k_method)")


@attrs.frozen(kw_only=True)
class RolloutSection:
    """``[rollout]``: generation of responses."""

    engine: str = opt("hf", choices=engines.names(), help="hf (our KV-cached sampling loop over transformers) or vllm "
                                                        "(colocated vLLM; on CPU sites vLLM's CPU backend, "
                                                        "tools/setup.sh --vllm).")
    n: int = opt(1, ge=1, help="Responses sampled per prompt (GRPO/RLOO need >= 2).")
    temperature: float = opt(1.0, gt=0.0, help="Sampling temperature of training rollouts.")
    top_p: float = opt(1.0, gt=0.0, le=1.0, help="Nucleus sampling mass.")
    top_k: int = opt(-1, help="Top-k sampling; -1 = off.", check=lambda v: None if v == -1 or v > 0 else f"{v} must be -1 (off) or > 0")
    val_temperature: float = opt(0.0, ge=0.0, help="Sampling temperature of validation; 0 = greedy.")
    val_n: int = opt(1, ge=1, help="Responses per validation prompt; > 1 adds verl's mean@n, std@n, best@k, worst@k "
                                   "and maj@k per data source (val/score/<data_source>/<stat>).")
    val_top_p: float = opt(1.0, gt=0.0, le=1.0, help="Nucleus sampling mass of validation (with val_temperature > 0).")
    gpu_memory_utilization: float = opt(0.5, gt=0.0, le=1.0, help="vLLM: fraction of GPU memory for weights and KV cache "
                                                                 "(on vLLM's CPU backend: of NUMA node 0's memory).")
    kv_cache_memory_mb: int = opt(0, ge=0, help="vLLM: KV cache size in MiB, instead of the share "
                                                "gpu_memory_utilization leaves; 0 = use gpu_memory_utilization.")
    tensor_parallel_size: int = opt(1, ge=1, help="vLLM tensor parallel size; must divide the ranks per node.")
    enforce_eager: bool = opt(False, help="vLLM: no CUDA graphs (slower, less memory, faster start).")
    free_cache_engine: bool = opt(True, help="vLLM: sleep mode between rollouts, freeing KV cache and weights for training.")
    allow_untested_vllm: bool = opt(False, help="vLLM: run with a vLLM other than the tested minor (0.32.x, the [vllm] "
                                                "extra's pin), which the job otherwise refuses at start naming both "
                                                "versions (the engine uses vLLM internals).")
    micro_batch_size_per_gpu: int = opt(0, ge=0, help="Samples per forward when recomputing log-probs; 0 = actor.ppo_micro_batch_size_per_gpu.")
    max_tokens_per_micro_batch: int = opt(0, ge=0, help="Token budget of each forward of the old-log-prob, reference "
                                                        "and value passes: rows packed by length into micro-batches of "
                                                        "at most this many tokens, padding included, each trimmed to "
                                                        "its longest prompt and response; 0 = micro_batch_size_per_gpu "
                                                        "rows padded to the batch (verl's log_prob_use_dynamic_bsz, "
                                                        "log_prob_max_token_len_per_gpu).")
    logprob_gap_max: float = opt(0.0, check=lambda v: None if v == -1 or v >= 0 else f"{v} must be -1 (off), 0 "
                                                                                     "(the default) or > 0",
                                 allowed="-1 (off), 0 (the default for the dtype pair) or > 0", help="The weight-sync guard: the run stops, before the step's update, "
                                                   "when the engine's log-probs of the step's own samples differ "
                                                   "from the trainer's by more than this per token on average "
                                                   "(rollout/logprob_gap); 0 = the default for the dtype pair "
                                                   "(float32 engine and trainer: 1e-3; bfloat16/float16 on either "
                                                   "side: 0.05; vllm with top_p < 1: + -log(top_p), with top_k: off; docs/sync-guard.md), -1 = off.")
    multi_turn: MultiTurnSection = opt(factory=MultiTurnSection,
                                       help="Multi-turn, tool-using rollouts (verl's rollout.multi_turn).")
    placement: str = opt("colocated", choices=PLACEMENTS,
                         help="Where responses are generated (docs/placement.md): colocated = on every rank, between "
                              "updates (the engine sleeps while the ranks train); split = on rollout ranks of the same "
                              "job that never stop generating (resources.rollout_ranks_per_node or "
                              "resources.rollout_nodes sets them apart), the other ranks train and send them new "
                              "weights after each update.")
    max_staleness: int = opt(1, ge=0, help="split: the oldest policy a trained sample may come from, in policy "
                                           "versions (weight broadcasts) behind the actor: 0 = on-policy (the "
                                           "trainers wait for samples of their current weights), 1 = one-step-off, "
                                           "k; older samples are dropped (rollout/dropped_stale). verl's "
                                           "staleness_threshold, prime-rl's max_async_level.")


@attrs.frozen(kw_only=True)
class FsdpSection:
    """``[actor.fsdp]`` / ``[critic.fsdp]``: FSDP2 sharding options."""

    param_offload: bool = opt(False, help="FSDP2 CPU offload: sharded parameters, gradients and optimizer state live on "
                                          "CPU (the optimizer step runs there).")
    optimizer_offload: bool = opt(False, help="Keep the optimizer state (AdamW moments) in pinned host memory between "
                                              "updates; it moves to the GPU for the optimizer steps (verl's "
                                              "semantics); with param_offload it is already on the host.")
    reshard_after_forward: bool = opt(True, help="Free gathered parameters after forward (less memory, one more all-gather).")
    param_dtype: str = opt("", choices=("", *DTYPE_NAMES),
                           help="Compute dtype of gathered parameters; \"\" = model.dtype.")
    reduce_dtype: str = opt("float32", choices=DTYPE_NAMES, help="Dtype of gradient reduction.")


# trainer.logger's values (hpcppo.metrics.trackers.LOGGERS; a test keeps the two in step) and verl's others.
LOGGERS = ("console", "tensorboard", "wandb")
_VERL_ONLY_LOGGERS = ("mlflow", "swanlab", "vemlp_wandb", "clearml", "trackio", "file")


def _check_loggers(value: list[str]) -> str | None:
    for name in value:
        if name in _VERL_ONLY_LOGGERS:
            return f"{name!r} is a verl tracker hpcppo does not have; hpcppo's: {', '.join(LOGGERS)}"
        if name not in LOGGERS:
            return f"{name!r} is not a tracker; allowed: {', '.join(LOGGERS)}"
    if len(set(value)) != len(value):
        return f"{value} names a tracker twice"
    return None


# The policy loss modes actor.policy_loss.loss_mode can name (hpcppo.algos.policy_losses.POLICY_LOSSES; a test keeps
# the two in step). verl's names (verl/trainer/ppo/core_algos.py, register_policy_loss).
POLICY_LOSS_MODES = ("vanilla", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "sapo", "geo_mean")


@attrs.frozen(kw_only=True)
class PolicyLossSection:
    """``[actor.policy_loss]``: which policy loss, and the parameters of the modes that have some (verl's
    ``actor_rollout_ref.actor.policy_loss``, with its defaults)."""

    loss_mode: str = opt("vanilla", choices=POLICY_LOSS_MODES,
                         help="vanilla (PPO clip, dual clip); gspo (sequence-level ratio, aggregated "
                              "seq-mean-token-mean); cispo (clipped ratio as a stop-gradient weight); gpg (-logp x A); "
                              "clip_cov, kl_cov (arXiv:2505.22617); sapo (a sigmoid gate instead of the clip, "
                              "arXiv:2511.20347); geo_mean (GMPO: the geometric mean of the clipped token ratios, "
                              "arXiv:2507.20673).")
    clip_cov_ratio: float = opt(0.0002, gt=0.0, le=1.0, help="clip_cov: share of the response tokens whose gradient is cut.")
    clip_cov_lb: float = opt(1.0, help="clip_cov: lower bound of the covariance of the tokens it may cut.")
    clip_cov_ub: float = opt(5.0, help="clip_cov: upper bound of the covariance of the tokens it may cut.")
    kl_cov_ratio: float = opt(0.0002, gt=0.0, le=1.0, help="kl_cov: share of the response tokens given the KL penalty.")
    ppo_kl_coef: float = opt(0.1, ge=0.0, help="kl_cov: coefficient of |log ratio| on those tokens.")
    tau_pos: float = opt(1.0, gt=0.0, help="sapo: gate temperature where the advantage is positive (verl's "
                                           "actor.tau_pos).")
    tau_neg: float = opt(1.05, gt=0.0, help="sapo: gate temperature where the advantage is not positive (verl's "
                                            "actor.tau_neg).")

    def __attrs_post_init__(self) -> None:
        # A parameter of another mode would do nothing: refuse it rather than ignore it.
        for mode, fields in (("clip_cov", ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
                             ("kl_cov", ("kl_cov_ratio", "ppo_kl_coef")), ("sapo", ("tau_pos", "tau_neg"))):
            for f in fields:
                default = attrs.fields_dict(type(self))[f].default
                if self.loss_mode != mode and getattr(self, f) != default:
                    raise FieldValueError(f, f"is a parameter of loss_mode = \"{mode}\" and does nothing with "
                                             f"loss_mode = \"{self.loss_mode}\"")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise FieldValueError("clip_cov_lb", f"{self.clip_cov_lb} must be below clip_cov_ub {self.clip_cov_ub}")


def _optimizer_fields(lr: float, grad_clip_help: str) -> dict[str, Any]:
    # Shared by actor and critic; a function keeps one source for help and ranges.
    return dict(
        lr=opt(lr, gt=0.0, le=10.0, help="Learning rate (AdamW)."),
        weight_decay=opt(0.01, ge=0.0, help="AdamW weight decay."),
        betas=opt(factory=lambda: [0.9, 0.999], check=_check_betas, help="AdamW betas [beta1, beta2]."),
        warmup_steps=opt(0, ge=0, help="Linear learning-rate warm-up, in training steps (verl's unit: its scheduler "
                                       "steps once per training step); the lr rises over every optimizer step in them."),
        warmup_ratio=opt(0.0, ge=0.0, le=1.0, help="Warm-up as a fraction of the training steps, int(ratio x total "
                                                   "steps), as verl's lr_warmup_steps_ratio; used when warmup_steps "
                                                   "is 0."),
        lr_schedule=opt("constant", choices=_LR_SCHEDULES, help="Learning-rate schedule after warm-up."),
        min_lr_ratio=opt(0.0, ge=0.0, le=1.0, help="Final lr as a fraction of lr (cosine/linear)."),
        grad_clip=opt(1.0, gt=0.0, help=grad_clip_help),
    )


def _check_warmup(section: object) -> None:
    if getattr(section, "warmup_steps") > 0 and getattr(section, "warmup_ratio") > 0:
        raise FieldValueError("warmup_ratio", "set warmup_steps or warmup_ratio, not both (warmup_ratio applies only "
                                              "when warmup_steps is 0, as verl's ratio when lr_warmup_steps is -1)")


_A = _optimizer_fields(1e-6, "Clip the actor's global gradient norm to this value.")
_C = _optimizer_fields(1e-5, "Clip the critic's global gradient norm to this value.")


@attrs.frozen(kw_only=True)
class ActorSection:
    """``[actor]``: policy optimisation."""

    lr: float = _A["lr"]
    weight_decay: float = _A["weight_decay"]
    betas: list[float] = _A["betas"]
    warmup_steps: int = _A["warmup_steps"]
    warmup_ratio: float = _A["warmup_ratio"]
    lr_schedule: str = _A["lr_schedule"]
    min_lr_ratio: float = _A["min_lr_ratio"]
    grad_clip: float = _A["grad_clip"]
    ppo_epochs: int = opt(1, ge=1, help="Passes over each rollout batch.")
    ppo_mini_batch_size: int = opt(256, ge=1, help="Prompts per optimizer step (x rollout.n samples), verl's convention.")
    ppo_micro_batch_size_per_gpu: int = opt(4, ge=1, help="Samples per forward/backward on each rank (gradient accumulation).")
    max_tokens_per_micro_batch: int = opt(0, ge=0, help="Token budget of each forward/backward on each rank: rows "
                                                        "packed by length into micro-batches of at most this many "
                                                        "tokens, padding included, each trimmed to its longest prompt "
                                                        "and response (the same gradient); 0 = "
                                                        "ppo_micro_batch_size_per_gpu rows padded to the batch (verl's "
                                                        "use_dynamic_bsz, ppo_max_token_len_per_gpu).")
    clip_ratio: float = opt(0.2, gt=0.0, lt=1.0, help="PPO clip epsilon.")
    clip_ratio_low: float | None = opt(None, gt=0.0, lt=1.0, help="Lower clip epsilon (1 - low); unset = clip_ratio.")
    clip_ratio_high: float | None = opt(None, gt=0.0, help="Upper clip epsilon (1 + high); unset = clip_ratio.")
    clip_ratio_c: float = opt(3.0, gt=1.0, help="Dual-clip bound of the policy loss for negative advantages; must be > 1.")
    loss_agg_mode: str = opt("token-mean", choices=_LOSS_AGG, help="How token losses are aggregated.")
    entropy_coeff: float = opt(0.0, ge=0.0, help="Entropy bonus coefficient.")
    use_kl_loss: bool = opt(False, help="Add a KL(actor || reference) term to the policy loss (GRPO style).")
    kl_loss_coef: float = opt(0.001, ge=0.0, help="Coefficient of the KL loss.")
    kl_loss_type: str = opt("low_var_kl", choices=KL_ESTIMATORS,
                            help="KL estimator of the KL loss; a trailing '+' uses k2's gradient (straight-through).")
    policy_loss: PolicyLossSection = opt(factory=PolicyLossSection, help="The policy loss mode and its parameters.")
    fsdp: FsdpSection = opt(factory=FsdpSection, help="FSDP2 options of the actor.")
    lora: LoraSection = opt(factory=LoraSection, help="LoRA adapters of the actor (rank 0 = full fine-tuning).")

    def __attrs_post_init__(self) -> None:
        _check_warmup(self)


@attrs.frozen(kw_only=True)
class CriticSection:
    """``[critic]``: value model optimisation (used by GAE only). 0 = take the actor's value."""

    lr: float = _C["lr"]
    weight_decay: float = _C["weight_decay"]
    betas: list[float] = _C["betas"]
    warmup_steps: int = _C["warmup_steps"]
    warmup_ratio: float = _C["warmup_ratio"]
    lr_schedule: str = _C["lr_schedule"]
    min_lr_ratio: float = _C["min_lr_ratio"]
    grad_clip: float = _C["grad_clip"]
    ppo_epochs: int = opt(0, ge=0, help="Passes over each rollout batch; 0 = actor.ppo_epochs.")
    ppo_mini_batch_size: int = opt(0, ge=0, help="Prompts per critic optimizer step; 0 = actor.ppo_mini_batch_size.")
    ppo_micro_batch_size_per_gpu: int = opt(0, ge=0, help="Samples per critic forward/backward per rank; 0 = the actor's.")
    max_tokens_per_micro_batch: int = opt(0, ge=0, help="Token budget of each critic forward/backward per rank, as "
                                                        "actor.max_tokens_per_micro_batch; 0 = fixed-size micro-batches "
                                                        "(not the actor's budget).")
    cliprange_value: float = opt(0.5, gt=0.0, help="Value clipping range around the old values.")
    loss_agg_mode: str = opt("token-mean", choices=_LOSS_AGG, help="How token value losses are aggregated.")
    warmup_updates: int = opt(0, ge=0, help="Critic warm-up: the actor is not updated during the first N steps "
                                             "(verl's critic_warmup = N + 1: verl counts steps from 1).")
    fsdp: FsdpSection = opt(factory=FsdpSection, help="FSDP2 options of the critic.")
    lora: LoraSection = opt(factory=LoraSection, help="LoRA adapters of the critic's backbone (its value head "
                                                      "trains whole); rank 0 = full fine-tuning.")

    def __attrs_post_init__(self) -> None:
        _check_warmup(self)
        if self.lora.adapter_path:  # a peft adapter holds no value head: the critic would start half trained
            raise FieldValueError("lora", "adapter_path is the actor's only (a peft adapter holds no value head)")


@attrs.frozen(kw_only=True)
class ReferenceSection:
    """``[reference]``: the frozen reference policy for KL."""

    enable: str = opt("auto", choices=("auto", "on", "off"),
                      help="auto = load it when KL is in the reward or the KL loss is on.")
    offload: bool = opt(False, help="Keep the reference parameters on CPU between uses.")


@attrs.frozen(kw_only=True)
class KlCtrlSection:
    """``[algorithm.kl_ctrl]``: the KL-in-reward coefficient controller."""

    type: str = opt("fixed", choices=("fixed", "adaptive", "step"),
                    help="fixed; adaptive (Ziegler et al.: coef *= 1 + clip(kl/target - 1, +-0.2) * n/horizon); "
                         "step (x factor when KL > target, / factor below, clamped to [min_coef, max_coef]).")
    kl_coef: float = opt(0.001, ge=0.0, help="Initial KL coefficient.")
    target_kl: float = opt(0.1, gt=0.0, help="Target KL of the adaptive and step controllers.")
    horizon: int = opt(10000, ge=1, help="Adaptive controller horizon (in samples).")
    factor: float = opt(1.5, gt=1.0, help="Step controller multiplier.")
    min_coef: float = opt(1e-4, ge=0.0, help="Step controller lower clamp.")
    max_coef: float = opt(10.0, gt=0.0, help="Step controller upper clamp.")

    def __attrs_post_init__(self) -> None:
        if self.min_coef >= self.max_coef:
            raise FieldValueError("min_coef", f"{self.min_coef} must be below max_coef {self.max_coef}")


@attrs.frozen(kw_only=True)
class AlgorithmSection:
    """``[algorithm]``: advantage estimation and the KL penalty in the reward."""

    adv_estimator: str = opt("gae", choices=estimators.names,
                             help="Advantage estimator (hpcppo.estimators); one that needs values (gae) trains a critic.")
    gamma: float = opt(1.0, ge=0.0, le=1.0, help="Discount factor.")
    lam: float = opt(1.0, ge=0.0, le=1.0, help="GAE lambda.")
    norm_adv_by_std_in_grpo: bool = opt(True, help="GRPO: divide by the group's std (false = Dr. GRPO).")
    use_kl_in_reward: bool = opt(False, help="Subtract kl_coef x KL(actor || reference) from the token rewards.")
    kl_penalty: str = opt("kl", choices=KL_ESTIMATORS, help="KL estimator for the reward penalty.")
    kl_ctrl: KlCtrlSection = opt(factory=KlCtrlSection, help="KL coefficient controller.")
    rollout_correction: RolloutCorrectionSection = opt(
        factory=RolloutCorrectionSection, help="Rollout correction (verl's): IS weights and rejection for the gap "
                                               "between the rollout engine's policy and the trainer's.")


@attrs.frozen(kw_only=True)
class TrainerSection:
    """``[trainer]``: the loop."""

    train_batch_size: int = opt(256, ge=1, help="Prompts per step.")
    total_steps: int = opt(0, ge=0, help="Steps to train; 0 = total_epochs x steps per epoch.")
    total_epochs: int = opt(1, ge=1, help="Epochs over the training prompts when total_steps = 0.")
    test_freq: int = opt(0, ge=-1, help="Validate every N steps; 0 or -1 = never (verl's trainer.test_freq: -1 is "
                                        "its default and means never).")
    val_before_train: bool = opt(False, help="Validate once before the first step.")
    log_every: int = opt(1, ge=1, help="Print a progress line every N steps (metrics are recorded every step).")
    deterministic: bool = opt(False, help="Deterministic algorithms (torch.use_deterministic_algorithms); slower. On "
                                          "CUDA refused with ReMax and with the hf engine's top_p < 1 (a float "
                                          "cumsum raises there); docs/gpu.md says what it costs.")
    collective_timeout_s: float = opt(1800.0, gt=0.0,
                                      help="torch.distributed timeout: a rank stuck in a collective fails after this.")
    logger: list[str] = opt(factory=lambda: ["console"], check=_check_loggers,
                            help="Trackers beside the HDF5 log (verl's trainer.logger): console (the progress line, "
                                 "always on), tensorboard (RUN/tensorboard), wandb (offline, RUN/wandb; wandb sync "
                                 "uploads it); pip install 'hpcppo[trackers]'.")
    project_name: str = opt("", help="wandb's project (verl's trainer.project_name); \"\" = the experiment's name. "
                                     "Only with \"wandb\" in logger.")

    def __attrs_post_init__(self) -> None:
        if self.project_name and "wandb" not in self.logger:
            raise FieldValueError("project_name", "names wandb's project and does nothing without \"wandb\" in "
                                                  "trainer.logger")


@attrs.frozen(kw_only=True)
class CheckpointSection:
    """``[checkpoint]``: saving and resuming."""

    save_every: int = opt(0, ge=-1, help="Checkpoint every N steps and at the end; 0 = only at the end; -1 = never, "
                                         "not even at the end (verl's trainer.save_freq = -1). Preemption "
                                         "checkpoints follow save_on_preempt either way.")
    keep_last: int = opt(3, ge=0, help="Committed checkpoints kept; 0 = keep all (the newest is never deleted).")
    save_on_preempt: bool = opt(True, help="Checkpoint when Slurm signals the time limit or preemption (USR2).")
    resume: str = opt("auto", choices=("auto", "never"), help="auto = continue from the newest committed checkpoint.")
    # Off by default: the staged copy costs host memory the size of this rank's model + optimizer shards at every
    # save, the write competes with training for CPU cores and I/O, and a kill during the write falls back one
    # save further. Worth it where the write is long against a step (large models, slow shared filesystems).
    async_save: bool = opt(False, help="Periodic checkpoints wait only for a copy of the state to host memory; the write "
                           "and the commit overlap the next steps (the final and preemption saves stay synchronous).")


@attrs.frozen(kw_only=True)
class ResourcesSection:
    """``[resources]``: what the job asks the site for."""

    nodes: int = opt(1, ge=1, help="Nodes.")
    gpus_per_node: int = opt(0, ge=0, help="GPUs (= ranks) per node on GPU sites; 0 = all of the site's.")
    procs_per_node: int = opt(0, ge=0, help="Ranks per node on CPU sites; 0 = the site's local.procs_per_node (local) or 1 (Slurm).")
    time: str = opt("01:00:00", check=_check_time, allowed=_TIME_ALLOWED, help="Wall-time limit (Slurm format: D-HH:MM:SS, HH:MM:SS, MM:SS, minutes).")
    hsdp: str = opt("auto", choices=("auto", "on", "off"),
                    help="Hybrid sharding (replicate across nodes, shard within a node); auto = on when nodes > 1.")
    rollout_ranks_per_node: int = opt(0, ge=0, help="rollout.placement = \"split\": ranks of each node that only "
                                                    "generate (its last local ranks; the others train); 0 = none. "
                                                    "Exactly one of this and rollout_nodes is > 0 in split mode.")
    rollout_nodes: int = opt(0, ge=0, help="rollout.placement = \"split\": whole nodes (the job's last ones) whose "
                                           "ranks only generate; 0 = none. Exactly one of this and "
                                           "rollout_ranks_per_node is > 0 in split mode.")


@attrs.frozen(kw_only=True)
class Experiment:
    """An experiment spec: everything about the training run that is not about the machine."""

    name: str = opt(help="Experiment name; the run id starts with it.", pattern=NAME_PATTERN, check=_check_name,
                    allowed=NAME_ALLOWED)
    seed: int = opt(1, ge=0, help="Seed of data order, sampling and initialisation.")
    description: str = opt("", help="Free text about the experiment.")
    model: ModelSection = opt(help="Models.")
    data: DataSection = opt(help="Datasets and reward.")
    rollout: RolloutSection = opt(factory=RolloutSection, help="Generation.")
    actor: ActorSection = opt(factory=ActorSection, help="Policy optimisation.")
    critic: CriticSection = opt(factory=CriticSection, help="Value model optimisation.")
    reference: ReferenceSection = opt(factory=ReferenceSection, help="Reference policy.")
    reward_model: RewardModelSection = opt(factory=RewardModelSection, help="A reward model scoring the responses.")
    reward_manager: RewardManagerSection = opt(factory=RewardManagerSection,
                                               help="How rule-based scores become rewards (DAPO's overlong buffer).")
    algorithm: AlgorithmSection = opt(factory=AlgorithmSection, help="Advantages and KL penalty.")
    trainer: TrainerSection = opt(factory=TrainerSection, help="Training loop.")
    checkpoint: CheckpointSection = opt(factory=CheckpointSection, help="Checkpoints.")
    resources: ResourcesSection = opt(factory=ResourcesSection, help="Nodes, GPUs and time.")
    watchdog: WatchdogSection = opt(factory=WatchdogSection, help="Watchdog and its rules.")
    debug: DebugSection = opt(factory=DebugSection, help="Fault injection, to rehearse recovery.")
