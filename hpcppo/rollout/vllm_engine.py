"""vLLM rollout engine, colocated with training on the same GPUs (GPU nodes only; ``pip install 'hpcppo[vllm]'``).

Design (verl's "hybrid engine" without Ray):

* One ``vllm.LLM`` per trainer process, created with ``distributed_executor_backend="external_launcher"``: vLLM
  runs inside our torchrun/srun process and reuses its ``torch.distributed`` world instead of spawning workers.
  With ``tensor_parallel_size = k``, consecutive groups of k ranks form one engine and must pass *identical*
  prompts and seeds; different groups generate for different prompts (data parallel). With k = 1 (the default)
  every rank generates for its own share, like the HF engine.
* ``enable_sleep_mode=True``: between rollouts :meth:`sleep` offloads the weights to host memory and discards
  the KV cache (level 1), so the FSDP update gets the GPU memory back; :meth:`wake_up` restores them.
* Weights stream parameter by parameter from ``hpcppo.distributed.weights.iter_full_params`` into the model's own
  ``load_weights`` (which handles vLLM's fused QKV / gate-up layouts and tied embeddings), see
  :func:`_inference_model` — the single place that reaches into vLLM internals.
* Log-probs: ``logprobs_mode="processed_logprobs"`` reports ``log_softmax`` of the logits *after* temperature (and
  after top-k/top-p), matching ``hpcppo.rollout.base``'s convention — exactly so when top-k/top-p are off. With
  top-k/top-p on, vLLM's values are those of the truncated distribution; the trainer recomputes old log-probs
  with the actor anyway (as verl does), so ``rollout_log_probs`` then serve diagnostics only.

Targets vLLM >= 0.10.2 (V1 engine; ``logprobs_mode`` appeared in 0.10.2) up to the 0.3x series. vLLM pins its
own torch/transformers, so it is never installed in the CPU development environment; this module imports it
lazily and is exercised by the GPU tests. Only :func:`_to_rollout_batch` is pure and unit-tested on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from hpcppo.rollout.base import PromptInput, RolloutBatch, SamplingParams, batch_from_lists, prompt_lists

VLLM_MISSING = ("rollout.engine = \"vllm\" needs the vllm extra: pip install 'hpcppo[vllm]' (GPU nodes only)")


def _import_vllm() -> Any:
    """Import vllm or raise ``ImportError`` with the install hint."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{VLLM_MISSING} [{e}]") from e
    return vllm


def _logprob_value(entry: Any) -> float:
    """A ``vllm.sequence.Logprob`` (``.logprob``) or a bare float."""
    return float(getattr(entry, "logprob", entry))


def _to_rollout_batch(
    outputs: Sequence[Any],
    *,
    n: int,
    eos_token_ids: Iterable[int],
    pad_token_id: int,
) -> RolloutBatch:
    """Convert ``LLM.generate`` results (one ``RequestOutput`` per prompt, in prompt order) into a batch.

    Uses only: ``output.prompt_token_ids``; ``output.outputs`` (``n`` ``CompletionOutput`` with ``index``,
    ``token_ids``, and ``logprobs`` — one mapping per generated token, from token id to a ``Logprob`` whose
    ``.logprob`` is the value; with ``SamplingParams(logprobs=0)`` it holds the sampled token).
    """
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    log_probs: list[list[float]] = []
    for p, request in enumerate(outputs):
        prompts.append([int(t) for t in request.prompt_token_ids])
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != n:
            raise ValueError(f"prompt {p}: expected n={n} completions, vLLM returned {len(completions)}")
        for c in completions:
            tokens = [int(t) for t in c.token_ids]
            if c.logprobs is None:
                raise ValueError("vLLM returned no log-probs: generate must pass SamplingParams(logprobs=0)")
            if len(c.logprobs) != len(tokens):
                raise ValueError(f"prompt {p} sample {c.index}: {len(tokens)} tokens but {len(c.logprobs)} "
                                 "log-prob entries")
            responses.append(tokens)
            log_probs.append([_logprob_value(c.logprobs[j][t]) for j, t in enumerate(tokens)])
    return batch_from_lists(prompts, responses, log_probs, n=n, eos_token_ids=eos_token_ids,
                            pad_token_id=pad_token_id)


def _inference_model(llm: Any) -> torch.nn.Module:
    """The ``nn.Module`` vLLM runs in this process (its ``load_weights`` takes ``(hf_name, tensor)`` pairs).

    With ``external_launcher`` the V1 engine core runs in-process (vLLM turns V1 multiprocessing off for it), and
    the model sits at ``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model`` — the path verl's
    FSDP/Megatron sharding managers use for vLLM 0.8-0.1x and that still holds in the 0.1x/0.2x V1 engine.
    Older in-process layouts put the executor under ``engine_core.engine_core``; both are tried.
    """
    engine = llm.llm_engine
    executor = getattr(engine, "model_executor", None)
    if executor is None:
        executor = engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner.model


def prompt_seed(seed: int | None, prompt: int, n: int) -> int | None:
    """The seed of prompt ``prompt``'s request: disjoint blocks of ``n`` seeds per prompt (None stays None)."""
    return None if seed is None else (seed + prompt * n) % (2**63 - 1)


class VLLMRolloutEngine:
    """A colocated vLLM engine in this process (see the module docstring)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "bfloat16",
        enforce_eager: bool = False,
        seed: int = 0,
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
        enable_sleep_mode: bool = True,
        **llm_kwargs: Any,
    ):
        vllm = _import_vllm()
        # external_launcher runs the engine core in-process; say so explicitly (vLLM also forces it). vllm.envs
        # reads variables lazily, so setting it after the import still takes effect.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="external_launcher",
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            enforce_eager=enforce_eager,
            dtype=dtype,
            seed=seed,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logprobs",
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs)
        self._vllm = vllm
        self._llm: Any = vllm.LLM(**kwargs)
        self._sleep_mode = enable_sleep_mode
        self._sleeping = False

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise RuntimeError("this rollout engine was closed")
        return self._llm

    def _sampling_params(self, sampling: SamplingParams, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            stop_token_ids=list(sampling.eos_ids),
            detokenize=False,  # the trainer decodes what it needs; skipping it saves CPU time per step
        )

    def generate(self, prompts: PromptInput, sampling: SamplingParams) -> RolloutBatch:
        """Sample ``sampling.n`` responses per prompt; tensors on CPU (see ``hpcppo.rollout.base``)."""
        if self._sleeping:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before generate()")
        rows = prompt_lists(prompts)
        # vLLM seeds the n samples of a request seed, seed+1, ...: give each prompt its own block of seeds, or
        # two copies of one prompt in a batch (sampling with replacement) would get identical samples.
        params = [self._sampling_params(sampling, prompt_seed(sampling.seed, i, sampling.n)) for i in range(len(rows))]
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        return _to_rollout_batch(outputs, n=sampling.n, eos_token_ids=sampling.eos_ids,
                                 pad_token_id=sampling.pad_token_id)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stream ``(hf_name, full_tensor)`` pairs into vLLM's ``load_weights``; returns the bytes received.

        Each tensor is moved to this GPU as it passes (a no-op for tensors gathered there). Raises ``KeyError``
        if the model did not load every parameter it has (vLLM itself rejects unknown names).
        """
        model = _inference_model(self.llm)
        device = next(model.parameters()).device
        received = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal received
            from hpcppo.distributed.weights import clean_name

            for name, tensor in named_tensors:
                received += tensor.numel() * tensor.element_size()
                yield clean_name(name), tensor.to(device, non_blocking=True)

        loaded = model.load_weights(counted())
        if loaded is not None:
            expected = {n for n, _ in model.named_parameters()}
            missing = sorted(expected - set(loaded))
            if missing:
                raise KeyError(f"sync_weights: vLLM did not load {len(missing)} parameters: {missing[:5]}")
        return received

    def sleep(self, level: int = 1) -> None:
        """Level 1: offload weights to host memory and drop the KV cache. Level 2 drops the weights too (a
        :meth:`sync_weights` must follow :meth:`wake_up`). A no-op when the engine was built without sleep mode
        (vLLM refuses ``sleep`` then), so the trainer's loop is the same either way."""
        if self._sleep_mode and not self._sleeping:
            self.llm.sleep(level=level)
            self._sleeping = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore memory; ``tags=["weights"]`` then ``["kv_cache"]`` lowers the peak while syncing weights."""
        if not self._sleeping:
            return
        if tags is None:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=list(tags))
        if tags is None or "kv_cache" in tags:
            self._sleeping = False

    def close(self) -> None:
        """Drop the engine (vLLM frees its memory when the ``LLM`` is garbage collected)."""
        self._llm = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
