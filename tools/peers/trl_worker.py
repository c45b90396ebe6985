"""TRL 1.12.0's PPOTrainer on the workload of tools/bench_peers.py, stepped by the benchmark (issue 11).

Runs in .venv-trl (tools/peers/setup_trl.sh), never in hpcppo's venv:
    .venv-trl/bin/python tools/peers/trl_worker.py WORK_DIR THREADS
WORK_DIR holds what workload.build wrote (model, tokenizer, prompt_ids.json). The trainer runs as shipped
(``PPOTrainer.train``); a callback stops it after every iteration: it prints ``BENCH {json}`` (the iteration's wall
time and its phases) and waits for a line on stdin before the next iteration, so the benchmark interleaves it with
the other two loops. The phases are timed by wrapping four functions of TRL's module (no change to what they do):
``batch_generation`` (generate, with the logits that TRL takes as the old log-probs: it makes no separate
old-log-prob forward), ``forward`` without grad (the reference), ``get_reward`` on the value model (values) and on
the reward model (reward_model: TRL scores with a model, hpcppo and the cleanrl loop with a rule); ``rest`` is the
remainder (advantages, the joint actor+critic update, logging).

What differs from hpcppo's passes: no old-log-prob forward (-2 N_actor x 64 x 21 FLOPs), a reward-model forward
(+2 N_rm x 64 x 21), one joint policy+value update per mini-batch with one AdamW over both (the same FLOPs as two).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload as W  # noqa: E402


def main() -> int:
    work, threads = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    import transformers
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast,
                              TrainerCallback)

    import trl.experimental.ppo.ppo_trainer as ppo_mod
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    tok = PreTrainedTokenizerFast.from_pretrained(str(work / "tokenizer"))
    model_dir, f32 = str(work / "model"), torch.float32
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=f32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=f32)
    value = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=f32)
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=f32)
    prompts = json.loads((work / "prompt_ids.json").read_text())
    dataset = Dataset.from_dict({"input_ids": prompts})
    config = PPOConfig(
        output_dir=str(work / "trl-out"), report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, seed=0, learning_rate=W.LR, lr_scheduler_type="constant",
        per_device_train_batch_size=W.PROMPTS, gradient_accumulation_steps=1, num_mini_batches=W.MINI_BATCHES,
        num_ppo_epochs=W.EPOCHS, local_rollout_forward_batch_size=W.PROMPTS, total_episodes=W.PROMPTS * iters,
        response_length=W.RESPONSE_LEN, temperature=1.0, stop_token=None, missing_eos_penalty=None,
        kl_coef=W.KL_COEF, kl_estimator="k1", cliprange=W.CLIP, cliprange_value=W.VALUE_CLIP, vf_coef=1.0,
        gamma=W.GAMMA, lam=W.LAM, whiten_rewards=False, num_sample_generations=0, bf16=False, fp16=False,
        dataloader_drop_last=True,
    )
    phases: dict[str, float] = {}

    def timed(name_of, fn):
        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                name = name_of(*args)
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return wrapped

    ppo_mod.batch_generation = timed(lambda *a: "generate", ppo_mod.batch_generation)
    ppo_mod.forward = timed(lambda *a: "ref" if not torch.is_grad_enabled() else "update_forward", ppo_mod.forward)
    ppo_mod.get_reward = timed(lambda m, *a: "reward_model" if m is reward else "values", ppo_mod.get_reward)

    class Step(TrainerCallback):
        mark = 0.0

        def go(self) -> None:
            if not sys.stdin.readline():  # the benchmark closed the pipe: stop
                sys.exit(0)
            phases.clear()
            Step.mark = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            self.go()

        def on_step_end(self, args, state, control, **kwargs):
            total = time.perf_counter() - Step.mark
            known = {k: v for k, v in phases.items() if k != "update_forward"}
            out = {"iteration": total, **known, "rest": total - sum(known.values())}
            print("BENCH " + json.dumps(out), flush=True)
            self.go()

    trainer = PPOTrainer(args=config, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=dataset, callbacks=[Step()])
    params = {"actor": sum(p.numel() for p in policy.parameters()),
              "critic": sum(p.numel() for p in value.parameters()),
              "reward_model": sum(p.numel() for p in reward.parameters())}
    print("BENCH " + json.dumps({"ready": True, "params": params, "trl": __import__("trl").__version__}), flush=True)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
