"""The PPO trainer: one readable loop.

    rollout -> rewards -> old log-probs, reference log-probs, values -> KL in reward (or as a loss)
    -> advantages (estimator registry) -> critic update -> actor update -> metrics -> checkpoint
    -> preemption / control requests

Every rank runs the same loop on its share of the prompts. The small ``[batch, response_len]`` tensors
(scores, log-probs, values, masks) are gathered so that the KL controller and the advantage estimator
see the whole batch exactly as verl's driver does (global whitening, identical controller state on all
ranks); the models only ever see this rank's samples. Components are built in :mod:`hpcppo.train.build`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcppo import algos, exitcodes
from hpcppo.distributed.weights import iter_full_params
from hpcppo.fsutil import atomic_write_text
from hpcppo.rollout.base import derive_seed
from hpcppo.train import batching
from hpcppo.train.build import Components, build_components
from hpcppo.models import compute_log_probs, compute_values, forward_log_probs, forward_values
from hpcppo.train.optim import OptimizerStateOffload, offload_optimizer_state

log = logging.getLogger("hpcppo.train")


class PhaseTimer:
    """Wall time of each phase of a step, in seconds (``time/<phase>_s`` metrics)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] += time.perf_counter() - start


class Trainer:
    """PPO on one rank of the job. Build with :meth:`from_run`; call :meth:`train`; always :meth:`close`."""

    def __init__(self, c: Components):
        self.c = c
        self.cfg = c.cfg
        self.plan = c.plan
        self.env = c.env
        self.step = 0
        # Duration of the checkpoint written after the previous row; recorded as time/checkpoint_s in the next.
        self.last_checkpoint_s: float | None = None
        # The engine holds the actor's weights of version `engine_version`; -1 = not known to match.
        self.actor_version = 0
        self.engine_version = -1

    # ------------------------------------------------------------------ the loop
    def train(self) -> int:
        """Train until ``total_steps``; returns the job exit code (done, requeue, paused)."""
        c = self.c
        self.step = self.maybe_resume()
        exit_code = self.check_interrupts()  # a signal or a pause request that came while the models loaded
        if exit_code is not None:
            return exit_code
        if self.cfg.trainer.val_before_train and self.step == 0:
            self.log_metrics(0, self.validate(), "validation before training")
        log.info("training steps %d..%d of %d (%d prompts x %d samples per step, world size %d)",
                 self.step + 1, c.total_steps, c.total_steps, self.plan.prompts_per_step, self.cfg.rollout.n,
                 self.plan.world_size)
        while self.step < c.total_steps:
            step_start = time.perf_counter()
            timer = PhaseTimer()
            self.step += 1
            batch = self.rollout(timer)
            self.score(batch, timer)
            self.compute_old_log_probs_ref_and_values(batch, timer)
            full = self.compute_advantages(batch, timer)
            metrics = self.batch_metrics(batch, full)
            if c.critic is not None:
                with timer("critic_update"):
                    metrics |= self.update_critic(batch)
            if self.step > self.cfg.critic.warmup_updates:
                with timer("actor_update"):
                    metrics |= self.update_actor(batch)
            if self.cfg.trainer.test_freq and self.step % self.cfg.trainer.test_freq == 0:
                metrics |= self.validate()
            metrics |= {f"time/{k}_s": v for k, v in timer.times.items()}
            step_time = time.perf_counter() - step_start
            tokens = float(full["seq_tokens"].sum())
            metrics |= {"perf/step_time_s": step_time, "perf/tokens_per_s": tokens / step_time}
            if self.last_checkpoint_s is not None:
                metrics["time/checkpoint_s"], self.last_checkpoint_s = self.last_checkpoint_s, None
            # The row goes out before the checkpoint: a committed checkpoint of step N implies its row is
            # flushed, so a crash right after the commit never leaves a hole in the history.
            self.log_metrics(self.step, metrics)
            if self.should_save():
                self.save_checkpoint()
            exit_code = self.check_interrupts()
            if exit_code is not None:
                return exit_code
        if self.c.ckpt.latest_committed() != self.step:
            self.save_checkpoint()
        return exitcodes.DONE

    # ------------------------------------------------------------------ phases
    def rollout(self, timer: PhaseTimer) -> dict[str, Any]:
        """Sync the actor's weights into the engine and sample ``n`` responses for this rank's prompts."""
        c = self.c
        with timer("weight_sync"):
            c.engine.wake_up()
            self.sync_engine()
        indices = c.sampler.next_batch()
        prompts = [c.train_data[i] for i in indices]
        # A per-(seed, step, rank) seed: a resumed run samples exactly what an uninterrupted run would.
        sampling = dataclasses.replace(c.sampling, seed=derive_seed(self.cfg.seed, self.step, self.env.rank))
        with timer("generate"):
            out = c.engine.generate([p.input_ids for p in prompts], sampling)
            c.engine.sleep()
        return batching.to_training_batch(out, prompts, self.c.device)

    def sync_engine(self) -> None:
        """Stream the actor's weights into the rollout engine unless it already has this version
        (e.g. during critic warm-up the actor does not change). Collective: every rank decides alike."""
        if self.engine_version != self.actor_version:
            self.c.engine.sync_weights(iter_full_params(self.c.actor))
            self.engine_version = self.actor_version

    def score(self, batch: dict[str, Any], timer: PhaseTimer) -> None:
        """Rule-based rewards on the decoded responses; the score sits on each response's last token."""
        with timer("reward"):
            texts = self.c.tokenizer.batch_decode(batch["responses"] * batch["response_mask"], skip_special_tokens=True)
            records = batch["records"]
            scores = self.c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                                     [r.extra_info for r in records])
            batch["token_level_scores"] = batching.place_scores(scores, batch["response_mask"])

    @torch.no_grad()
    def compute_old_log_probs_ref_and_values(self, batch: dict[str, Any], timer: PhaseTimer) -> None:
        c, p = self.c, self.plan
        args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1])
        with timer("old_logprob"):
            batch["old_log_probs"] = compute_log_probs(c.actor, *args, temperature=c.sampling.temperature or 1.0,
                                                       micro_batch_size=p.logprob_micro_batch_per_rank)
        if c.reference is not None:
            with timer("ref"):
                batch["ref_log_probs"] = compute_log_probs(c.reference, *args, temperature=c.sampling.temperature or 1.0,
                                                           micro_batch_size=p.logprob_micro_batch_per_rank)
        if c.critic is not None:
            with timer("values"):
                batch["values"] = compute_values(c.critic, *args, micro_batch_size=p.logprob_micro_batch_per_rank,
                                                 response_mask=batch["response_mask"])

    def compute_advantages(self, batch: dict[str, Any], timer: PhaseTimer) -> dict[str, torch.Tensor]:
        """Gather the batch's small tensors, apply the KL penalty and the estimator on the whole batch.

        Every rank computes the same numbers (the controller's state stays identical everywhere) and keeps
        its own rows. Returns the gathered tensors for batch-level metrics.
        """
        c, cfg = self.c, self.cfg
        with timer("adv"):
            keys = ["token_level_scores", "old_log_probs", "response_mask", "seq_tokens", "prompt_len", "prompt_index"]
            keys += [k for k in ("ref_log_probs", "values", "rollout_log_probs") if k in batch]
            full = batching.gather_rows({k: batch[k] for k in keys})
            mask = full["response_mask"]
            self.kl_coef_used = c.kl_ctrl.value
            if self.plan.kl_penalty_in_reward:
                rewards, current_kl = algos.apply_kl_penalty(full["token_level_scores"], full["old_log_probs"],
                                                             full["ref_log_probs"], mask, c.kl_ctrl,
                                                             cfg.algorithm.kl_penalty)
            else:
                rewards = full["token_level_scores"].float()
            inputs = algos.AdvantageInputs(
                token_level_rewards=rewards, response_mask=mask, values=full.get("values"),
                index=full["prompt_index"], gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam,
                norm_adv_by_std=cfg.algorithm.norm_adv_by_std_in_grpo,
            )
            advantages, returns = algos.compute_advantage(cfg.algorithm.adv_estimator, inputs)
            full["token_level_rewards"], full["advantages"], full["returns"] = rewards, advantages, returns
            rows = batching.local_rows(batch["response_mask"].shape[0], self.env.rank)
            width = batch["response_mask"].shape[1]
            for key in ("token_level_rewards", "advantages", "returns"):
                batch[key] = full[key][rows, :width]
        return full

    def update_critic(self, batch: dict[str, Any]) -> dict[str, float]:
        c, p, cc = self.c, self.plan, self.cfg.critic
        sums = batching.UpdateMetrics()
        offload = OptimizerStateOffload(c.critic_optim, enabled=c.critic_optim_offload)
        for _ in range(p.critic_ppo_epochs):
            for mini in batching.split(batch, p.critic_mini_batch_per_rank):
                info = batching.global_batch_info(mini["response_mask"], self.plan.world_size, self.cfg.data.max_response_length)
                micros = list(batching.split(mini, p.critic_micro_batch_per_rank))
                for i, mb in enumerate(micros):
                    batching.set_grad_sync(c.critic, i == len(micros) - 1)
                    values = forward_values(c.critic, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                            mb["responses"].shape[1])
                    out = algos.value_loss(values, mb["values"], mb["returns"], mb["response_mask"], cc.cliprange_value,
                                           cc.loss_agg_mode, batch_info=info)
                    out["loss"].backward()
                    sums.add("critic/vf_loss", out["loss"], len(micros))
                    sums.add("critic/vf_clipfrac", out["vf_clipfrac"])
                offload.before_step()
                grad_norm = batching.clip_and_step(c.critic, c.critic_optim, cc.grad_clip)
                c.critic_lr.step()
                sums.add("critic/grad_norm", grad_norm)
        offload.after_update()
        return sums.reduce() | {"critic/lr": c.critic_lr.lr}

    def update_actor(self, batch: dict[str, Any]) -> dict[str, float]:
        c, p, ac = self.c, self.plan, self.cfg.actor
        temperature = c.sampling.temperature or 1.0
        sums = batching.UpdateMetrics()
        offload = OptimizerStateOffload(c.actor_optim, enabled=c.actor_optim_offload)
        for _ in range(p.actor_ppo_epochs):
            for mini in batching.split(batch, p.actor_mini_batch_per_rank):
                info = batching.global_batch_info(mini["response_mask"], self.plan.world_size, self.cfg.data.max_response_length)
                micros = list(batching.split(mini, p.actor_micro_batch_per_rank))
                for i, mb in enumerate(micros):
                    batching.set_grad_sync(c.actor, i == len(micros) - 1)
                    log_probs, entropy = forward_log_probs(c.actor, mb["input_ids"], mb["attention_mask"],
                                                           mb["position_ids"], mb["responses"].shape[1],
                                                           temperature=temperature, with_entropy=True)
                    out = algos.policy_loss(mb["old_log_probs"], log_probs, mb["advantages"], mb["response_mask"],
                                            ac.clip_ratio, p.clip_ratio_low, p.clip_ratio_high, ac.clip_ratio_c,
                                            ac.loss_agg_mode, batch_info=info)
                    loss = out["loss"]
                    ent = algos.agg_loss(entropy, mb["response_mask"], ac.loss_agg_mode, batch_info=info)
                    if ac.entropy_coeff:
                        loss = loss - ac.entropy_coeff * ent
                    if p.kl_loss:
                        kl = algos.kl_penalty(log_probs, mb["ref_log_probs"], ac.kl_loss_type)
                        kl_loss = algos.agg_loss(kl, mb["response_mask"], ac.loss_agg_mode, batch_info=info)
                        loss = loss + ac.kl_loss_coef * kl_loss
                        sums.add("actor/kl_loss", kl_loss, len(micros))
                    loss.backward()
                    # A batch_info loss is this micro-batch's share of the global mini-batch loss x dp: the mean over
                    # ranks of the sum over micro-batches is the mini-batch loss.
                    scale = len(micros)
                    sums.add("actor/pg_loss", out["loss"], scale)
                    sums.add("actor/entropy", ent, scale)
                    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
                        sums.add(f"actor/{key}", out[key])
                offload.before_step()
                grad_norm = batching.clip_and_step(c.actor, c.actor_optim, c.grad_clip)
                self.actor_version += 1
                c.actor_lr.step()
                sums.add("actor/grad_norm", grad_norm)
        offload.after_update()
        return sums.reduce() | {"actor/lr": c.actor_lr.lr}

    def batch_metrics(self, batch: dict[str, Any], full: dict[str, torch.Tensor]) -> dict[str, float]:
        return batching.batch_metrics(full, kl_coef=self.kl_coef_used,
                                      max_response_length=self.cfg.data.max_response_length)

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy decoding on the validation prompts (sharded over ranks); mean score per data source."""
        c = self.c
        if c.val_data is None:
            return {}
        c.engine.wake_up()
        self.sync_engine()
        sums = torch.zeros(len(c.val_sources), 2, dtype=torch.float64)
        mine = list(range(self.env.rank, len(c.val_data), self.env.world_size))
        for start in range(0, len(mine), 64):
            prompts = [c.val_data[i] for i in mine[start : start + 64]]
            out = c.engine.generate([p.input_ids for p in prompts], c.val_sampling)
            texts = c.tokenizer.batch_decode(out.response_ids * out.response_mask, skip_special_tokens=True)
            records = [p.record for p in prompts]
            scores = c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                                [r.extra_info for r in records])
            for r, s in zip(records, scores):
                row = c.val_sources.index(r.data_source)
                sums[row, 0] += s
                sums[row, 1] += 1
        c.engine.sleep()
        if dist.is_initialized():
            dist.all_reduce(sums)
        metrics = {f"val/score/{src}": float(sums[i, 0] / max(sums[i, 1], 1)) for i, src in enumerate(c.val_sources)}
        metrics["val/score"] = float(sums[:, 0].sum() / max(float(sums[:, 1].sum()), 1))
        return metrics

    # ------------------------------------------------------------------ bookkeeping
    def log_metrics(self, step: int, metrics: dict[str, float], note: str = "") -> None:
        if self.c.metrics is not None:
            known = {k: v for k, v in metrics.items() if k in self.c.metric_columns}
            self.c.metrics.log(step, known)
        if self.env.rank == 0 and (step % self.cfg.trainer.log_every == 0 or note):
            fields = ["reward/mean", "score/mean", "kl/actor_ref", "actor/pg_loss", "critic/vf_loss", "val/score",
                      "perf/step_time_s"]
            text = "  ".join(f"{k}={metrics[k]:.4g}" for k in fields if k in metrics and not math.isnan(metrics[k]))
            log.info("step %d/%d %s%s", step, self.c.total_steps, text, f" ({note})" if note else "")

    def should_save(self) -> bool:
        every = self.cfg.checkpoint.save_every
        return bool(every) and self.step % every == 0

    def checkpoint_extra(self) -> dict[str, Any]:
        c = self.c
        extra = {
            "step": self.step,
            "sampler": c.sampler.state_dict(),
            "kl_ctrl": c.kl_ctrl.state_dict(),
            "actor_lr": c.actor_lr.state_dict(),
            "grad_clip": float(c.grad_clip),
        }
        if c.critic is not None:
            extra["critic_lr"] = c.critic_lr.state_dict()
        return extra

    def checkpointed(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trained models and their optimizers, by checkpoint name."""
        c = self.c
        models = {"actor": c.actor} | ({"critic": c.critic} if c.critic is not None else {})
        optims = {"actor": c.actor_optim} | ({"critic": c.critic_optim} if c.critic is not None else {})
        return models, optims

    def save_checkpoint(self) -> None:
        c = self.c
        models, optims = self.checkpointed()
        start = time.perf_counter()
        c.ckpt.save(self.step, models=models, optimizers=optims, extra=self.checkpoint_extra())
        self.last_checkpoint_s = time.perf_counter() - start
        if c.metrics is not None:
            c.metrics.fsync()

    def maybe_resume(self) -> int:
        """Continue from the newest committed checkpoint (``checkpoint.resume = "auto"``); returns its step."""
        c = self.c
        latest = c.ckpt.latest_committed()
        if latest is None or self.cfg.checkpoint.resume == "never":
            return 0
        models, optims = self.checkpointed()
        extra = c.ckpt.load(latest, models=models, optimizers=optims)
        c.sampler.load_state_dict(extra["sampler"])
        c.kl_ctrl.load_state_dict(extra["kl_ctrl"])
        c.actor_lr.load_state_dict(extra["actor_lr"])
        c.grad_clip = float(extra.get("grad_clip", c.grad_clip))
        if c.critic is not None:
            c.critic_lr.load_state_dict(extra["critic_lr"])
        # The loaded optimizer state sits on the parameters' devices; with optimizer_offload it waits on the host.
        for name, optim, offload in (("actor", c.actor_optim, c.actor_optim_offload),
                                     ("critic", c.critic_optim, c.critic_optim_offload)):
            if offload:
                moved = offload_optimizer_state(optim)
                log.info("%s optimizer state offloaded to host memory (%.2f MiB on this rank)", name, moved / 2**20)
        if c.metrics is not None:
            c.metrics.log_event(int(extra["step"]), "resume", f"resumed from checkpoint step {latest}")
        log.info("resumed from checkpoint step %d", latest)
        return int(extra["step"])

    def check_interrupts(self) -> int | None:
        """Preemption signal (any rank) or a pause request: checkpoint together and return the exit code."""
        c = self.c
        pause_requested = (self.c.run_dir / "control" / "PAUSE").exists()
        flags = torch.tensor([1.0 if c.preempt.local else 0.0, 1.0 if pause_requested else 0.0])
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        preempted, paused = bool(flags[0] > 0), bool(flags[1] > 0)
        if not (preempted or paused):
            return None
        if (self.cfg.checkpoint.save_on_preempt or paused) and self.step > 0:  # step 0 is the initial state
            if c.ckpt.latest_committed() != self.step:
                self.save_checkpoint()
        kind = "preempted" if preempted else "paused"
        if c.metrics is not None:
            where = f"after step {self.step} with a committed checkpoint" if self.step else "before the first step"
            c.metrics.log_event(self.step, kind, f"stopping {where}")
        if paused and self.env.rank == 0:
            # The request is served; the marker tells `hpcppo status` why the run stopped (`hpcppo resume` clears it).
            request = c.run_dir / "control" / "PAUSE"
            reason = request.read_text().strip() if request.exists() else ""
            atomic_write_text(c.run_dir / "control" / "PAUSED", f"step {self.step}: {reason or 'pause requested'}\n")
            request.unlink(missing_ok=True)
        log.info("%s: %s, exiting", kind, f"checkpointed step {self.step}" if self.step else "before the first step")
        return exitcodes.REQUEUE if preempted else exitcodes.PAUSED

    def close(self) -> None:
        self.c.close()


def run_training(compiled: Any, env: Any, run_dir: Path, *, preempt: Any = None) -> int:
    components = build_components(compiled, env, Path(run_dir), preempt=preempt)
    trainer = Trainer(components)
    try:
        return trainer.train()
    finally:
        trainer.close()
