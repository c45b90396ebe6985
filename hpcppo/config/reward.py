"""``[reward_model]`` and ``[reward_manager]``: a reward model that scores the responses, and verl's DAPO reward
manager (an overlong penalty on the rule-based score). The login-node checks of the reward model's directory are in
:mod:`hpcppo.config.reward_check`.

verl's semantics (volcengine/verl b178a3c), which these follow:

- With ``reward_model.enable`` the reward model's score *replaces* the rule-based score: verl's trainer puts the
  model's scores in the batch as ``rm_scores`` (``RayPPOTrainer.fit`` in verl/trainer/ppo/ray_trainer.py), and both
  ``_compute_or_extract_reward`` there and every reward manager's ``_extract_reward_from_rm_scores``
  (verl/workers/reward_manager/abstract.py) return them unchanged, without calling the rule-based function or the
  manager's own logic. So a reward manager's options (the DAPO overlong buffer) have no effect with a reward model;
  hpcppo refuses the combination instead of ignoring one of them. Validation stays rule-based (``_validate`` scores
  with ``val_reward_fn``).
- The DAPO manager (verl/workers/reward_manager/dapo.py, ``DAPORewardManager.__call__``; the reward loop's copy in
  verl/experimental/reward_loop/reward_manager/dapo.py, ``run_single``, is the same formula) adds
  ``min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)`` to the score of a response of ``L`` tokens.
"""

from __future__ import annotations

import attrs

from hpcppo.config.fields import FieldValueError, opt
from hpcppo.errors import ConfigError

__all__ = ["RewardModelSection", "RewardManagerSection", "OverlongBufferSection", "REWARD_MANAGERS",
           "check_reward_combination"]

#: verl's registered reward managers this hpcppo has (verl/workers/reward_manager/__init__.py).
REWARD_MANAGERS = ("naive", "dapo")


@attrs.frozen(kw_only=True)
class RewardModelSection:
    """``[reward_model]``: a sequence-classification model that scores each (prompt, response), as verl's
    ``reward_model.enable`` (its score replaces data.reward_fn's in training; validation stays rule-based)."""

    enable: bool = opt(False, help="Score the rollout's responses with the reward model at path (verl's "
                                   "reward_model.enable); its score replaces data.reward_fn's in training.")
    path: str = opt("", path=True, help="Hugging Face directory of the reward model: a *ForSequenceClassification "
                                        "with one label (num_labels = 1) and its tokenizer, with a chat template "
                                        "(verl's reward_model.model.path).")
    tokenizer_path: str = opt("", path=True, help="The reward model's tokenizer directory; \"\" = path.")
    max_length: int = opt(0, ge=0, help="Longest re-templated (prompt, response) the reward model reads, in its "
                                        "tokens; longer ones are cut from the right (verl's reward_model.max_length "
                                        "and truncation); 0 = data.max_prompt_length + data.max_response_length "
                                        "(verl's default: the batch's width).")
    micro_batch_size_per_gpu: int = opt(0, ge=0, help="Rows per reward-model forward on each GPU; 0 = "
                                                      "rollout.log_prob_micro_batch_size_per_gpu.")
    max_tokens_per_micro_batch: int = opt(0, ge=0, help="Token budget per forward (padding included) instead of a "
                                                        "fixed row count (verl's use_dynamic_bsz with "
                                                        "forward_max_token_len_per_gpu); 0 = use "
                                                        "micro_batch_size_per_gpu.")
    offload: bool = opt(False, help="Keep the reward model's shards on the CPU between uses (verl's "
                                    "fsdp_config.param_offload).")
    dtype: str = opt("", choices=("", "bfloat16", "float16", "float32"),
                     help="Compute dtype of the reward model; \"\" = model.dtype (verl scores in bfloat16).")

    def __attrs_post_init__(self) -> None:
        if self.enable and not self.path:
            raise FieldValueError("path", "is empty but enable is true; allowed: the reward model's directory")


@attrs.frozen(kw_only=True)
class OverlongBufferSection:
    """``[reward_manager.overlong_buffer]``: DAPO's soft overlong penalty (verl's
    ``reward_model.reward_kwargs.overlong_buffer_cfg``)."""

    enable: bool = opt(False, help="Penalise responses longer than max_resp_len - len (DAPO's overlong buffer).")
    len: int = opt(0, ge=0, help="Length of the buffer in tokens: the penalty grows from 0 at max_resp_len - len to "
                                 "-penalty_factor at max_resp_len.")
    penalty_factor: float = opt(1.0, ge=0.0, help="The penalty at max_resp_len tokens.")
    log: bool = opt(False, help="Log the penalty: reward_manager/overlong_reward_mean and "
                                "reward_manager/overlong_frac (verl's overlong_reward and overlong extra info).")

    def __attrs_post_init__(self) -> None:
        if self.enable and self.len < 1:
            raise FieldValueError("len", "must be at least 1 when enable is true (the penalty divides by it)")


@attrs.frozen(kw_only=True)
class RewardManagerSection:
    """``[reward_manager]``: how rule-based scores become rewards (verl's ``reward_manager.name``)."""

    name: str = opt("naive", choices=REWARD_MANAGERS,
                    help="naive = the reward function's score; dapo = the score plus DAPO's overlong penalty "
                         "(overlong_buffer), in training and validation, as verl's DAPORewardManager.")
    max_resp_len: int = opt(0, ge=0, help="The response length the overlong buffer counts to (verl's "
                                          "reward_kwargs.max_resp_len); 0 = data.max_response_length.")
    overlong_buffer: OverlongBufferSection = opt(factory=OverlongBufferSection,
                                                 help="DAPO's overlong penalty (only with name = \"dapo\").")

    def __attrs_post_init__(self) -> None:
        if self.overlong_buffer.enable and self.name != "dapo":
            raise FieldValueError("overlong_buffer", f"is enabled but name is {self.name!r}; allowed: "
                                                     f"name = \"dapo\" (verl's naive manager has no overlong buffer)")


def overlong_buffer_on(manager: RewardManagerSection) -> bool:
    """Whether rewards carry DAPO's overlong penalty (then validation also logs the score before it, verl's acc)."""
    return manager.name == "dapo" and manager.overlong_buffer.enable


def check_reward_combination(reward_model: RewardModelSection, manager: RewardManagerSection,
                             max_response_length: int, *, file: str | None = None) -> None:
    """``ConfigError`` for settings that could not all take effect (see the module's docstring)."""
    if reward_model.enable and manager.name != "naive":
        raise ConfigError(f"{manager.name!r} with reward_model.enable: verl returns the reward model's scores "
                          f"unchanged (rm_scores skip the reward manager), so the manager would do nothing; allowed: "
                          f"\"naive\" with a reward model", file=file, key="reward_manager.name")
    buffer = manager.overlong_buffer
    max_resp = manager.max_resp_len or max_response_length
    if buffer.enable and buffer.len > max_resp:
        raise ConfigError(f"{buffer.len} is longer than max_resp_len {max_resp} (verl asserts max_resp_len >= "
                          f"overlong_buffer.len); allowed: 1 to {max_resp}", file=file,
                          key="reward_manager.overlong_buffer.len")
