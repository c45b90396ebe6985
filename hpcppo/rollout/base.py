"""The rollout engine protocol: sampling parameters in, a padded batch of prompt + response tensors out.

Conventions every engine follows (the trainer and ``hpcppo.models`` rely on them):

* **Rows are samples, prompt-major.** With ``n`` samples per prompt, rows ``0..n-1`` belong to prompt 0, rows
  ``n..2n-1`` to prompt 1, and so on; ``prompt_index[row]`` says which prompt (GRPO/RLOO groups).
* **Prompts are left padded, responses right padded.** ``input_ids = cat(prompt_ids, response_ids)``, so the
  response always starts at column ``P`` and ``hpcppo.models.compute_log_probs`` can slice the last ``R``
  positions. The response width ``R`` is the longest response *in this batch* (at most ``max_new_tokens``);
  use :meth:`RolloutBatch.pad_responses_to` when a fixed width is needed.
* **``response_mask`` is 1 up to and including the EOS token**, 0 on the padding after it. A response cut by
  ``max_new_tokens`` has no EOS and is all ones up to its length.
* **Two masks** (docs/rollout-phase.md): ``response_attention_mask`` is 1 on every real response token (the model's
  and, in a multi-turn trajectory, the tools'); ``response_mask`` is the loss mask, 1 only on tokens the model
  sampled. An engine's single-turn output has them equal; they differ only in a trajectory with tool turns.
* **``rollout_log_probs`` are ``log_softmax(logits / temperature)`` of the sampled tokens**, computed in float32
  on the model's *unfiltered* logits (no top-k/top-p truncation). That is exactly what verl's actor recomputes
  (``dp_actor._forward_micro_batch``: ``logits.div_(temperature)`` then ``logprobs_from_logits``) and what
  ``compute_log_probs(..., temperature=T)`` returns, so with top-k/top-p off the two agree to float precision.
  Greedy decoding (``temperature == 0``) reports log-probs at temperature 1. They are 0 on padding.
* **Seeding**: ``SamplingParams.seed`` seeds the engine's own generator, so a given seed reproduces the same
  samples whatever the global RNG state. The trainer passes a distinct seed per step and rollout data-parallel
  group (see :func:`derive_seed`; the ranks of one tensor-parallel group share it); ``seed=None`` draws one from torch's global RNG (so ``torch.manual_seed`` still decides).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, runtime_checkable

import torch

from hpcppo.models import position_ids_from_mask

PromptInput = Sequence[Sequence[int]] | Mapping[str, Any]
"""Prompts as token-id lists, or a mapping with left-padded ``input_ids`` and ``attention_mask`` tensors
(as the trainer's prompt batches carry them)."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample responses.

    Keyword-only. Attributes:
        eos_token_id: token id(s) that end a response (required); generation always stops at them.
        pad_token_id: id written after the end of a response and in prompt padding (required).
        n: samples per prompt (>= 1).
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 (or 0) disables it.
        max_new_tokens: the longest response (>= 1).
        seed: seeds the engine's generator; None draws one from torch's global RNG.
        stop_token_ids: further ids that end a response like EOS (kept in it, masked 1): a tool call's closing
            token, for the tool loop (``hpcppo.rollout.tool_loop``); empty for a single-turn rollout.
    """

    eos_token_id: int | tuple[int, ...]
    pad_token_id: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        eos = self.eos_token_id
        eos_ids = (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)
        object.__setattr__(self, "eos_token_id", eos_ids)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not eos_ids:
            raise ValueError("SamplingParams.eos_token_id: give at least one end-of-sequence token id")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """``eos_token_id`` as a tuple (it is always normalised to one)."""
        return self.eos_token_id  # type: ignore[return-value]

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every id that ends a response: the EOS ids, then the further stop ids."""
        return self.eos_ids + tuple(t for t in self.stop_token_ids if t not in self.eos_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature the reported log-probs use: the sampling temperature, or 1 for greedy decoding."""
        return 1.0 if self.greedy else float(self.temperature)


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """Everything a rollout engine of any kind is built from, filled once from the run's config (``train.build``);
    each engine's ``from_settings`` takes what it uses, so a new engine kind adds its builder and reads these.

    Attributes:
        model_path: the local Hugging Face directory of the actor's weights.
        dtype: the engine's compute dtype (a name, e.g. ``"bfloat16"``; the HF engine also takes ``"auto"``).
        device: the HF engine's device (None: the current CUDA device, else CPU); vLLM places itself.
        trust_remote_code: load the model's own code.
        attn_implementation: transformers' attention implementation (the HF engine; vLLM picks its own backend).
        seed: the engine's base seed (vLLM).
        max_model_len: prompt + response positions (vLLM's KV cache is sized for it).
        tensor_parallel_size: ranks per engine (vLLM).
        gpu_memory_utilization: vLLM's share of the GPU.
        enforce_eager: no CUDA graphs (vLLM).
        enable_sleep_mode: vLLM's sleep mode (``rollout.free_cache_engine``).
        kv_cache_memory_bytes: a fixed KV cache instead of the share (vLLM; 0: the share decides).
        dist_env: the job's distributed environment, exported for vLLM's external launcher.
    """

    model_path: Any
    dtype: str = "float32"
    device: Any = None
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False
    enable_sleep_mode: bool = True
    kv_cache_memory_bytes: int = 0
    dist_env: Any = None


def stop_token_ids(*sources: Any) -> tuple[int, ...]:
    """Every end-of-sequence id named by ``sources`` (each an id, a list of ids, or None), first-seen order.

    vLLM stops at the tokenizer's EOS *and* the ``eos_token_id`` of the model's ``generation_config`` (its
    ``SamplingParams.update_from_generation_config`` adds them to the stop ids): Qwen2.5-Instruct ends turns with
    ``<|im_end|>`` (the tokenizer's) and generation_config lists ``<|endoftext|>`` too. Both engines and
    :func:`batch_from_lists` must use the same union, or a response vLLM ended at ``<|endoftext|>`` would be
    treated as unfinished (and the HF engine would run on past it to ``max_new_tokens``).
    """
    out: list[int] = []
    for source in sources:
        if source is None:
            continue
        for value in ([source] if isinstance(source, int) else source):
            if value is not None and int(value) not in out:
                out.append(int(value))
    return tuple(out)


def generation_config_eos(model_path: Any) -> Any:
    """The ``eos_token_id`` (an id or a list) of the model's ``generation_config.json``, or None without one."""
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except (OSError, ValueError):
        return None


def derive_seed(base_seed: int, step: int, rank: int, branch: int = 0) -> int:
    """A 63-bit seed for one rollout, distinct per ``(base_seed, step, rank, branch)`` and stable across
    runs/platforms. ``branch`` counts rollbacks: a retried step samples afresh (replaying the same samples would
    often replay the same blow-up); branch 0 keeps the seeds of runs that never rolled back."""
    key = f"{base_seed}:{step}:{rank}" + (f":{branch}" if branch else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


@dataclass(frozen=True)
class RolloutBatch:
    """One rollout: B = prompts × n rows (prompt-major), P prompt columns, R response columns.

    Attributes:
        prompt_ids: ``[B, P]`` long, left padded with the pad id.
        prompt_mask: ``[B, P]`` long, 1 on prompt tokens.
        response_ids: ``[B, R]`` long, right padded with the pad id.
        response_mask: ``[B, R]`` long, the loss mask: 1 on the tokens the model sampled (single turn: up to and
            including EOS).
        response_attention_mask: ``[B, R]`` long, 1 on every real response token (model and tool turns); equal to
            ``response_mask`` for a single turn.
        input_ids: ``[B, P+R]`` = ``cat(prompt_ids, response_ids)``.
        attention_mask: ``[B, P+R]`` = ``cat(prompt_mask, response_attention_mask)``.
        position_ids: ``[B, P+R]`` = ``clamp(cumsum(attention_mask) - 1, min=0)``.
        rollout_log_probs: ``[B, R]`` float32, the engine's ``log_softmax(logits / T)`` of each sampled token
            (0 outside ``response_mask``).
        prompt_index: ``[B]`` long, the prompt (0..num_prompts-1) each row came from.
        response_lengths: ``[B]`` long, ``response_attention_mask.sum(-1)`` (the whole continuation).
        policy_version: ``[B, R]`` long, the actor version whose weights produced each response token; -1 on
            padding, and everywhere until a rollout source stamps the batch (:meth:`stamped`).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    rollout_log_probs: torch.Tensor
    prompt_index: torch.Tensor
    response_lengths: torch.Tensor
    response_attention_mask: torch.Tensor
    policy_version: torch.Tensor

    @property
    def num_samples(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def prompt_width(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def response_width(self) -> int:
        return int(self.response_ids.shape[1])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on ``device``."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def stamped(self, version: int) -> RolloutBatch:
        """The same batch with ``policy_version`` = ``version`` on every real response token (-1 on padding)."""
        stamp = torch.where(self.response_attention_mask.bool(), int(version), -1)
        return replace(self, policy_version=stamp.long())

    def state(self) -> dict[str, torch.Tensor]:
        """The batch as the tensors it cannot be rebuilt without, in the narrowest exact dtypes: token ids and
        versions as int32, masks as bool, log-probs as they are. ``input_ids``, ``attention_mask``, ``position_ids``
        and ``response_lengths`` are left out (:func:`assemble_batch` derives them). About 14 bytes a response token
        and 5 a prompt token, against 76 and 40 for every column as the trainer holds it: what a checkpoint's
        queued units store and what a pickled batch (a unit over the bridge, a unit shared among trainer ranks)
        carries."""
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(self, name)
            if ids.numel():
                low, high = (int(x) for x in torch.aminmax(ids))
                if high > _INT32_MAX or low < -_INT32_MAX - 1:
                    raise ValueError(f"{name} holds a token id outside int32: {low}..{high}")
        return {
            "prompt_ids": self.prompt_ids.int(), "prompt_mask": self.prompt_mask.bool(),
            "response_ids": self.response_ids.int(), "response_mask": self.response_mask.bool(),
            "response_attention_mask": self.response_attention_mask.bool(),
            "rollout_log_probs": self.rollout_log_probs, "prompt_index": self.prompt_index,
            "policy_version": self.policy_version.int(),
        }

    @staticmethod
    def from_state(state: Mapping[str, torch.Tensor]) -> RolloutBatch:
        """:meth:`state`'s inverse, exact: every column equal to the original's, in the trainer's dtypes."""
        return assemble_batch(**state)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, torch.Tensor]]]:
        # pickled as its state (bridge payloads, trainer-rank shares): a quarter of the bytes
        return (RolloutBatch.from_state, (self.state(),))

    def pad_responses_to(self, width: int, pad_token_id: int) -> RolloutBatch:
        """The same batch with response columns right padded to ``width`` (>= the current width)."""
        extra = width - self.response_width
        if extra < 0:
            raise ValueError(f"cannot pad responses of width {self.response_width} down to {width}")
        if extra == 0:
            return self

        def pad(t: torch.Tensor, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, extra), value=value)

        return assemble_batch(
            prompt_ids=self.prompt_ids, prompt_mask=self.prompt_mask,
            response_ids=pad(self.response_ids, pad_token_id), response_mask=pad(self.response_mask, 0),
            rollout_log_probs=pad(self.rollout_log_probs, 0.0), prompt_index=self.prompt_index,
            response_attention_mask=pad(self.response_attention_mask, 0), policy_version=pad(self.policy_version, -1),
        )


_INT32_MAX = 2**31 - 1


def assemble_batch(
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    prompt_index: torch.Tensor,
    response_attention_mask: torch.Tensor | None = None,
    policy_version: torch.Tensor | None = None,
) -> RolloutBatch:
    """Build a :class:`RolloutBatch` from its prompt and response halves (all ``[B, *]``, same device).

    ``response_mask`` is the loss mask; ``response_attention_mask`` (every real response token) defaults to it, as
    in a single-turn rollout; ``policy_version`` defaults to -1 (not stamped)."""
    response_mask = response_mask.long()
    attend = response_mask if response_attention_mask is None else response_attention_mask.long()
    if attend.shape != response_mask.shape or bool((response_mask > attend).any()):
        raise ValueError("response_mask (the loss mask) must lie inside response_attention_mask, of the same shape")
    attention_mask = torch.cat([prompt_mask.long(), attend], dim=1)
    version = torch.full_like(response_mask, -1) if policy_version is None else policy_version.long()
    return RolloutBatch(
        prompt_ids=prompt_ids.long(),
        prompt_mask=prompt_mask.long(),
        response_ids=response_ids.long(),
        response_mask=response_mask,
        input_ids=torch.cat([prompt_ids.long(), response_ids.long()], dim=1),
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        rollout_log_probs=(rollout_log_probs.float() * response_mask),
        prompt_index=prompt_index.long(),
        response_lengths=attend.sum(dim=-1),
        response_attention_mask=attend,
        policy_version=version,
    )


def left_pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left pad token lists to ``[B, max_len]`` ids and mask (long)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def prompt_lists(prompts: PromptInput) -> list[list[int]]:
    """Token-id lists from either accepted prompt form; checks that tensor prompts are left padded.

    Raises ``ValueError`` for an empty batch, an empty prompt, or a mask with padding on the right/inside.
    """
    if isinstance(prompts, Mapping):
        try:
            ids, mask = prompts["input_ids"], prompts["attention_mask"]
        except KeyError as e:
            raise ValueError(f"prompt mapping needs 'input_ids' and 'attention_mask' tensors; missing {e}") from None
        ids, mask = torch.as_tensor(ids).cpu(), torch.as_tensor(mask).cpu()
        if ids.shape != mask.shape or ids.dim() != 2:
            raise ValueError(f"input_ids {tuple(ids.shape)} and attention_mask {tuple(mask.shape)} must both be "
                             "the same [B, P]")
        lengths = mask.sum(dim=-1)
        expected = torch.arange(mask.shape[1]).unsqueeze(0) >= (mask.shape[1] - lengths).unsqueeze(1)
        if not torch.equal(mask.bool(), expected):
            raise ValueError("prompts must be left padded: attention_mask has padding after a token")
        rows = [ids[i, ids.shape[1] - int(n):].tolist() for i, n in enumerate(lengths)]
    else:
        rows = [[int(t) for t in row] for row in prompts]
    if not rows:
        raise ValueError("generate needs at least one prompt")
    empty = [i for i, r in enumerate(rows) if not r]
    if empty:
        raise ValueError(f"prompts {empty[:5]} are empty; every prompt needs at least one token")
    return rows


def batch_from_lists(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]],
    *,
    n: int,
    eos_token_ids: Iterable[int],
    pad_token_id: int,
) -> RolloutBatch:
    """Assemble a batch from per-prompt token lists and per-sample responses (``len(prompts) * n`` of them).

    Each response is cut after its first EOS (an engine may run on past it); the mask covers it and the
    tokens before. ``log_probs[i]`` must have one entry per token of ``responses[i]``.
    """
    if len(responses) != len(prompts) * n or len(log_probs) != len(responses):
        raise ValueError(f"{len(prompts)} prompts × n={n} need {len(prompts) * n} responses and log-prob lists, "
                         f"got {len(responses)} and {len(log_probs)}")
    eos = set(int(e) for e in eos_token_ids)
    cut_ids: list[list[int]] = []
    cut_lps: list[list[float]] = []
    for i, (resp, lps) in enumerate(zip(responses, log_probs)):
        resp, lps = [int(t) for t in resp], [float(x) for x in lps]
        if len(lps) != len(resp):
            raise ValueError(f"sample {i}: {len(resp)} tokens but {len(lps)} log-probs")
        end = next((j + 1 for j, t in enumerate(resp) if t in eos), len(resp))
        cut_ids.append(resp[:end])
        cut_lps.append(lps[:end])
    width = max(1, max(len(r) for r in cut_ids))  # keep R >= 1 so slicing logits[:, -R-1:-1] stays valid
    response_ids = torch.full((len(cut_ids), width), int(pad_token_id), dtype=torch.long)
    response_mask = torch.zeros((len(cut_ids), width), dtype=torch.long)
    rollout_lps = torch.zeros((len(cut_ids), width), dtype=torch.float32)
    for i, (r, lp) in enumerate(zip(cut_ids, cut_lps)):
        response_ids[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
        response_mask[i, :len(r)] = 1
        rollout_lps[i, :len(lp)] = torch.as_tensor(lp, dtype=torch.float32)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    index = torch.arange(len(prompts)).repeat_interleave(n)
    return assemble_batch(prompt_ids=prompt_ids[index], prompt_mask=prompt_mask[index], response_ids=response_ids,
                          response_mask=response_mask, rollout_log_probs=rollout_lps, prompt_index=index)


@runtime_checkable
class RequestEngine(Protocol):
    """An engine that also takes requests one at a time (vLLM): the tool loop submits each continuation on its own,
    so that a trajectory waiting on a tool holds up no other."""

    @property
    def takes_requests(self) -> bool:
        """Whether requests may come one at a time in an order of this rank's own: not when ranks of a
        tensor-parallel group must give one engine the same inputs at the same steps."""
        ...

    def submit(self, key: str, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Queue one sample's request under ``key`` (``sampling.seed`` its own)."""
        ...

    def busy(self) -> bool:
        """Whether submitted requests are still running."""
        ...

    def step_finished(self) -> list[tuple[str, list[int], list[float]]]:
        """Run the engine one step; the requests that finished: ``(key, tokens, log-probs)``, the end id that
        stopped one included."""
        ...

    def abort(self, keys: Sequence[str]) -> None:
        """Drop these requests where they still run (a failed step's)."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a generator (one engine per rank; it does not communicate).

    Lifecycle per step (colocated with training): ``wake_up()`` -> ``sync_weights(iter_full_params(actor))`` ->
    ``generate(...)`` -> ``sleep()``. ``sync_weights`` is driven by a collective iterator: every rank must call it
    at the same time (see ``hpcppo.distributed.weights.iter_full_params``).
    """

    def generate(self, prompts: PromptInput, sampling: SamplingParams) -> RolloutBatch:
        """Sample ``sampling.n`` responses per prompt; rows prompt-major (see the module docstring)."""
        ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full tensors with Hugging Face names into the engine's model, consuming the stream as it comes.

        Returns the number of bytes received. Raises on unknown names, shape mismatches or missing parameters.
        """
        ...

    def sleep(self) -> None:
        """Release memory the engine can rebuild (KV cache, and for vLLM level 1 the weights' GPU copy)."""
        ...

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""
        ...

    def close(self) -> None:
        """Free the engine; it cannot be used afterwards."""
        ...

    @property
    def weights_dropped(self) -> bool:
        """True when the engine holds no usable weights (e.g. vLLM's dummy load or level-2 sleep): the next step
        syncs them even if the actor did not change."""
        ...

    @property
    def sync_dtype(self) -> torch.dtype | None:
        """The dtype to gather the actor's weights in for :meth:`sync_weights`; None = the training dtype."""
        ...

    @property
    def sync_targets(self) -> Mapping[str, torch.Tensor] | None:
        """The engine's own tensors by Hugging Face name that the weight stream may fill in place
        (``iter_full_params(into=...)``; :meth:`sync_weights` then finds its own tensor and skips the copy), or
        None when it has none to offer (vLLM loads weights through its own ``load_weights``)."""
        ...
