"""Build everything a trainer rank needs from the resolved config: the table of contents of a run.

Each builder gets its own config section (or primitives), never the root config.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import attrs
import torch
from torch import nn
from transformers import AutoTokenizer

from hpcppo import algos, jobenv, models
from hpcppo.agent.check import collect_specs, tool_schemas
from hpcppo.agent.tool import ToolSpec
from hpcppo.agent.worker import ToolWorker
from hpcppo.config import Compiled, DataSection, Experiment, FsdpSection, ModelSection, RunPlan, Site
from hpcppo.config.reward import RewardManagerSection, overlong_buffer_on
from hpcppo.data.dataset import PromptDataset, Truncation, read_prompts
from hpcppo.data.reward_manager import OverlongBuffer, apply_overlong
from hpcppo.data.rewards import build_reward_fn, score_batch
from hpcppo.data.sampler import ShardedEpochSampler
from hpcppo.distributed import loading
from hpcppo.distributed.checkpoint import CheckpointManager
from hpcppo.distributed.env import DistEnv, RolloutGroups, broadcast_object, rollout_groups
from hpcppo.distributed.fsdp import apply_activation_checkpointing, apply_fsdp
from hpcppo.distributed.mesh import build_mesh
from hpcppo.metrics import MetricsWriter
from hpcppo.config.rollout_corr import metric_columns as rollout_corr_columns
from hpcppo.config.multi_turn import MultiTurnSection
from hpcppo.metrics.schema import trainer_columns
from hpcppo.rundir.metric_names import TOOL_LOOP_COLUMNS, tool_columns, validation_tool_columns
from hpcppo.models.reward_model import STRIP as REWARD_MODEL_STRIP, build_reward_model
from hpcppo.rollout import EngineSettings, RolloutEngine, SamplingParams, build_engine
from hpcppo.rollout.base import generation_config_eos, stop_token_ids
from hpcppo.rundir import RunPaths
from hpcppo.train.reward_phase import RewardModelScorer
from hpcppo.models.lora import adapters_disabled
from hpcppo.train.lora import adapter_seed, with_lora
from hpcppo.train.optim import LRSchedule, build_optimizer, warmup_optimizer_steps
from hpcppo.train.signals import PreemptionFlag

log = logging.getLogger("hpcppo.train")


@dataclass
class ModelSet:
    """One trained model of the run (the actor, the critic) with what trains it."""

    model: nn.Module
    optim: torch.optim.Optimizer
    lr: LRSchedule
    # Optimizer state in host memory between updates (optimizer_offload). Not with param_offload: FSDP2's CPU
    # offload already keeps it there, and the step runs on the CPU.
    optim_offload: bool = False


@dataclass
class RankTools:
    """The tools of a multi-turn run on this rank: their specs, their schemas by name, and the rank's tool worker
    (started at the end of :func:`build_components` or :func:`build_rollout_parts`, closed with them)."""

    specs: list[ToolSpec]
    schemas: dict[str, dict[str, Any]]
    call_timeout_s: float
    worker: ToolWorker | None = None

    def started(self) -> RankTools:
        self.worker = ToolWorker(self.specs, call_timeout_s=self.call_timeout_s)
        return self

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


@dataclass
class Components:
    """Everything one rank trains with."""

    cfg: Experiment
    plan: RunPlan
    site: Site
    env: DistEnv
    run_dir: Path
    device: torch.device
    tokenizer: Any
    train_data: PromptDataset
    val_data: PromptDataset | None
    val_sources: list[str]
    sampler: ShardedEpochSampler
    total_steps: int
    actor: ModelSet
    reference: nn.Module | None  # frozen: no optimizer (None: no reference, or the actor without its adapters)
    critic: ModelSet | None  # only when the estimator has a critic
    engine: RolloutEngine | None  # None on a split run's trainer ranks that never validate (rollout ranks generate)
    sampling: SamplingParams
    val_sampling: SamplingParams
    kl_ctrl: algos.KLController
    score_fn: Callable[..., list[float]]
    ckpt: CheckpointManager
    metrics: MetricsWriter | None
    attempt: int = 0  # this job's attempt of the run: the NNNN of its metrics/attempt-NNNN.h5, from 0
    preempt: PreemptionFlag = field(default_factory=PreemptionFlag)
    # This rank's place in the rollout's tensor-parallel groups: prompts, seeds and validation shards follow
    # dp_rank; each rank of a group trains on its tp_rank-th share of the group's batch.
    groups: RolloutGroups = field(default_factory=lambda: RolloutGroups(tp_size=1, dp_size=1, dp_rank=0, tp_rank=0))
    reward_model: RewardModelScorer | None = None  # [reward_model]: its scores replace score_fn's in training
    # With the actor's LoRA the reference is the actor with its adapters disabled (verl's ref_in_actor): no copy.
    ref_in_actor: bool = False
    tools: RankTools | None = None  # [rollout.multi_turn] enable: the tools and this rank's tool worker

    def reference_policy(self) -> contextlib.AbstractContextManager[nn.Module | None]:
        """The reference policy for the KL (None when the run has none): its own model, or the actor without its
        LoRA adapters while the context lasts."""
        if self.ref_in_actor:
            return adapters_disabled(self.actor.model)
        return contextlib.nullcontext(self.reference)

    def trained(self) -> dict[str, ModelSet]:
        """The trained models by checkpoint name: the actor, and the critic when the run has one."""
        return {"actor": self.actor} | ({"critic": self.critic} if self.critic is not None else {})

    def critic_set(self) -> ModelSet:
        """The critic with its optimizer and lr schedule (only when the estimator has a critic)."""
        if self.critic is None:
            raise RuntimeError("this run has no critic (its advantage estimator needs none)")
        return self.critic

    def close(self) -> None:
        self.preempt.restore()
        if self.metrics is not None:
            self.metrics.close()
        if self.engine is not None:
            self.engine.close()
        if self.tools is not None:
            self.tools.close()


def _set_threads(env: DistEnv, tasks_per_node: int) -> None:
    # Ranks sharing a CPU machine split its cores instead of oversubscribing them (OMP_NUM_THREADS wins). Every task
    # of the node counts: in split placement a trainer's local world holds the trainers only, the rollout ranks
    # beside them compute too (plan.ranks_per_node: all of them).
    if env.device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, env.local_world_size, tasks_per_node)))


def freeze_long_lived_objects() -> int:
    """Move every object alive now (modules, imported code, tokenizer, datasets) out of the cyclic garbage
    collector's reach (``gc.freeze``); returns how many there are. Called once the rank is built, before its loop.

    A full (generation 2) collection walks every tracked object. A trainer rank holds hundreds of thousands of them
    before its first step (torch, transformers, the models' modules: ~420k in ``tools/bench_train.py``'s process), so
    each full collection paused the rank for ~0.2 s here (8 of them in that process's start-up and 11 steps), at
    moments that differ between ranks: the others wait for it at the next collective (a checkpoint load on 2 ranks
    went 0.17 s -> 0.37-0.40 s when one rank collected during it). Frozen, those objects are skipped: a full
    collection took 0.003 s. Reference counting still frees them; only cycles among them would outlive their use,
    and objects built at start-up live for the whole run anyway.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _dtype(name: str, default: str = "") -> torch.dtype:
    """A compute dtype from its config name (``name``, or ``default`` when it is empty)."""
    dtype = models.as_torch_dtype(name or default)
    if not isinstance(dtype, torch.dtype):  # "auto" means "as saved": a loading dtype, not one to compute in
        raise ValueError(f"dtype {name or default!r} is not a compute dtype")
    return dtype


def build_datasets(data: DataSection, tokenizer: Any) -> tuple[PromptDataset, PromptDataset | None]:
    def dataset(files: list[str]) -> PromptDataset:
        return PromptDataset(read_prompts(files, prompt_key=data.prompt_key), tokenizer,
                             max_prompt_length=data.max_prompt_length,
                             truncation=cast(Truncation, data.truncation),  # the config's choices are its values
                             filter_overlong_prompts=data.filter_overlong_prompts)

    return dataset(list(data.train_files)), (dataset(list(data.val_files)) if data.val_files else None)


def build_score_fn(data: DataSection, manager: RewardManagerSection | None = None) -> Callable[..., list[float]]:
    """The rule-based scores of a batch of decoded responses, with the reward manager's overlong penalty when it is
    DAPO's with the buffer on (``lengths``: each response's valid tokens; ``penalties`` collects the penalties)."""
    spec = data.reward_fn
    fn = build_reward_fn(spec, gsm8k={"method": data.gsm8k_method}) if spec == "auto" else \
        build_reward_fn(spec, **data.reward_kwargs)
    buffer = None
    if manager is not None and overlong_buffer_on(manager):
        ob = manager.overlong_buffer
        buffer = OverlongBuffer(manager.max_resp_len or data.max_response_length, ob.len, ob.penalty_factor)

    def score(sources, texts, truths, extras, preds=None, lengths=None, penalties=None):
        scores = score_batch(fn, sources, texts, truths, extras, preds=preds)
        if buffer is None:
            return scores
        if lengths is None:
            raise ValueError("the DAPO overlong buffer needs each response's length")
        scores, found = apply_overlong(scores, lengths, buffer)
        if penalties is not None:
            penalties.extend(found)
        return scores

    return score


def build_sampler(num_items: int, plan: RunPlan, env: DistEnv, *, seed: int,
                  shuffle: bool) -> tuple[ShardedEpochSampler, RolloutGroups]:
    """The prompt sampler of this rank and its place in the rollout groups.

    Prompts are split over the rollout's data-parallel groups (``plan.dp_size`` = world / tensor_parallel_size),
    not over ranks: the ranks of one vLLM tensor-parallel group must submit the same prompts. In split placement
    over the trainer ranks: each trainer rank's share is one unit the rollout ranks generate
    (:mod:`hpcppo.rollout.split`), with the prompts and the seed a colocated rank of that index would use.
    """
    if plan.placement == "split":  # the trainers' world: one share per trainer rank, dealt to the rollout ranks
        groups = RolloutGroups(tp_size=1, dp_size=env.world_size, dp_rank=env.rank, tp_rank=0)
        if groups.dp_size != plan.train_dp_size:
            raise RuntimeError(f"the run was planned for {plan.train_dp_size} trainer ranks, this job has "
                               f"{groups.dp_size}")
        return ShardedEpochSampler(num_items, batch_size=plan.prompts_per_step, dp_rank=groups.dp_rank,
                                   dp_size=groups.dp_size, seed=seed, shuffle=shuffle), groups
    groups = rollout_groups(env.rank, env.world_size, plan.tensor_parallel_size)
    if groups.dp_size != plan.dp_size:
        raise RuntimeError(f"the run was planned for {plan.dp_size} rollout groups, this job has {groups.dp_size}")
    sampler = ShardedEpochSampler(num_items, batch_size=plan.prompts_per_step, dp_rank=groups.dp_rank,
                                  dp_size=groups.dp_size, seed=seed, shuffle=shuffle)
    return sampler, groups


def _sharded(model: nn.Module, mesh: Any, fsdp: FsdpSection, model_dtype: str, *, frozen: bool = False,
             offload: bool | None = None) -> nn.Module:
    """FSDP2-shard ``model`` over ``mesh``; on a one-rank mesh with nothing for FSDP to do (no offload, compute
    in the master dtype) the plain module is faster (DTensor dispatch costs 25-50% per forward/backward and
    2-3x per AdamW step, tools/bench_train.py) and checkpoints the same way."""
    param_dtype = _dtype(fsdp.param_dtype, model_dtype)
    cpu_offload = fsdp.param_offload if offload is None else offload
    if mesh.size() == 1 and not cpu_offload and param_dtype == torch.float32:
        return model
    return apply_fsdp(
        model, mesh,
        param_dtype=param_dtype,
        reduce_dtype=_dtype(fsdp.reduce_dtype),
        cpu_offload=cpu_offload,
        reshard_after_forward=True if frozen else fsdp.reshard_after_forward,
    )


def load_sharded(build: Callable[..., nn.Module], path: str, device: torch.device,
                 shard: Callable[[nn.Module], nn.Module], *, offload: bool = False, checkpointing: bool = False,
                 strip: str = "") -> nn.Module:
    """A model built by ``build`` (a ``models.build_*`` with its path), sharded by ``shard``, holding its weights.

    Built with its parameters on the meta device, sharded, then each rank reads only its shards from the safetensors
    files (``hpcppo.distributed.loading``): a rank's host memory at start-up is its shards, not the whole model in
    float32. The shards are those of building the whole model on every rank and sharding it, bit for bit
    (tests/dist/test_loading.py). A directory that cannot be read so (no safetensors, or a parameter without a
    tensor of its shape: see ``loading.match_checkpoint``) is loaded whole by rank 0 alone and broadcast tensor by
    tensor (``loading.broadcast_shards``), with a warning; in a process without a group, whole, as before.
    ``offload``: the shards live on the host (FSDP2's CPU offload), so their storage is made there.
    """
    model = build(empty=True)
    keys, missing = loading.match_checkpoint(model, path, strip=strip)
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    if missing and not grouped:
        log.warning("%s: %d parameter(s) have no safetensors tensor of their shape (%s): the whole model is loaded",
                    path, len(missing), ", ".join(missing[:3]))
        model = build().to(device)
    if checkpointing:
        apply_activation_checkpointing(model)
    model = shard(model)
    if missing and not grouped:
        return model
    fresh = loading.materialize(model, torch.device("cpu") if offload else device)
    if not missing:
        loading.load_shards(model, path, keys)
        return model
    rank = torch.distributed.get_rank()
    if rank == 0:
        log.warning("%s: %d parameter(s) have no safetensors tensor of their shape (%s): rank 0 loads the whole model "
                    "and broadcasts it", path, len(missing), ", ".join(missing[:3]))
    full = None
    if rank == 0:
        with torch.random.fork_rng(devices=[]):  # the global generator stays where the other ranks leave theirs
            full = build()
    loading.broadcast_shards(model, full, fresh)
    return model


def enable_determinism(environ: MutableMapping[str, str] | None = None) -> None:
    """torch's deterministic algorithms (``trainer.deterministic``). With them a CUDA matmul raises unless
    ``CUBLAS_WORKSPACE_CONFIG`` was set before cuBLAS's first call; the job script and ``train.main`` set it, and
    here it is set once more if still missing (a value already set is kept) for callers that start elsewhere."""
    environ = os.environ if environ is None else environ
    if not environ.get("CUBLAS_WORKSPACE_CONFIG"):
        environ["CUBLAS_WORKSPACE_CONFIG"] = jobenv.CUBLAS_WORKSPACE_CONFIG
    torch.use_deterministic_algorithms(True)


def _lr_schedule(optim: torch.optim.Optimizer, section: Any, total_steps: int, updates_per_step: int) -> LRSchedule:
    """The lr schedule of the ``[actor]`` or ``[critic]`` ``section``, over its optimizer steps (warm-up is given in
    training steps, verl's unit, and converted)."""
    return LRSchedule(optim, base_lr=section.lr, warmup_steps=warmup_optimizer_steps(
                          section.warmup_steps, section.warmup_ratio, total_steps, updates_per_step),
                      total_steps=total_steps * updates_per_step, schedule=section.lr_schedule,
                      min_lr_ratio=section.min_lr_ratio)


def _sampling_params(cfg: Experiment, tokenizer: Any) -> tuple[SamplingParams, SamplingParams]:
    """The rollout's and validation's sampling settings."""
    ro = cfg.rollout
    # Every stop id the engines honour (the tokenizer's EOS and generation_config's, as vLLM uses both).
    eos = stop_token_ids(tokenizer.eos_token_id, generation_config_eos(cfg.model.path))
    sampling = SamplingParams(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, n=ro.n, temperature=ro.temperature,
                              top_p=ro.top_p, top_k=ro.top_k, max_new_tokens=cfg.data.max_response_length)
    val_sampling = SamplingParams(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, n=ro.val_n,
                                  temperature=ro.val_temperature, top_p=ro.val_top_p,
                                  max_new_tokens=cfg.data.max_response_length)
    return sampling, val_sampling


def _kl_controller(kc: Any) -> algos.KLController:
    """The ``[algorithm.kl_ctrl]`` controller."""
    kwargs: dict[str, Any] = {"fixed": dict(kl_coef=kc.kl_coef),
                              "adaptive": dict(init_kl_coef=kc.kl_coef, target_kl=kc.target_kl, horizon=kc.horizon),
                              "step": dict(init_kl_coef=kc.kl_coef, target_kl=kc.target_kl, factor=kc.factor,
                                           min_coef=kc.min_coef, max_coef=kc.max_coef)}[kc.type]
    return algos.build_kl_controller(kc.type, **kwargs)


def _metrics_log(paths: RunPaths, env: DistEnv, site: Site, columns: Any) -> tuple[int, MetricsWriter | None]:
    """This job's attempt number and, on rank 0, its HDF5 metrics log (``metrics/attempt-NNNN.h5``). Every rank
    learns the attempt from rank 0, which counts the metrics files before it creates its own."""
    attempt = broadcast_object(len(paths.attempt_files()) if env.rank == 0 else None)
    metrics = None
    if env.rank == 0:
        metrics = MetricsWriter(paths.path, columns, attempt=attempt, swmr=site.hdf5.swmr,
                                locking=None if site.hdf5.locking else False)
    return attempt, metrics


def build_components(compiled: Compiled, env: DistEnv, run_dir: Path, *,
                     preempt: PreemptionFlag | None = None) -> Components:
    """Everything the loop needs. ``preempt`` should be installed by the caller before anything slow runs, so a
    signal that arrives while the models load is kept (a default USR2 action would kill the rank)."""
    cfg, plan, site = compiled.experiment, compiled.plan, compiled.site
    device = _seeded_device(cfg, plan, env)
    tokenizer = _tokenizer(cfg.model)
    train_data, val_data = build_datasets(cfg.data, tokenizer)
    val_sources = sorted({r.data_source for r in val_data.records}) if val_data is not None else []
    sampler, groups = build_sampler(len(train_data), plan, env, seed=cfg.seed, shuffle=cfg.data.shuffle)
    total_steps = plan.total_steps or plan.total_epochs * sampler.steps_per_epoch

    mesh = build_mesh(env.device_type, env.world_size, env.num_nodes, hsdp=plan.hsdp)
    actor = _build_actor(cfg, plan, mesh, device, total_steps)
    ref_in_actor = plan.needs_reference and cfg.actor.lora.enabled
    reference = _build_reference(cfg, mesh, device) if plan.needs_reference and not ref_in_actor else None
    critic = _build_critic(cfg, plan, mesh, device, total_steps) if plan.needs_critic else None
    reward_model = _build_reward_model(cfg, plan, mesh, device) if cfg.reward_model.enable else None
    ro = cfg.rollout
    engine = build_engine(ro.engine, _engine_settings(cfg, device, env)) if needs_engine(plan) else None
    sampling, val_sampling = _sampling_params(cfg, tokenizer)
    kl_ctrl = _kl_controller(cfg.algorithm.kl_ctrl)

    paths = RunPaths(run_dir)
    ckpt = CheckpointManager(paths.checkpoints, keep_last=cfg.checkpoint.keep_last, rank=env.rank,
                             world_size=env.world_size)
    tools = _tools(cfg.rollout.multi_turn)
    attempt, metrics = _metrics_log(paths, env, site, trainer_columns(
        val_sources, ro.val_n, acc=overlong_buffer_on(cfg.reward_manager))
        + rollout_corr_columns(cfg.algorithm.rollout_correction)
        + ([*TOOL_LOOP_COLUMNS, *tool_columns(list(tools.schemas))] if tools is not None else [])
        + (validation_tool_columns(list(tools.schemas)) if tools is not None and val_data is not None else []))
    log.info("built: %d train prompts, %d val prompts, %d steps; actor%s%s; engine %s",
             len(train_data), len(val_data) if val_data else 0, total_steps,
             " + critic" if critic is not None else "", " + reference" if reference is not None else "", ro.engine)
    return Components(
        cfg=cfg, plan=plan, site=site, env=env, run_dir=run_dir, device=device, tokenizer=tokenizer,
        train_data=train_data, val_data=val_data, val_sources=val_sources, sampler=sampler, total_steps=total_steps,
        actor=actor, reference=reference, critic=critic, engine=engine, sampling=sampling,
        val_sampling=val_sampling, kl_ctrl=kl_ctrl, score_fn=build_score_fn(cfg.data, cfg.reward_manager), ckpt=ckpt,
        metrics=metrics, attempt=attempt, preempt=preempt if preempt is not None else PreemptionFlag(),
        groups=groups, ref_in_actor=ref_in_actor, reward_model=reward_model,
        # Last: the worker process is started once everything that could fail here has been built; a split run's
        # trainer rank without an engine runs no loop (its rollout ranks run the tools), only their metrics' names.
        tools=tools.started() if tools is not None and engine is not None else tools,
    )


@dataclass
class RolloutParts:
    """What a rollout rank of a split run generates with (no trainer state): the engine, the agent loop's inputs,
    the data and a sampler that sees the trainers' global batches."""

    cfg: Experiment
    plan: RunPlan
    env: DistEnv
    device: torch.device
    tokenizer: Any
    train_data: PromptDataset
    sampler: ShardedEpochSampler
    total_steps: int
    engine: RolloutEngine
    sampling: SamplingParams
    val_sampling: SamplingParams
    val_data: PromptDataset | None = None  # loaded when the run validates (the rollout ranks generate it)
    tools: RankTools | None = None  # [rollout.multi_turn] enable: the tools and this rank's tool worker

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if self.tools is not None:
                self.tools.close()


def build_rollout_parts(compiled: Compiled, env: DistEnv) -> RolloutParts:
    """A rollout rank's parts: the same tokenizer, data, sampling and engine settings as a trainer's
    (:func:`build_components`), and a one-rank sampler over the same permutation (its batches are global)."""
    cfg, plan = compiled.experiment, compiled.plan
    device = _seeded_device(cfg, plan, env)
    tokenizer = _tokenizer(cfg.model)
    validates = cfg.trainer.val_before_train or cfg.trainer.test_freq > 0
    train_data, val_data = build_datasets(cfg.data if validates else attrs.evolve(cfg.data, val_files=[]), tokenizer)
    sampler = ShardedEpochSampler(len(train_data), batch_size=plan.prompts_per_step, dp_rank=0, dp_size=1,
                                  seed=cfg.seed, shuffle=cfg.data.shuffle)
    total_steps = plan.total_steps or plan.total_epochs * sampler.steps_per_epoch
    engine = build_engine(cfg.rollout.engine, _engine_settings(cfg, device, env))
    sampling, val_sampling = _sampling_params(cfg, tokenizer)
    tools = _tools(cfg.rollout.multi_turn)
    return RolloutParts(cfg=cfg, plan=plan, env=env, device=device, tokenizer=tokenizer, train_data=train_data,
                        sampler=sampler, total_steps=total_steps, engine=engine, sampling=sampling,
                        val_sampling=val_sampling, val_data=val_data,
                        # Last, as build_components does: the worker process starts once nothing here can fail.
                        tools=tools.started() if tools is not None else None)


def needs_engine(plan: RunPlan) -> bool:
    """Whether a trainer rank builds an engine: colocated only (in split placement the rollout ranks generate the
    training samples and the validations)."""
    return plan.placement != "split"


def _tools(section: MultiTurnSection) -> RankTools | None:
    """The configured tools of a multi-turn run (schemas read; the worker not started yet), None without."""
    if not section.enable:
        return None
    specs = collect_specs([(t.class_name, t.config, t.tool_schema) for t in section.tools], section.tool_config_path)
    return RankTools(specs=specs, schemas=tool_schemas(specs), call_timeout_s=section.call_timeout_s)


def _seeded_device(cfg: Experiment, plan: RunPlan, env: DistEnv) -> torch.device:
    """Threads, determinism and the seed of this rank's process; its device."""
    _set_threads(env, plan.ranks_per_node)
    if cfg.trainer.deterministic:
        enable_determinism()
    torch.manual_seed(cfg.seed)
    return torch.device("cuda", env.device_index) if env.device_type == "cuda" else torch.device("cpu")


def _tokenizer(model_cfg: ModelSection) -> Any:
    """The model's tokenizer (``model.tokenizer_path`` when set), padding with EOS when it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_cfg.path,
                                              trust_remote_code=model_cfg.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _common(model_cfg: ModelSection) -> dict[str, Any]:
    """The builders' shared arguments: master weights in float32 (FSDP's param_dtype sets the compute dtype,
    model.dtype by default)."""
    return dict(dtype="float32", trust_remote_code=model_cfg.trust_remote_code,
                attn_implementation=model_cfg.attn_implementation)


def _build_actor(cfg: Experiment, plan: RunPlan, mesh: Any, device: torch.device, total_steps: int) -> ModelSet:
    """The actor (with its LoRA adapters when configured), sharded, with its optimizer and lr schedule."""
    model_cfg, ac = cfg.model, cfg.actor
    actor = load_sharded(with_lora(functools.partial(models.build_actor, model_cfg.path, **_common(model_cfg)),
                                   ac.lora, seed=adapter_seed(cfg.seed, "actor")),
                         model_cfg.path, device,
                         lambda m: _sharded(m, mesh, ac.fsdp, model_cfg.dtype),
                         offload=ac.fsdp.param_offload, checkpointing=model_cfg.gradient_checkpointing)
    optim = build_optimizer(actor, lr=ac.lr, weight_decay=ac.weight_decay, betas=ac.betas)
    return ModelSet(actor, optim, _lr_schedule(optim, ac, total_steps, plan.actor_optimizer_steps_per_step),
                    optim_offload=_offloads_optimizer(ac.fsdp))


def _build_reference(cfg: Experiment, mesh: Any, device: torch.device) -> nn.Module:
    """The reference policy: frozen, sharded like the actor, offloaded with ``reference.offload``."""
    model_cfg = cfg.model
    return load_sharded(
        functools.partial(models.build_reference, model_cfg.path, **_common(model_cfg)), model_cfg.path, device,
        lambda m: _sharded(m, mesh, cfg.actor.fsdp, model_cfg.dtype, frozen=True, offload=cfg.reference.offload),
        offload=cfg.reference.offload)


def _build_critic(cfg: Experiment, plan: RunPlan, mesh: Any, device: torch.device, total_steps: int) -> ModelSet:
    """The critic (``model.critic_path`` or the actor's weights, a value head; LoRA on its backbone when
    configured), sharded, with its optimizer and lr schedule."""
    model_cfg, cc = cfg.model, cfg.critic
    critic_path = model_cfg.critic_path or model_cfg.path
    critic = load_sharded(with_lora(functools.partial(models.build_critic, critic_path, **_common(model_cfg)), cc.lora,
                                    inside=lambda m: cast(models.Critic, m).backbone,
                                    seed=adapter_seed(cfg.seed, "critic")), critic_path, device,
                          lambda m: _sharded(m, mesh, cc.fsdp, model_cfg.dtype), offload=cc.fsdp.param_offload,
                          checkpointing=model_cfg.gradient_checkpointing,
                          strip="backbone.")
    optim = build_optimizer(critic, lr=cc.lr, weight_decay=cc.weight_decay, betas=cc.betas)
    lr = _lr_schedule(optim, cc, total_steps, plan.critic_ppo_epochs * plan.mini_batches_per_epoch_critic)
    return ModelSet(critic, optim, lr, optim_offload=_offloads_optimizer(cc.fsdp))


def _build_reward_model(cfg: Experiment, plan: RunPlan, mesh: Any, device: torch.device) -> RewardModelScorer:
    """The ``[reward_model]``, frozen and sharded like the reference (meta-device build, each rank loading its
    shards), with its own tokenizer."""
    rm = cfg.reward_model
    fsdp = attrs.evolve(cfg.actor.fsdp, param_dtype=rm.dtype or cfg.model.dtype)
    model = load_sharded(
        functools.partial(build_reward_model, rm.path, dtype="float32", trust_remote_code=cfg.model.trust_remote_code,
                          attn_implementation=cfg.model.attn_implementation), rm.path, device,
        lambda m: _sharded(m, mesh, fsdp, cfg.model.dtype, frozen=True, offload=rm.offload),
        offload=rm.offload, strip=REWARD_MODEL_STRIP)
    tokenizer = AutoTokenizer.from_pretrained(rm.tokenizer_path or rm.path, trust_remote_code=cfg.model.trust_remote_code)
    return RewardModelScorer(model=model, tokenizer=tokenizer,
                             max_length=rm.max_length or cfg.data.max_prompt_length + cfg.data.max_response_length,
                             micro_batch_size=rm.micro_batch_size_per_gpu or plan.logprob_micro_batch_per_rank,
                             max_tokens=rm.max_tokens_per_micro_batch)


def _offloads_optimizer(fsdp: FsdpSection) -> bool:
    return fsdp.optimizer_offload and not fsdp.param_offload


def _engine_settings(cfg: Experiment, device: torch.device, env: DistEnv) -> EngineSettings:
    """The rollout engine's settings from the run's config, for any kind (each takes what it uses)."""
    ro = cfg.rollout
    return EngineSettings(
        model_path=cfg.model.path, dtype=cfg.model.dtype, device=device, trust_remote_code=cfg.model.trust_remote_code,
        attn_implementation=cfg.model.attn_implementation, seed=cfg.seed,
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        tensor_parallel_size=ro.tensor_parallel_size, gpu_memory_utilization=ro.gpu_memory_utilization,
        enforce_eager=ro.enforce_eager, enable_sleep_mode=ro.free_cache_engine,
        kv_cache_memory_bytes=ro.kv_cache_memory_mb * 2**20,
        dist_env=env)  # exported as RANK/LOCAL_RANK/... before vLLM's external launcher reads them
