"""The PPO trainer: one readable loop.

    rollout -> rewards -> old log-probs, reference log-probs, values -> KL in reward (or as a loss)
    -> advantages (estimator registry) -> critic update -> actor update -> metrics -> watchdog rules
    -> checkpoint -> control requests, preemption, pause

Every rank runs the same loop on its share of the prompts. The small ``[batch, response_len]`` tensors
(scores, log-probs, values, masks) are gathered so that the KL controller and the advantage estimator
see the whole batch exactly as verl's driver does (global whitening, identical controller state on all
ranks); the models only ever see this rank's samples. Each phase returns what it produces and the loop
merges it into the batch, so the data flow reads top to bottom. Components are built in
:mod:`hpcppo.train.build`; the update skeleton is :mod:`hpcppo.train.update`. The run's progress (step, branch,
actor version, KL coefficient, the watchdog's state and recent rows) is one :class:`~hpcppo.watchdog.TrainingState`,
``self.state``, replaced rather than edited; the watchdog's decisions are carried out by :func:`hpcppo.watchdog.respond`
with the trainer's :class:`~hpcppo.train.recovery.Recovery` as its hands, which also serves rollback requests.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from hpcppo import algos, estimators
from hpcppo.distributed.env import all_reduce_host, broadcast_object
from hpcppo.errors import WeightSyncError
from hpcppo.models import compute_log_prob_outputs, compute_log_probs, compute_values
from hpcppo.rollout.base import derive_seed
from hpcppo.rollout.source import RolloutSource, StepContext
from hpcppo.rollout.split import Notice
from hpcppo.rollout.tool_loop import LoopStats, stats_metrics, stats_vector, with_tool_results
from hpcppo.config import sync_guard
from hpcppo.config.convert import converter
from hpcppo.config.plan import VALIDATION_PROMPTS_PER_CALL
from hpcppo.config.reward import overlong_buffer_on
from hpcppo.metrics import trackers
from hpcppo.rundir import control, events, exitcodes, metric_names
from hpcppo.train import batching, reward_phase, rollout_correction, rollout_phase, samples, validation
from hpcppo.train.build import Components, build_components, freeze_long_lived_objects
from hpcppo.train.inject import FaultInjector
from hpcppo.train.recovery import Recovery
from hpcppo.train.update import UpdateSettings, actor_loss, critic_loss, run_update
from hpcppo.watchdog import Decision, TrainingState, decide, history_keep, respond
from hpcppo.watchdog.audit import Audit

log = logging.getLogger("hpcppo.train")

Batch = dict[str, Any]
VALIDATION_SEED_SALT = 0x5A17_0F_7E57  # validation's seeds differ from the rollout's of the same step
CLIP_COV_SEED_SALT = 0xC11_C0F  # so do clip_cov's choices of tokens


class PhaseTimer:
    """Wall time of each phase of a step, in seconds (``time/<phase>_s`` metrics): ``with timer("reward"): ...``."""

    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)

    def add(self, times: dict[str, float]) -> None:
        """Phase times measured elsewhere (the rollout source's)."""
        for phase, seconds in times.items():
            self.times[phase] += seconds

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] += time.perf_counter() - start


class Trainer:
    """PPO on one rank of the job. Build with :func:`run_training`; call :meth:`train`; always :meth:`close`."""

    def __init__(self, c: Components):
        self.c = c
        self.cfg = c.cfg
        self.plan = c.plan
        self.env = c.env
        self.state = TrainingState(kl_coef=c.kl_ctrl.initial)  # the run's progress: replaced, never edited
        self.timer = PhaseTimer()  # this step's phase times
        # the rollout source's metrics of this step: split's staleness and idle times, the tool loop's counts
        self.source_metrics: dict[str, float] = {}
        self.greedy_baseline = estimators.needs_greedy_baseline(self.cfg.algorithm.adv_estimator)  # ReMax
        self.bridge: Any = None  # split placement, trainer rank 0: the bridge to the rollout ranks
        self.source: RolloutSource = self._source()
        self.rules = list(self.cfg.watchdog.rules) if self.cfg.watchdog.enable else []
        self.rules_by_name = {r.name: r for r in self.rules}
        self.keep = history_keep(self.rules)  # the recent rows the rules look back on
        self.audit = Audit(c.run_dir, rank=self.env.rank, metrics=c.metrics, attempt=c.attempt)
        self.recovery = Recovery(c, self.audit, self.source)
        # Trackers beside the HDF5 log (trainer.logger): every rank checks the packages, rank 0 writes.
        trackers.require(self.cfg.trainer.logger)
        self.trackers = trackers.open_trackers(
            self.cfg.trainer.logger, c.run_dir, project=self.cfg.trainer.project_name or self.cfg.name,
            group=self.cfg.name, attempt=c.attempt, config=converter.unstructure(self.cfg),
        ) if self.env.rank == 0 else trackers.Trackers()
        self.inject = FaultInjector(self.cfg.debug.inject, rank=self.env.rank, attempt=c.attempt, ckpt=c.ckpt,
                                    metrics=c.metrics)

    def _source(self) -> RolloutSource:
        """Colocated: the rank's own engine. Split: the rollout ranks' samples and validations
        (:mod:`hpcppo.rollout.split`), trainer rank 0 joining them on the bridge; the trainer ranks hold no engine."""
        c = self.c
        if self.plan.placement != "split":
            return rollout_phase.colocated_source(c, greedy_baseline=self.greedy_baseline)
        timeout = float(self.cfg.trainer.collective_timeout_s)
        if self.env.rank == 0:
            self.bridge = rollout_phase.bridge_from_env(0, backend=self.plan.backend, timeout_s=timeout)
        return rollout_phase.split_source(c, self.bridge, timeout_s=timeout)

    @property
    def step(self) -> int:
        """Steps done (the models hold the state "after step ``step``")."""
        return self.state.step

    # ------------------------------------------------------------------ the loop
    def train(self) -> int:
        """Train until ``total_steps``; returns the job exit code (done, requeue, paused)."""
        c = self.c
        self.state = self.recovery.resume(self.state)
        if c.attempt > 0:  # the steps after the checkpoint are logged again: TensorBoard drops the earlier ones
            self.trackers.start_at(self.step + 1)
        exit_code = self.at_boundary()  # a signal, a pause or a rollback request that came while the models loaded
        if exit_code is not None:
            return exit_code
        if self.cfg.trainer.val_before_train and self.step == 0:
            self.log_metrics(0, self.validate(), "validation before training")
        frozen = freeze_long_lived_objects()
        log.info("advantage estimator %s%s, policy loss %s", self.cfg.algorithm.adv_estimator,
                 " (a greedy baseline response per prompt each step)" if self.greedy_baseline else "",
                 self.cfg.actor.policy_loss.loss_mode)
        log.info("training steps %d..%d of %d (%d prompts x %d samples per step, world size %d; %d start-up objects "
                 "frozen out of the garbage collector)", self.step + 1, c.total_steps, c.total_steps,
                 self.plan.prompts_per_step, self.cfg.rollout.n, self.plan.train_dp_size, frozen)
        while self.step < c.total_steps:
            self.state = self.state.next_step()
            metrics = self.train_step()
            decision = self.judge(metrics)
            # The row goes out before any checkpoint: a committed checkpoint of step N implies its row is flushed,
            # so a crash right after the commit never leaves a hole in the history.
            self.log_metrics(self.step, metrics)
            exit_code = self.obey(decision)
            if exit_code is not None:
                return exit_code
            if self.should_save() and c.ckpt.latest_committed() != self.step:  # a rollback has just saved
                self.recovery.save(self.state, background=self.cfg.checkpoint.async_save)
            exit_code = self.at_boundary()
            if exit_code is not None:
                return exit_code
        committed = self.c.ckpt.latest_committed()  # waits for a background save in flight
        if committed != self.step and self.cfg.checkpoint.save_every >= 0:  # -1: no final one (verl's save_freq)
            self.recovery.save(self.state)
        return exitcodes.DONE

    def train_step(self) -> dict[str, float]:
        """One PPO step on this rank; returns the step's metrics row (identical on every rank)."""
        c = self.c
        start = time.perf_counter()
        self.timer = PhaseTimer()
        self.inject.before_step(self.step, self.state.branch, c.critic.model if c.critic is not None else None)
        batch = self.rollout()
        scored, reward_metrics = self.score(batch)
        batch |= scored
        if self.env.rank == 0:  # a few trajectories for people to read (hpcppo samples)
            samples.write_samples(c.run_dir, self.step, batch, c.tokenizer, self.cfg.trainer.log_samples)
        batch |= self.old_log_probs_ref_and_values(batch)
        advantages, metrics, tokens = self.compute_advantages(batch)
        self.check_sync(metrics)
        batch |= advantages
        if c.critic is not None:
            metrics |= self.update_critic(batch)
        if self.step > self.cfg.critic.warmup_updates:
            metrics |= self.update_actor(batch)
        if self.cfg.trainer.test_freq > 0 and self.step % self.cfg.trainer.test_freq == 0:  # 0 and -1: never
            metrics |= self.validate()
        metrics |= reward_metrics | self.source_metrics
        metrics |= {f"time/{k}_s": v for k, v in self.timer.times.items()}
        step_time = time.perf_counter() - start
        metrics |= {"perf/step_time_s": step_time, "perf/tokens_per_s": tokens / step_time,
                    "perf/max_memory_gb": self.peak_memory_gb()}
        if self.recovery.last_checkpoint_s is not None:
            metrics["time/checkpoint_s"], self.recovery.last_checkpoint_s = self.recovery.last_checkpoint_s, None
        return self.inject.on_row(self.step, self.state.branch, metrics)

    # ------------------------------------------------------------------ phases
    def rollout(self) -> Batch:
        """This rank's share of the step's samples from the rollout source, as a training batch (with ReMax's
        greedy baseline scores)."""
        c = self.c
        # A per-(seed, step, rollout group, branch) seed: a resumed run samples exactly what an uninterrupted run
        # would, and the ranks of one tensor-parallel group sample alike (with tp = 1 the group is the rank).
        seed = derive_seed(self.cfg.seed, self.step, c.groups.dp_rank, self.state.branch)
        got = self.source.collect(StepContext(step=self.step, branch=self.state.branch,
                                              actor_version=self.state.actor_version, seed=seed))
        self.timer.add(got.times)
        self.source_metrics = got.metrics | rollout_phase.tool_metrics(c, got)
        batch = batching.to_training_batch(got.batch, got.prompts, c.device)
        if got.tool_rewards is not None:  # verl's tool_extra_fields: into the reward function's extra_info
            batch["tool_rewards"] = got.tool_rewards
        if got.tool_scores is not None:  # the tools' calc_reward, as verl's reward_scores: into the same extra_info
            batch["tool_scores"] = got.tool_scores
        if got.greedy is not None:  # one per prompt -> one per sample (rows are prompt-major)
            with self.timer("reward"):
                baselines = rollout_phase.greedy_baseline_scores(c, got.prompts, got.greedy, got.greedy_tool_rewards,
                                                                 got.greedy_tool_scores)
            batch["reward_baselines"] = baselines.to(c.device)[got.batch.prompt_index.to(c.device)]
        # The update is data parallel over all ranks: each rank of the group trains on its own share.
        return batching.tp_share(batch, c.groups.tp_rank, c.groups.tp_size)

    def check_sync(self, metrics: dict[str, float]) -> None:
        """The weight-sync guard: stop before the update when the engine's log-probs of this step's samples are not
        the trainer's (``rollout/logprob_gap`` past ``rollout.logprob_gap_max``, :mod:`hpcppo.config.sync_guard`).

        A failed run, not a watchdog pause: a bad sync is a defect of the engine's weight path that a resume would
        meet again on its first step, and no watchdog action (rollback, KL, grad clip) repairs it. Stopping before
        the update keeps every committed checkpoint free of steps trained on another policy's samples. The gap is
        computed from the gathered batch, identical on every rank, so all ranks raise together (no collective is
        left waiting); the job's entry point records the line as the exit record's reason (``hpcppo status``)."""
        gap = metrics.get("rollout/logprob_gap")
        if gap is None:
            return  # an engine without log-probs of its samples: nothing to compare
        if self.source_metrics.get("rollout/staleness_max", 0.0) > 0:
            return  # split placement: samples of an older policy differ from the actor's by design (the gap is logged)
        line = sync_guard.gap_verdict(gap, self.plan.logprob_gap_max, self.plan.logprob_gap_max_from,
                                      step=self.step, engine=self.cfg.rollout.engine)
        if line is not None:
            self.audit.record(self.step, events.SYNC_MISMATCH, line, source="trainer", gap=gap,
                              limit=self.plan.logprob_gap_max)
            raise WeightSyncError(line)

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The scores (the reward model's, or the rule-based ones with the reward manager's penalty) on each
        response's last token, and the phase's metrics."""
        c = self.c
        with self.timer("reward"):
            records = batch["records"]
            attend = batch["response_attention_mask"]  # the whole continuation: its text, its length, its end
            if c.reward_model is not None:
                scores, metrics = c.reward_model.score(c.tokenizer, records, batch["responses"], attend)
                return {"token_level_scores": batching.place_scores(scores.tolist(), attend)}, metrics
            texts = c.tokenizer.batch_decode(batch["responses"] * attend, skip_special_tokens=True)
            penalties: list[float] = []
            extra = [r.extra_info for r in records]
            if "tool_rewards" in batch:  # the tool loop's results, as verl's reward managers pass them
                extra = with_tool_results(extra, batch["tool_rewards"], batch.get("tool_scores"))
            rule = c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                              extra, lengths=attend.sum(-1).tolist(), penalties=penalties)
            log_overlong = self.cfg.reward_manager.overlong_buffer.log and self.cfg.reward_manager.name == "dapo"
            metrics = reward_phase.overlong_metrics(penalties) if log_overlong else {}
            return {"token_level_scores": batching.place_scores(rule, attend)}, metrics

    @torch.no_grad()
    def old_log_probs_ref_and_values(self, batch: Batch) -> Batch:
        """Log-probs of the rollout policy (and the reference's), and the critic's values, before the update."""
        c, p = self.c, self.plan
        args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1])
        temperature = c.sampling.temperature or 1.0
        budget = self.cfg.rollout.max_tokens_per_micro_batch
        # Token-budget micro-batches (agreed in count across ranks) or fixed-size ones (micro_batches=None).
        packed = self.cfg.model.remove_padding
        groups = batching.token_budget_groups([batch["attention_mask"]], args[3], budget, packed=packed)[0] \
            if budget else None
        rows = p.logprob_micro_batch_per_rank
        out: Batch = {}
        if rollout_correction.bypass(self.cfg.algorithm.rollout_correction):  # verl's apply_bypass_mode: no pass
            out["old_log_probs"] = batch["rollout_log_probs"]
        else:
            # The optimal token baselines' sum_v pi_v^2 comes from the same pass (verl: dp_actor's
            # _forward_micro_batch with actor.calculate_sum_pi_squared), only for the estimators that read it.
            with_spi = estimators.lookup(self.cfg.algorithm.adv_estimator).needs_sum_pi_squared
            with self.timer("old_logprob"):
                old = compute_log_prob_outputs(c.actor.model, *args, temperature=temperature,
                                               with_sum_pi_squared=with_spi, micro_batch_size=rows,
                                               micro_batches=groups, packed=packed)
            out["old_log_probs"] = old.log_probs
            if old.sum_pi_squared is not None:
                out["sum_pi_squared"] = old.sum_pi_squared
        with c.reference_policy() as reference:
            if reference is not None:
                with self.timer("ref"):
                    out["ref_log_probs"] = compute_log_probs(reference, *args, temperature=temperature,
                                                             micro_batch_size=rows, micro_batches=groups,
                                                             packed=packed)
        if c.critic is not None:
            with self.timer("values"):
                # The forward attends over every token; values are kept where the loss mask is (GAE, the value
                # loss and the critic's metrics read no others), as verl's critic masks them with response_mask.
                out["values"] = compute_values(c.critic.model, *args, response_mask=batch["response_mask"],
                                               micro_batch_size=rows, micro_batches=groups, packed=packed)
        return out

    def compute_advantages(self, batch: Batch) -> tuple[Batch, dict[str, float], float]:
        """Gather the batch's small tensors, apply the KL penalty and the estimator on the whole batch.

        Every rank computes the same numbers (the controller's state stays identical everywhere). Returns this
        rank's rows of ``token_level_rewards``, ``advantages`` and ``returns``, the batch-level metrics and the
        batch's token count (prompts and responses, all ranks).
        """
        c, cfg = self.c, self.cfg
        with self.timer("adv"):
            keys = ["token_level_scores", "old_log_probs", "response_mask", "response_attention_mask", "seq_tokens",
                    "prompt_len", "prompt_index"]
            keys += [k for k in ("ref_log_probs", "values", "rollout_log_probs", "reward_baselines", "sum_pi_squared")
                     if k in batch]
            full = batching.gather_rows({k: batch[k] for k in keys})
            mask = full["response_mask"]
            kl_coef = self.state.kl_coef  # the coefficient this step's penalty uses (the next one is set after)
            extra: dict[str, float] = {}
            if self.plan.kl_penalty_in_reward:
                scores = full["token_level_scores"]
                rewards, reward_kl = algos.apply_kl_penalty(scores, full["old_log_probs"], full["ref_log_probs"],
                                                            mask, kl_coef, cfg.algorithm.kl_penalty)
                self.state = self.state.with_kl_coef(c.kl_ctrl.next_coef(kl_coef, reward_kl, scores.shape[0]))
                extra["kl/reward_penalty"] = float(reward_kl)
            else:
                rewards = full["token_level_scores"].float()
            corrected, rc_metrics = rollout_correction.decoupled(full, cfg.algorithm.rollout_correction)
            extra |= rc_metrics
            inputs = algos.AdvantageInputs(
                token_level_rewards=rewards, response_mask=corrected.get("response_mask", mask),
                values=full.get("values"),
                index=full["prompt_index"], gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam,
                norm_adv_by_std=cfg.algorithm.norm_adv_by_std_in_grpo, reward_baselines=full.get("reward_baselines"),
                # the optimal token baselines' (verl's compute_advantage: sum_pi_squared, rollout_is_weights)
                old_log_probs=full["old_log_probs"], sum_pi_squared=full.get("sum_pi_squared"),
                rollout_is_weights=corrected.get("rollout_is_weights"),
            )
            advantages, returns = algos.compute_advantage(cfg.algorithm.adv_estimator, inputs)
            full |= {"token_level_rewards": rewards, "advantages": advantages, "returns": returns}
            rows = batching.local_rows(batch["response_mask"].shape[0], self.env.rank)
            width = batch["response_mask"].shape[1]
            mine = {k: full[k][rows, :width] for k in ("token_level_rewards", "advantages", "returns")}
            mine |= {k: v[rows, :width] for k, v in corrected.items()}  # the rejections and IS weights the losses use
            metrics = batching.batch_metrics(full, kl_coef=kl_coef, max_response_length=cfg.data.max_response_length)
        return mine, metrics | extra, float(full["seq_tokens"].sum())

    def update_settings(self, prefix: str, *, epochs: int, mini: int, micro: int, grad_clip: float,
                        max_tokens: int = 0) -> UpdateSettings:
        return UpdateSettings(prefix=prefix, epochs=epochs, mini_batch_per_rank=mini, micro_batch_per_rank=micro,
                              grad_clip=self.state.grad_clip(grad_clip), world_size=self.plan.train_dp_size,
                              max_response_length=self.cfg.data.max_response_length,
                              max_tokens_per_micro_batch=max_tokens, remove_padding=self.cfg.model.remove_padding)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        c, p = self.c, self.plan
        settings = self.update_settings("critic", epochs=p.critic_ppo_epochs, mini=p.critic_mini_batch_per_rank,
                                        micro=p.critic_micro_batch_per_rank, grad_clip=self.cfg.critic.grad_clip,
                                        max_tokens=self.cfg.critic.max_tokens_per_micro_batch)
        critic = c.critic_set()
        with self.timer("critic_update"):
            loss = critic_loss(critic.model, self.cfg.critic, packed=self.cfg.model.remove_padding)
            return run_update(batch, critic.model, critic.optim, critic.lr, settings, loss,
                              offload_optimizer=critic.optim_offload)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        c, p = self.c, self.plan
        settings = self.update_settings("actor", epochs=p.actor_ppo_epochs, mini=p.actor_mini_batch_per_rank,
                                        micro=p.actor_micro_batch_per_rank, grad_clip=self.cfg.actor.grad_clip,
                                        max_tokens=self.cfg.actor.max_tokens_per_micro_batch)
        generator = None
        if self.cfg.actor.policy_loss.loss_mode == "clip_cov":  # its random choice: seeded like the rollout
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.seed, self.step, self.env.rank,
                                                                  self.state.branch) ^ CLIP_COV_SEED_SALT)
        loss = actor_loss(c.actor.model, self.cfg.actor, clip_ratio_low=p.clip_ratio_low, clip_ratio_high=p.clip_ratio_high,
                          kl_loss=p.kl_loss, temperature=c.sampling.temperature or 1.0, generator=generator,
                          packed=self.cfg.model.remove_padding,
                          rollout_correction=rollout_correction.params(self.cfg.algorithm.rollout_correction),
                          all_reduce_sum=rollout_correction.all_reduce_sum)
        with self.timer("actor_update"):
            return run_update(batch, c.actor.model, c.actor.optim, c.actor.lr, settings, loss,
                              offload_optimizer=c.actor.optim_offload, on_step=self._actor_stepped)

    def _actor_stepped(self) -> None:
        self.state = self.state.actor_stepped()

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Decode ``rollout.val_n`` responses per validation prompt (sharded over ranks) and score them: the mean
        score per data source and overall and, for ``val_n`` > 1, verl's statistics per data source
        (:mod:`hpcppo.train.validation`: mean@n, std@n, best@k, worst@k, maj@k)."""
        c = self.c
        if c.val_data is None or (c.reward_model is not None and c.val_data.records
                                   and c.val_data.records[0].reward_style == "model"):
            return {}  # verl's _validate: "we only do validation on rule-based rm"
        g = c.groups
        n = c.val_sampling.n
        stats = metric_names.validation_stats(n)
        # With DAPO's overlong buffer verl's core variable is acc, the score before the penalty: kept apart.
        acc = overlong_buffer_on(self.cfg.reward_manager)
        # Per data source: score sum, sample count, then each statistic's sum and count over prompts; the same
        # for acc after it.
        width = 2 + 2 * len(stats)
        sums = [[0.0] * (width * (2 if acc else 1)) for _ in c.val_sources]
        # The source shards it (colocated: over rollout groups, whose tensor-parallel ranks decode the same prompts
        # with the same seed, only the group's first rank counting the scores; split: the rollout ranks generate
        # it in chunks, each trainer rank scores its own). Sampled validation (val_temperature > 0) draws from its
        # own seeded stream, never the global RNG.
        ctx = StepContext(step=self.step, branch=self.state.branch, actor_version=self.state.actor_version, seed=0)

        def seed_of(shard: int) -> int:
            return derive_seed(self.cfg.seed, self.step, shard, self.state.branch) ^ VALIDATION_SEED_SALT

        tools = list(c.tools.schemas) if c.tools is not None else []
        tool_sums, tool_max = stats_vector(LoopStats(), tools)  # this rank's chunks' counts, summed below
        for prompts, got in self.source.validation(ctx, c.val_data, c.val_sampling, seed_of,
                                                   VALIDATION_PROMPTS_PER_CALL):
            out = got.batch
            attend = out.response_attention_mask  # the whole continuation is scored, as in training
            texts = c.tokenizer.batch_decode(out.response_ids * attend, skip_special_tokens=True)
            records = [prompts[int(j)].record for j in out.prompt_index]  # n rows per prompt, prompt-major
            extra = [r.extra_info for r in records]
            if got.tool_rewards is not None:  # the tool loop's results, as in training (Trainer.score)
                extra = with_tool_results(extra, got.tool_rewards, got.tool_scores)
            preds: list[Any] = []
            penalties: list[float] = []
            scores = c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                                extra, preds=preds, lengths=attend.sum(-1).tolist(), penalties=penalties)
            if not g.is_tp_leader:
                continue
            if got.tool_stats is not None:
                chunk_sums, (turns_max, tool_s) = stats_vector(got.tool_stats, tools)
                tool_sums = [a + b for a, b in zip(tool_sums, chunk_sums)]
                tool_max = [max(tool_max[0], turns_max), tool_max[1] + tool_s]  # the rank's tool time: summed
            rows = [sums[c.val_sources.index(p.record.data_source)] for p in prompts]
            validation.accumulate(rows, scores, preds, n, stats)
            if acc:
                validation.accumulate(rows, [s - q for s, q in zip(scores, penalties)], preds, n, stats,
                                      offset=width)
        flat = all_reduce_host([x for row in sums for x in row], "sum")
        totals = [flat[i * len(row) : (i + 1) * len(row)] for i, row in enumerate(sums)]
        metrics = validation.source_metrics(metric_names.VALIDATION_PREFIX, c.val_sources,
                                            [t[:width] for t in totals], stats)
        metrics["val/score"] = sum(t[0] for t in totals) / max(sum(t[1] for t in totals), 1)
        if acc:
            metrics |= validation.source_metrics(metric_names.VALIDATION_ACC_PREFIX, c.val_sources,
                                                 [t[width:] for t in totals], stats)
        if c.tools is not None:  # the tool loop's counts over the validation's trajectories (val/turns_mean ...)
            counted = stats_metrics(all_reduce_host(tool_sums, "sum"), all_reduce_host(tool_max, "max"), tools)
            metrics |= {metric_names.validation_tool_name(k): v for k, v in counted.items()}
        return metrics

    def peak_memory_gb(self) -> float:
        """The largest peak over ranks: allocated CUDA memory on GPUs, the process's peak RSS on CPUs."""
        if self.c.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.c.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return all_reduce_host([peak / 2**30], "max")[0]

    # ------------------------------------------------------------------ step boundary
    def at_boundary(self) -> int | None:
        """Requests from outside, agreed by all ranks: preemption signals (any rank), a pause request, rollback
        requests from ``hpcppo rollback`` (rank 0 reads the inbox). Returns an exit code when the run stops."""
        c = self.c
        pause_requested = control.pause_requested(c.run_dir)
        requests = control.pending(c.run_dir) if self.env.rank == 0 else []
        preempted, paused, asked = (x > 0 for x in all_reduce_host(
            [1.0 if c.preempt.local else 0.0, 1.0 if pause_requested else 0.0, float(len(requests))], "max"))
        if asked:
            self.state = self.recovery.serve_requests(self.state, requests)
        if not (preempted or paused):
            return None
        where = f"after step {self.step} with a committed checkpoint" if self.step else "before the first step"
        if preempted:
            return self.recovery.stop(self.state, "requeue", f"preempted: stopping {where}", event=events.PREEMPTED,
                                      save=self.cfg.checkpoint.save_on_preempt)
        # The request is served by the pause; its text becomes the reason `hpcppo status` shows.
        reason = (control.pause_reason_requested(c.run_dir) if self.env.rank == 0 else "") or "pause requested"
        code = self.recovery.stop(self.state, "pause", reason, event=events.PAUSED)
        if self.env.rank == 0:
            control.pause_served(c.run_dir)
        return code

    # ------------------------------------------------------------------ the watchdog
    def judge(self, metrics: dict[str, float]) -> Decision:
        """Add this step's row to the state's history and judge it (collective when there are rules: rank 0 runs the
        pure :func:`~hpcppo.watchdog.decide` and broadcasts the decision, so every rank applies the same actions even
        if their views of a metric could differ)."""
        self.state = self.state.with_row(metrics, self.keep)
        if not self.rules:
            return Decision(actions=(), state=self.state.watchdog)
        decision = decide(self.state.history, self.rules, self.state.watchdog) if self.env.rank == 0 else None
        decision = broadcast_object(decision)
        self.state = attrs.evolve(self.state, watchdog=decision.state)
        return decision

    def obey(self, decision: Decision) -> int | None:
        """Carry out the decision on this step (every rank alike); an exit code when the run must stop."""
        outcome = respond(decision, self.state, self.recovery, self.rules_by_name,
                          grad_clips={"actor": self.cfg.actor.grad_clip, "critic": self.cfg.critic.grad_clip})
        self.state = outcome.state
        return outcome.exit_code

    # ------------------------------------------------------------------ bookkeeping
    def log_metrics(self, step: int, metrics: dict[str, float], note: str = "") -> None:
        if self.c.metrics is not None:
            self.c.metrics.log(step, metrics)
        self.trackers.log(step, metrics)
        if self.env.rank == 0 and (step % self.cfg.trainer.log_every == 0 or note):
            text = "  ".join(f"{k}={metrics[k]:.4g}" for k in metric_names.headline_names("log")
                             if k in metrics and not math.isnan(metrics[k]))
            log.info("step %d/%d %s%s", step, self.c.total_steps, text, f" ({note})" if note else "")

    def should_save(self) -> bool:
        every = self.cfg.checkpoint.save_every
        return every > 0 and self.step % every == 0  # 0: only the final one; -1: none (verl's save_freq)

    def close(self) -> None:
        try:
            self.trackers.close()
            if self.bridge is not None:  # the rollout ranks leave with the trainers, whatever ended the run
                try:
                    self.bridge.notify_all(Notice(stop=True))
                finally:
                    self.bridge.close()
        finally:
            self.c.close()


def run_training(compiled: Any, env: Any, run_dir: Path, *, preempt: Any = None) -> int:
    components = build_components(compiled, env, Path(run_dir), preempt=preempt)
    trainer = Trainer(components)
    try:
        code = trainer.train()
        trainer.recovery.settle(trainer.step)  # done, requeue or pause: a background save in flight commits first
        return code
    finally:
        trainer.close()
