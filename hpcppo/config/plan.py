"""``RunPlan``: every derived number of a run, computed once by :func:`hpcppo.config.resolve.resolve`.

Batch vocabulary (verl's): a *prompt* yields ``rollout.n`` *samples*; mini-batches count prompts in the
spec and samples here; micro-batches count samples per rank. The trainer, the renderer and the
launcher read these fields instead of redoing the arithmetic.
"""

from __future__ import annotations

import attrs

from hpcppo.config.fields import opt

__all__ = ["RunPlan", "VALIDATION_PROMPTS_PER_CALL"]

# Validation decodes its prompts in engine calls of this many (each with rollout.val_n responses per prompt):
# hpcppo.train.trainer.Trainer.validate, and hpcppo.sizing's estimate of one validation.
VALIDATION_PROMPTS_PER_CALL = 64


@attrs.frozen(kw_only=True)
class RunPlan:
    """The resolved layout and batch arithmetic of a run (site + experiment)."""

    scheduler: str = opt(help="slurm or local (from the site).")
    nodes: int = opt(help="Nodes of the job.")
    ranks_per_node: int = opt(help="Trainer processes per node (one per GPU on GPU sites).")
    world_size: int = opt(help="nodes x ranks_per_node.")
    gpus_per_node: int = opt(help="GPUs requested per node (0 on CPU sites).")
    cpus_per_rank: int = opt(help="CPU cores per rank (--cpus-per-task).")
    device: str = opt(help="cuda or cpu.")
    backend: str = opt(help="torch.distributed backend: nccl (cuda) or gloo (cpu).")
    tensor_parallel_size: int = opt(help="Rollout tensor-parallel size.")
    dp_size: int = opt(help="Rollout data-parallel groups = generating ranks / tensor_parallel_size (colocated: "
                            "world_size; split: the rollout ranks, i.e. engines); prompts are split over them.")
    train_dp_size: int = opt(help="Trainer ranks, which the training batch is split over and FSDP shards over: "
                                  "world_size colocated, world_size - rollout_ranks split.")
    placement: str = opt(help="rollout.placement: colocated or split (hpcppo.placement).")
    rollout_ranks: int = opt(help="Ranks that only generate (split); 0 colocated.")
    hsdp: bool = opt(help="Hybrid sharded data parallel: replicate across (trainer) nodes, shard within a node.")
    mesh_shape: list[int] = opt(help="The trainers' device-mesh shape: [replicate, shard] with HSDP (trainer nodes, "
                                     "trainer ranks per node), [train_dp_size] otherwise.")
    mesh_dim_names: list[str] = opt(help="Device-mesh dimension names: [\"replicate\", \"shard\"] or [\"shard\"].")
    time_limit_s: int = opt(help="Wall-time limit in seconds.")
    time_limit: str = opt(help="Wall-time limit in Slurm format (HH:MM:SS or D-HH:MM:SS).")
    signal_lead_s: int = opt(help="Seconds before the limit at which USR2 asks for a checkpoint (0 on local sites).")
    prompts_per_step: int = opt(help="trainer.train_batch_size.")
    samples_per_step: int = opt(help="train_batch_size x rollout.n.")
    prompts_per_rank: int = opt(help="Prompts each rollout data-parallel group generates per step = train_batch_size / "
                                     "dp_size; split: the busiest rollout engine's, ceil(train_dp_size / dp_size) "
                                     "trainer shares of train_batch_size / train_dp_size prompts.")
    samples_per_rank: int = opt(help="Samples each trainer rank trains on per step = samples_per_step / train_dp_size.")
    logprob_micro_batch_per_rank: int = opt(help="Samples per forward when recomputing log-probs and values.")
    actor_ppo_epochs: int = opt(help="Actor passes over each batch.")
    actor_mini_batch_samples: int = opt(help="Samples per actor optimizer step (all ranks) = ppo_mini_batch_size x n.")
    actor_mini_batch_per_rank: int = opt(help="Samples per actor optimizer step on one rank.")
    actor_micro_batch_per_rank: int = opt(help="Samples per actor forward/backward on one rank.")
    grad_accum_steps_actor: int = opt(help="Actor micro-batches per optimizer step.")
    mini_batches_per_epoch_actor: int = opt(help="Actor optimizer steps per PPO epoch = train_batch_size / ppo_mini_batch_size.")
    actor_optimizer_steps_per_step: int = opt(help="Actor optimizer steps per training step = epochs x mini-batches.")
    needs_critic: bool = opt(help="A critic is trained (the advantage estimator needs values, e.g. gae).")
    critic_ppo_epochs: int = opt(help="Critic passes over each batch (0 when there is no critic).")
    critic_mini_batch_samples: int = opt(help="Samples per critic optimizer step (all ranks).")
    critic_mini_batch_per_rank: int = opt(help="Samples per critic optimizer step on one rank.")
    critic_micro_batch_per_rank: int = opt(help="Samples per critic forward/backward on one rank.")
    grad_accum_steps_critic: int = opt(help="Critic micro-batches per optimizer step.")
    mini_batches_per_epoch_critic: int = opt(help="Critic optimizer steps per PPO epoch.")
    needs_reference: bool = opt(help="The frozen reference policy is loaded.")
    kl_penalty_in_reward: bool = opt(help="KL(actor || reference) is subtracted from the rewards.")
    kl_loss: bool = opt(help="A KL loss term is added to the policy loss.")
    clip_ratio_low: float = opt(help="Resolved lower clip epsilon.")
    clip_ratio_high: float = opt(help="Resolved upper clip epsilon.")
    actor_param_dtype: str = opt(help="Resolved FSDP parameter dtype of the actor.")
    critic_param_dtype: str = opt(help="Resolved FSDP parameter dtype of the critic.")
    logprob_gap_max: float = opt(help="The weight-sync guard's limit on rollout/logprob_gap (-1 = off).")
    logprob_gap_max_from: str = opt(help="Where logprob_gap_max comes from: rollout.logprob_gap_max or the "
                                         "default for the engine's and the trainer's dtypes.")
    total_steps: int = opt(help="Training steps; 0 = total_epochs x steps per epoch, known once the data size is.")
    total_epochs: int = opt(help="trainer.total_epochs (used when total_steps = 0).")
    max_sequence_length: int = opt(help="max_prompt_length + max_response_length.")
