"""The forwards the trainer runs on the networks: log-probs (and entropy) of response tokens over chunks of the
vocabulary, values, the packed (padding-free) variants, and whole batches in micro-batches: fixed-size, or rows
grouped under a token budget and trimmed of padding. The position conventions are the package's
(:mod:`hpcppo.models`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpcppo.algos.losses import entropy_from_logits, entropy_metric


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  response_len: int) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape or position_ids.shape != input_ids.shape:
        raise ValueError(f"input_ids, attention_mask, position_ids must all be [B, T]; got {tuple(input_ids.shape)}, "
                         f"{tuple(attention_mask.shape)}, {tuple(position_ids.shape)}")
    if not 0 < response_len < input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, T-1] (T={input_ids.shape[1]}), got {response_len}")


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


LOGITS_CHUNK_ELEMENTS = 1 << 26
"""Logits per chunk of :func:`forward_log_probs` (256 MiB in float32): the LM head, the log-softmax, the gather and
the entropy run over chunks of response positions of about this many logits, never over the whole
``[micro_batch, response, vocab]`` block (a 150k vocabulary at 4k positions is 2.4 GB of float32 per row of the
micro-batch). A micro-batch whose logits fit one chunk runs exactly as one block."""

# Configuration attributes of models whose forward changes the LM head's output before returning it (Gemma 2/3's
# soft-capping, Cohere's and Granite's scales): their log-probs are taken from the whole logits, as before.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _chunkable_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when :func:`forward_log_probs` may stand in for it (an ``nn.Linear`` at ``lm_head``,
    applied by the model's forward to ``slice_logits_to_keep(hidden)`` and returned as ``logits`` untouched), else
    None."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Linear) or not _accepts_logits_to_keep(model):
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return head


def _token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                     entropy_grad: bool, with_sum_pi_squared: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``[B, r, V]`` logits in any dtype, ``[B, r]`` targets -> float32 ``[B, r]`` log-probs (and entropies, and
    ``sum_v pi_v^2``: :func:`_sum_pi_squared_in_place`, which consumes the float32 logits, so it comes last)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits.div_(temperature)  # in place (as verl does): one [B, r, V] float32 tensor fewer
    # gather - logsumexp: the same value as log_softmax().gather() without a second [B, r, V] tensor. The gather
    # comes first: autograd runs the later node's backward first, so logsumexp's backward is done with its
    # [B, r, V] temporaries before the gather's [B, r, V] gradient is made; the other order keeps one more float32
    # [B, r, V] tensor alive at the backward's peak (tests/unit/test_plan_activations.py measures it).
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(logits, dim=-1)
    log_probs = picked - lse
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits) if entropy_grad else entropy_metric(logits)
    sum_pi_squared = _sum_pi_squared_in_place(logits, lse) if with_sum_pi_squared else None
    return log_probs, entropy, sum_pi_squared


def _sum_pi_squared_in_place(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(z)_v^2`` per position of float32 ``z`` ``[..., V]`` (the logits over the temperature) whose
    ``logsumexp`` is ``lse``: ``exp(logsumexp(2z) - 2 logsumexp(z))``, verl's ``calculate_sum_pi_squared_from_logits``
    (verl/utils/torch_functional.py), with ``logsumexp(2z) = 2m + log sum exp(2(z - m))`` for the row maximum ``m``
    taken in ``z``'s own storage: no tensor of ``z``'s size is allocated (``torch.logsumexp`` would make two), and
    ``z`` is overwritten. No autograd: the value is an input of the advantage estimator, not of a loss."""
    if z.requires_grad:
        raise ValueError("sum_pi_squared is computed without autograd (the old-log-prob pass), and it overwrites "
                         "the logits it is given")
    m = z.amax(dim=-1, keepdim=True)
    z.sub_(m).mul_(2.0).exp_()  # every entry in (0, 1], the maximum's exactly 1: no overflow, no underflow to 0 sum
    log_sum_sq = z.sum(dim=-1).log_() + 2.0 * m.squeeze(-1)
    return (log_sum_sq - 2.0 * lse).exp_()

def _chunk_positions(batch: int, response_len: int, vocab: int, chunk_elements: int) -> int:
    """Response positions per chunk: ``batch x positions x vocab`` within ``chunk_elements``, at least one."""
    return max(1, chunk_elements // max(1, batch * vocab))


Outputs = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]
"""``(log_probs, entropy, sum_pi_squared)``, each ``[B, R]`` float32; the last two None when not asked for."""


def _stack(outputs: Outputs) -> torch.Tensor:
    """One ``[B, r, k]`` tensor of the outputs asked for, in :data:`Outputs`' order (:func:`_unstack` reverses it)."""
    return torch.stack([t for t in outputs if t is not None], dim=-1)


def _unstack(out: torch.Tensor, with_entropy: bool, with_sum_pi_squared: bool) -> Outputs:
    entropy = out[..., 1] if with_entropy else None
    return out[..., 0], entropy, (out[..., 1 + with_entropy] if with_sum_pi_squared else None)


class _LogProbHead(nn.Module):
    """Stands in for a model's LM head during one forward of :func:`forward_log_probs`.

    It receives what the head would (the hidden states of the last ``R + 1`` positions) and returns ``[B, R, k]``:
    the log-probs, then the entropies and ``sum_pi_squared`` when asked for (:func:`_stack`), computed chunk by chunk
    of positions; the model's forward
    returns that as its ``logits``. Running inside the model's own forward matters under FSDP2: the root unit's
    parameters (the head's weight among them) are gathered there, and its backward hooks are put on that output.

    With autograd, each chunk is checkpointed (``torch.utils.checkpoint``, non-reentrant): only its hidden states are
    kept, and backward recomputes the chunk's logits (one more LM-head matmul over the response) instead of holding
    every chunk's logits, softmax and gradients at once.
    """

    head: nn.Linear  # set with object.__setattr__ below: declared here, as nn.Module's attribute lookup cannot type it

    def __init__(self, head: nn.Linear, targets: torch.Tensor, *, temperature: float, with_entropy: bool,
                 entropy_grad: bool, chunk_elements: int, with_sum_pi_squared: bool = False):
        super().__init__()
        object.__setattr__(self, "head", head)  # not a child: the model's parameter names stay as they are
        self.targets, self.temperature = targets, temperature
        self.with_entropy, self.entropy_grad, self.chunk_elements = with_entropy, entropy_grad, chunk_elements
        self.with_sum_pi_squared = with_sum_pi_squared
        self.output: torch.Tensor | None = None

    def _chunk(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               targets: torch.Tensor) -> torch.Tensor:
        return _stack(_token_log_probs(nn.functional.linear(hidden, weight, bias), targets, self.temperature,
                                       self.with_entropy, self.entropy_grad, self.with_sum_pi_squared))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        targets = self.targets
        batch, response_len = targets.shape
        weight, bias = self.head.weight, self.head.bias
        step = _chunk_positions(batch, response_len, weight.shape[0], self.chunk_elements)
        if step >= response_len:  # one chunk: the LM head over the R + 1 positions, exactly as the whole forward
            self.output = _stack(_token_log_probs(nn.functional.linear(hidden, weight, bias)[:, :-1], targets,
                                                  self.temperature, self.with_entropy, self.entropy_grad,
                                                  self.with_sum_pi_squared))
            return self.output
        grad = torch.is_grad_enabled()
        parts = []
        for lo in range(0, response_len, step):
            hi = min(lo + step, response_len)
            args = (hidden[:, lo:hi], weight, bias, targets[:, lo:hi])
            parts.append(checkpoint(self._chunk, *args, use_reentrant=False, preserve_rng_state=False) if grad
                         else self._chunk(*args))
        self.output = torch.cat(parts, dim=1)
        return self.output


def forward_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the last ``response_len`` tokens, for one micro-batch, with autograd.

    Args:
        model: an HF causal LM (possibly FSDP-sharded).
        input_ids, attention_mask, position_ids: ``[B, T]``, response in the last ``R = response_len`` columns.
        temperature: logits are divided by it (the rollout's sampling temperature; 1 for greedy rollouts).
        entropy_grad: with False the entropy is a metric only (:func:`~hpcppo.algos.losses.entropy_metric`: the same
            values, detached, computed in blocks), so no ``[B, R, V]`` softmax is kept for backward.
        chunk_elements: logits per chunk (default :data:`LOGITS_CHUNK_ELEMENTS`).

    Returns:
        ``log_probs [B, R]`` float32 = ``log_softmax(logits / T)[response token]`` and ``entropy [B, R]`` float32
        (or None). The LM head, log-softmax, gather and entropy run over chunks of response positions of at most
        ``chunk_elements`` logits (or one position of every row, if that is more), inside the model's forward
        (``_LogProbHead``); for a model whose forward transforms the head's output (``_LOGIT_TRANSFORMS``) or that
        has no ``lm_head``, from the whole ``R + 1`` last positions' logits (``logits_to_keep``).
    """
    lp, ent, _ = _outputs_padded(model, input_ids, attention_mask, position_ids, response_len,
                                 temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                 with_sum_pi_squared=False, chunk_elements=chunk_elements)
    return lp, ent


def _outputs_padded(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, response_len: int, *, temperature: float, with_entropy: bool,
                    entropy_grad: bool, with_sum_pi_squared: bool, chunk_elements: int | None) -> Outputs:
    """:func:`forward_log_probs`, with ``sum_pi_squared`` too when asked for."""
    _check_inputs(input_ids, attention_mask, position_ids, response_len)
    targets = input_ids[:, -response_len:]
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    head = _chunkable_head(model)
    if head is None:
        extra = {"logits_to_keep": response_len + 1} if _accepts_logits_to_keep(model) else {}
        logits = model(**kwargs, **extra).logits[:, -response_len - 1:-1, :]
        return _token_log_probs(logits, targets, temperature, with_entropy, entropy_grad, with_sum_pi_squared)
    stand_in = _LogProbHead(head, targets, temperature=temperature, with_entropy=with_entropy,
                            entropy_grad=entropy_grad, with_sum_pi_squared=with_sum_pi_squared,
                            chunk_elements=LOGITS_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements)
    return _unstack(_run_with_stand_in(model, head, stand_in, kwargs, response_len + 1), with_entropy,
                    with_sum_pi_squared)


def _run_with_stand_in(model: nn.Module, head: nn.Linear, stand_in: _LogProbHead, kwargs: dict[str, Any],
                       logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The model's forward with ``stand_in`` as its LM head: what the stand-in returned, ``[B, r, k]``."""
    model.lm_head = stand_in
    try:
        out: torch.Tensor = model(**kwargs, logits_to_keep=logits_to_keep).logits
    finally:
        model.lm_head = head
    if out is not stand_in.output:  # the forward transformed what the head returned: these are not log-probs
        raise RuntimeError(f"{type(model).__name__}'s forward changed its LM head's output; add the config attribute "
                           "that makes it do so to hpcppo.models.forward._LOGIT_TRANSFORMS")
    return out


def forward_values(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
) -> torch.Tensor:
    """Values of the states preceding each response token, one micro-batch, with autograd: ``[B, R]`` float32
    (``critic(...)[:, -R-1:-1]``, verl's convention)."""
    _check_inputs(input_ids, attention_mask, position_ids, response_len)
    values = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return values[:, -response_len - 1:-1].float()


def _pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
          response_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...],
                                      torch.Tensor]:
    """A left/right-padded ``[B, T]`` micro-batch as one packed sequence: ``ids``, ``positions`` ``[1, N]`` (its
    ``N`` real tokens row after row; positions restart at 0 with each row), the packed positions whose outputs score
    each response token (the one before it in its row), those tokens' ``(row, column)`` in ``[B, R]``, and the
    tokens themselves."""
    keep = attention_mask != 0
    packed_index = keep.flatten().long().cumsum(0).view_as(keep) - 1
    response = keep[:, -response_len:]
    where = response.nonzero(as_tuple=True)
    scored = packed_index[:, -response_len:][response] - 1
    return input_ids[keep][None], position_ids[keep][None], scored, where, input_ids[:, -response_len:][response]


def forward_log_probs_packed(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_log_probs` without padding: the same arguments and ``[B, R]`` outputs (0 off the response
    tokens), computed on the micro-batch's rows packed into one sequence (:func:`_pack`) with no attention mask, so
    that transformers keeps the rows apart by their restarting position ids (``masking_utils.create_causal_mask``
    for sdpa and eager, ``flash_attn_varlen_func`` with ``cu_seqlens`` from the position ids for flash_attention_2/3;
    tests/unit/test_packed_rows.py). Only the packed positions that score a response token reach the LM head
    (``logits_to_keep`` as indices), in chunks as in :func:`forward_log_probs`.
    """
    lp, ent, _ = _outputs_packed(model, input_ids, attention_mask, position_ids, response_len,
                                 temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                 with_sum_pi_squared=False, chunk_elements=chunk_elements)
    return lp, ent


def _outputs_packed(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, response_len: int, *, temperature: float, with_entropy: bool,
                    entropy_grad: bool, with_sum_pi_squared: bool, chunk_elements: int | None) -> Outputs:
    """:func:`forward_log_probs_packed`, with ``sum_pi_squared`` too when asked for."""
    _check_inputs(input_ids, attention_mask, position_ids, response_len)
    ids, positions, scored, where, targets = _pack(input_ids, attention_mask, position_ids, response_len)
    # A micro-batch without a response token still runs its forward (every rank runs as many as the others): it
    # scores its last position, and the result stays in the graph with weight 0.
    empty = scored.numel() == 0
    if empty:
        scored, targets = torch.tensor([ids.shape[1] - 1], device=ids.device), ids[0, -1:]
    # The stand-in head drops the last position it receives (there the model's last token, which scores nothing):
    # one more index, repeated, keeps the same code for both.
    keep = torch.cat([scored, scored[-1:]])
    kwargs = dict(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False)
    head = _chunkable_head(model)
    if head is None:
        if not _accepts_logits_to_keep(model):
            raise ValueError(f"{type(model).__name__} takes no logits_to_keep: its log-probs cannot be packed")
        logits = model(**kwargs, logits_to_keep=keep).logits[:, :-1, :]
        packed = _token_log_probs(logits, targets[None], temperature, with_entropy, entropy_grad, with_sum_pi_squared)
    else:
        stand_in = _LogProbHead(head, targets[None], temperature=temperature, with_entropy=with_entropy,
                                entropy_grad=entropy_grad, with_sum_pi_squared=with_sum_pi_squared,
                                chunk_elements=LOGITS_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements)
        packed = _unstack(_run_with_stand_in(model, head, stand_in, kwargs, keep), with_entropy, with_sum_pi_squared)
    lp, ent, spi = (None if t is None else _unpack(t[0], where, input_ids.shape[0], response_len, empty)
                    for t in packed)
    assert lp is not None
    return lp, ent, spi


def _unpack(packed: torch.Tensor, where: tuple[torch.Tensor, ...], rows: int, response_len: int,
            empty: bool) -> torch.Tensor:
    out = torch.zeros((rows, response_len), dtype=torch.float32, device=packed.device)
    if empty:
        return out + 0.0 * packed.sum()
    return out.index_put(where, packed.float())


def forward_values_packed(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
) -> torch.Tensor:
    """:func:`forward_values` without padding (the rows packed as in :func:`forward_log_probs_packed`): ``[B, R]``
    float32, 0 off the response tokens."""
    _check_inputs(input_ids, attention_mask, position_ids, response_len)
    ids, positions, scored, where, _ = _pack(input_ids, attention_mask, position_ids, response_len)
    values = critic(input_ids=ids, attention_mask=None, position_ids=positions)[0]
    empty = scored.numel() == 0
    return _unpack(values[-1:] if empty else values[scored], where, input_ids.shape[0], response_len, empty)


def _micro_batches(batch: int, micro_batch_size: int) -> list[slice]:
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [slice(i, min(i + micro_batch_size, batch)) for i in range(0, batch, micro_batch_size)]


def row_lengths(attention_mask: torch.Tensor, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt and response extent in columns: ``[B]`` longs ``(prompt, response)``.

    The prompt is left padded, so its extent runs from the row's first attended prompt column to the end of the
    prompt; the response is right padded, so its extent runs from the start of the response to its last attended
    column (0 for a row with no response token).
    """
    prompt = attention_mask[:, :-response_len] != 0
    response = attention_mask[:, -response_len:] != 0
    first = prompt.long().argmax(dim=-1)  # the first attended column (0 when none is)
    prompt_len = torch.where(prompt.any(dim=-1), prompt.shape[1] - first, 0)
    last = response_len - response.flip(-1).long().argmax(dim=-1)  # one past the last attended column
    response_out = torch.where(response.any(dim=-1), last, 0)
    return prompt_len, response_out


def trimmed_columns(attention_mask: torch.Tensor, response_len: int) -> tuple[slice, int]:
    """The columns one micro-batch needs: from its longest prompt's first token to its longest response's last
    (at least one prompt and one response column), and that response width. Only padding lies outside them: the
    left padding every row of the micro-batch has, and the right padding after every row's response."""
    prompt_len, resp_len = row_lengths(attention_mask, response_len)
    keep_prompt = max(1, int(prompt_len.max()))
    keep_response = max(1, int(resp_len.max()))
    start = attention_mask.shape[1] - response_len - keep_prompt
    return slice(start, start + keep_prompt + keep_response), keep_response


def _row_groups(batch: int, micro_batch_size: int,
                micro_batches: Sequence[torch.Tensor] | None) -> list[slice] | Sequence[torch.Tensor]:
    if micro_batches is None:
        return _micro_batches(batch, micro_batch_size)
    rows = torch.cat(list(micro_batches)).sort().values if micro_batches else torch.empty(0, dtype=torch.long)
    if not torch.equal(rows.cpu(), torch.arange(batch)):
        raise ValueError(f"micro_batches must hold each of the {batch} rows exactly once")
    return micro_batches


@torch.no_grad()
def compute_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    micro_batch_size: int,
    with_entropy: bool = False,
    micro_batches: Sequence[torch.Tensor] | None = None,
    packed: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`forward_log_probs` over the whole ``[B, T]`` batch in micro-batches, without autograd
    (:func:`compute_log_prob_outputs`, which also gives ``sum_pi_squared``).

    Returns ``log_probs [B, R]`` float32, or ``(log_probs, entropy)`` with ``with_entropy``.
    """
    out = compute_log_prob_outputs(model, input_ids, attention_mask, position_ids, response_len,
                                   temperature=temperature, micro_batch_size=micro_batch_size,
                                   with_entropy=with_entropy, micro_batches=micro_batches, packed=packed)
    return (out.log_probs, out.entropy) if out.entropy is not None else out.log_probs


@dataclass(frozen=True)
class LogProbOutputs:
    """What one pass of :func:`compute_log_prob_outputs` gives, each ``[B, R]`` float32."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    """``sum_v pi_v^2`` of each response position's next-token distribution at the temperature (verl's
    ``sum_pi_squared``, from ``actor.calculate_sum_pi_squared``): the optimal token baselines' input."""


@torch.no_grad()
def compute_log_prob_outputs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    micro_batch_size: int,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
    micro_batches: Sequence[torch.Tensor] | None = None,
    packed: bool = False,
) -> LogProbOutputs:
    """:func:`forward_log_probs` over the whole ``[B, T]`` batch in micro-batches, without autograd.

    ``micro_batches`` (row indices, each row once; ``hpcppo.train.batching.token_budget_groups``) replaces the
    consecutive slices of ``micro_batch_size`` rows: each micro-batch then runs on its own rows, trimmed to its own
    columns (:func:`trimmed_columns`), and its outputs go back to its rows; columns outside a micro-batch's trimmed
    response hold 0 (they are padding, outside every row's response mask).

    ``packed``: each micro-batch's rows run packed into one sequence, without padding
    (:func:`forward_log_probs_packed`).

    ``with_sum_pi_squared``: also ``sum_v pi_v^2`` per response position, from the same logits chunks as the
    log-probs and in their storage (no further ``[positions, vocab]`` tensor; ``_sum_pi_squared_in_place``).

    The model's train/eval mode is left as it is (dropout is off in the models we build either way).
    """
    forward = _outputs_packed if packed else _outputs_padded
    asked = (True, with_entropy, with_sum_pi_squared)

    def run(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, width: int) -> Outputs:
        return forward(model, ids, mask, pos, width, temperature=temperature, with_entropy=with_entropy,
                       entropy_grad=False, with_sum_pi_squared=with_sum_pi_squared, chunk_elements=None)

    if micro_batches is None:
        parts = [run(input_ids[sl], attention_mask[sl], position_ids[sl], response_len)
                 for sl in _micro_batches(input_ids.shape[0], micro_batch_size)]
        whole: list[torch.Tensor | None] = [
            torch.cat([t for p in parts if (t := p[i]) is not None], dim=0) if on else None
            for i, on in enumerate(asked)]
    else:
        shape = (input_ids.shape[0], response_len)
        whole = [torch.zeros(shape, dtype=torch.float32, device=input_ids.device) if on else None for on in asked]
        for rows in _row_groups(input_ids.shape[0], micro_batch_size, micro_batches):
            cols, width = trimmed_columns(attention_mask[rows], response_len)
            got = run(input_ids[rows][:, cols], attention_mask[rows][:, cols], position_ids[rows][:, cols], width)
            for dest, part in zip(whole, got):
                if dest is not None and part is not None:
                    dest[rows, :width] = part
    log_probs, entropy, sum_pi_squared = whole
    assert log_probs is not None
    return LogProbOutputs(log_probs, entropy, sum_pi_squared)


@torch.no_grad()
def compute_values(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    micro_batch_size: int,
    response_mask: torch.Tensor | None = None,
    micro_batches: Sequence[torch.Tensor] | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """:func:`forward_values` over the whole batch in micro-batches, without autograd: ``[B, R]`` float32.

    ``micro_batches``, ``packed``: as in :func:`compute_log_probs` (trimmed micro-batches of the given rows, 0 outside
    their responses; rows packed without padding). With ``response_mask`` (``[B, R]``), values outside it are zeroed,
    as verl's ``compute_values`` does.
    """
    forward = forward_values_packed if packed else forward_values
    if micro_batches is None:
        values = torch.cat([forward(critic, input_ids[sl], attention_mask[sl], position_ids[sl], response_len)
                            for sl in _micro_batches(input_ids.shape[0], micro_batch_size)], dim=0)
    else:
        values = torch.zeros((input_ids.shape[0], response_len), dtype=torch.float32, device=input_ids.device)
        for rows in _row_groups(input_ids.shape[0], micro_batch_size, micro_batches):
            cols, width = trimmed_columns(attention_mask[rows], response_len)
            values[rows, :width] = forward(critic, input_ids[rows][:, cols], attention_mask[rows][:, cols],
                                           position_ids[rows][:, cols], width)
    if response_mask is not None:
        values = values * response_mask.to(values.dtype)
    return values
