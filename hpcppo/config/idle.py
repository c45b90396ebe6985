"""Settings the user wrote (in the spec or with ``-o``) that do nothing in their combination: each is named in one
``hpcppo: warning:`` line (:class:`hpcppo.errors.SettingWarning`) and compile goes on. A value that cannot take
effect *and* changes what the user would expect is refused where it is checked instead; these are merely useless.

Only keys whose provenance is ``spec`` or ``override`` count: a site's ``[defaults]`` (e.g. the local site's vLLM
KV-cache size) are the site's business, not a choice of the user's to warn about.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from hpcppo import estimators
from hpcppo.config.experiment import Experiment
from hpcppo.errors import SettingWarning

__all__ = ["idle_settings", "warn_idle_settings", "VLLM_ONLY_KEYS"]

USER_LAYERS = ("spec", "override")
# rollout keys only the vLLM engine reads (hpcppo.rollout.vllm_engine); the HF loop has no KV-cache pool or graphs.
VLLM_ONLY_KEYS = ("rollout.gpu_memory_utilization", "rollout.kv_cache_memory_mb", "rollout.enforce_eager",
                  "rollout.free_cache_engine")


def _set_by_user(provenance: Mapping[str, str], prefix: str) -> list[str]:
    """Keys equal to ``prefix`` or under it (``prefix.``) that the spec or an override set."""
    return sorted(k for k, layer in provenance.items()
                  if layer in USER_LAYERS and (k == prefix or k.startswith(prefix + ".")))


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def idle_settings(exp: Experiment, provenance: Mapping[str, str]) -> list[str]:
    """One message per group of user-set keys that do nothing with the rest of ``exp``."""
    out = []
    vllm = [k for key in VLLM_ONLY_KEYS for k in _set_by_user(provenance, key)]
    if exp.rollout.engine != "vllm" and vllm:
        out.append(f"{_shown(vllm)}: only the vLLM engine reads them; rollout.engine = {exp.rollout.engine!r} "
                   "ignores them")
    critic = _set_by_user(provenance, "critic")
    if critic and not estimators.needs_critic(exp.algorithm.adv_estimator):
        out.append(f"{_shown(critic)}: algorithm.adv_estimator = {exp.algorithm.adv_estimator!r} trains no critic, "
                   "so no critic key has an effect")
    rm = [k for k in _set_by_user(provenance, "reward_model") if k != "reward_model.enable"]
    if rm and not exp.reward_model.enable:
        out.append(f"{_shown(rm)}: reward_model.enable is false, so no reward model key has an effect")
    out += _idle_placement(exp, provenance)
    turns = _set_by_user(provenance, "rollout.multi_turn")
    turns = [k for k in turns if k != "rollout.multi_turn.enable"]
    if turns and not exp.rollout.multi_turn.enable:
        out.append(f"{_shown(turns)}: rollout.multi_turn.enable is false, so no multi-turn key has an effect")
    out += _idle_validation(exp, provenance)
    out += _idle_overlong(exp, provenance)
    return out


def _idle_placement(exp: Experiment, provenance: Mapping[str, str]) -> list[str]:
    """rollout.max_staleness bounds the queue of a split run; rollout ranks never sleep (hpcppo.placement)."""
    if exp.rollout.placement != "split":
        return (["rollout.max_staleness: only rollout.placement = \"split\" has rollout ranks that generate ahead of "
                 "the trainers; colocated runs are on-policy"] if _set_by_user(provenance, "rollout.max_staleness")
                else [])
    if exp.rollout.engine == "vllm" and _set_by_user(provenance, "rollout.free_cache_engine"):
        return ["rollout.free_cache_engine: rollout ranks never sleep in rollout.placement = \"split\" (no training "
                "shares their memory), so it has no effect"]
    return []


def _idle_validation(exp: Experiment, provenance: Mapping[str, str]) -> list[str]:
    keys = [k for name in ("val_n", "val_temperature", "val_top_p") for k in _set_by_user(provenance, f"rollout.{name}")]
    t = exp.trainer
    if keys and (not exp.data.val_files or (t.test_freq <= 0 and not t.val_before_train)):
        why = "data.val_files is empty" if not exp.data.val_files else "trainer.test_freq <= 0 and val_before_train " \
                                                                      "is false"
        return [f"{_shown(keys)}: validation never runs ({why})"]
    r = exp.rollout
    if r.val_temperature == 0.0:
        if r.val_n > 1 and _set_by_user(provenance, "rollout.val_n"):
            return [f"rollout.val_n = {r.val_n} with greedy validation (val_temperature = 0): the {r.val_n} responses "
                    "per prompt are the same one; set val_temperature > 0 or val_n = 1"]
        if _set_by_user(provenance, "rollout.val_top_p") and r.val_top_p != 1.0:
            return ["rollout.val_top_p does nothing with greedy validation (val_temperature = 0)"]
    return []


def _idle_overlong(exp: Experiment, provenance: Mapping[str, str]) -> list[str]:
    """DAPO's overlong buffer (verl's DAPORewardManager): penalty min(-(L - (max_resp_len - len)) / len * factor, 0)
    for a response of L <= data.max_response_length tokens."""
    m, buffer = exp.reward_manager, exp.reward_manager.overlong_buffer
    keys = [k for k in _set_by_user(provenance, "reward_manager.overlong_buffer")
            if k != "reward_manager.overlong_buffer.enable"] + _set_by_user(provenance, "reward_manager.max_resp_len")
    if not (m.name == "dapo" and buffer.enable):
        return [f"{_shown(keys)}: the overlong buffer is off (reward_manager.name = \"dapo\" and "
                "overlong_buffer.enable = true turn it on)"] if keys else []
    max_resp, longest = m.max_resp_len or exp.data.max_response_length, exp.data.max_response_length
    if max_resp - buffer.len >= longest:
        return [f"the overlong penalty never applies: it starts past max_resp_len - len = {max_resp} - {buffer.len} "
                f"= {max_resp - buffer.len} tokens, and no response is longer than data.max_response_length = "
                f"{longest}"]
    if buffer.len == max_resp:
        return [f"reward_manager.overlong_buffer.len = max_resp_len = {max_resp}: the buffer starts at 0 tokens, so "
                "every response is penalised by its whole length"]
    return []


def warn_idle_settings(exp: Experiment, provenance: Mapping[str, str]) -> None:
    for message in idle_settings(exp, provenance):
        warnings.warn(message, SettingWarning, stacklevel=2)
