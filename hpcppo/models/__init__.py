"""The three networks of PPO (:mod:`.networks`) and the batched forwards the trainer runs on them (:mod:`.forward`).

* actor — a Hugging Face causal LM (``build_actor``), trained;
* reference — the same, frozen (``build_reference``);
* critic — an HF backbone without its LM head plus a scalar value head (``Critic``, ``build_critic``).

Position conventions (verl's): a sequence is ``cat(prompt, response)`` with the response in the last ``R``
columns. The logits that *predict* response token ``j`` sit at position ``P + j - 1``, i.e. ``logits[:, -R-1:-1]``;
values use the same slice (``values[:, -R-1:-1]``, verl ``dp_critic``): the value of the state just before each
response token is generated. Log-probs are taken of ``logits / temperature`` in float32, as verl's actor does.

Two levels of API: ``forward_log_probs`` / ``forward_values`` run one micro-batch *with* autograd (the update
loop calls them inside its loss); ``compute_log_probs`` / ``compute_values`` run a whole batch in micro-batches
under ``torch.no_grad()`` (old/reference log-probs and values before the update); ``compute_log_prob_outputs``
also gives the entropy and ``sum_pi_squared`` (the optimal token baselines' input) from the same pass.
"""

from __future__ import annotations

from hpcppo.models import forward, networks
from hpcppo.models.forward import (LOGITS_CHUNK_ELEMENTS, LogProbOutputs, compute_log_prob_outputs,
                                   compute_log_probs, compute_values, forward_log_probs, forward_log_probs_packed,
                                   forward_values, forward_values_packed, row_lengths, trimmed_columns)
from hpcppo.models.networks import (DTYPES, VALUE_HEAD_FILE, VALUE_HEAD_SEED, Critic, as_torch_dtype, build_actor,
                                    build_critic, build_reference, load_causal_lm, parameters_on_meta,
                                    position_ids_from_mask)

__all__ = ["DTYPES", "LOGITS_CHUNK_ELEMENTS", "VALUE_HEAD_FILE", "VALUE_HEAD_SEED", "Critic", "LogProbOutputs",
           "as_torch_dtype", "build_actor", "build_critic", "build_reference", "compute_log_prob_outputs",
           "compute_log_probs", "compute_values", "forward", "forward_log_probs", "forward_log_probs_packed",
           "forward_values", "forward_values_packed", "load_causal_lm", "networks", "parameters_on_meta", "position_ids_from_mask", "row_lengths",
           "trimmed_columns"]
# The chunk size is read from hpcppo.models.forward at each call: a test sets it there, not here.
