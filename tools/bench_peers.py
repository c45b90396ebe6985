"""hpcppo against its peers on one workload (issue 11): its real Trainer, TRL 1.12.0's PPOTrainer, a cleanrl-style loop.

    .venv/bin/python tools/bench_peers.py                 # 1 warm-up + 8 measured rounds
    .venv/bin/python tools/bench_peers.py --quick         # 1 + 2 rounds, 1 thread: the smoke test
    tools/peers/setup_trl.sh                              # once, for the TRL peer (.venv-trl; optional)

The workload (tools/peers/workload.py): Qwen2 hidden 128, 2 layers, 4 heads, 2 KV heads, intermediate 256, vocab 64,
untied embeddings, float32; 64 prompts of 5 tokens; 16 new tokens at temperature 1; 1 epoch x 4 mini-batches of 16;
GAE gamma 1 lambda 0.95; clip 0.2, value clip 0.2; k1 KL in the reward at 0.05.

The three, interleaved round by round (A B C A B C ...), so that each ratio compares iterations measured side by side
on a noisy shared machine:

  A  hpcppo's Trainer (world size 1, gloo, FSDP2 on one rank, HF rollout engine, metrics file; no checkpoint in the
     loop), in this process; its phases are its own ``time/*`` metrics.
  B  TRL's PPOTrainer as shipped, in a subprocess of .venv-trl (tools/peers/trl_worker.py), stopped after every
     iteration by a callback; skipped with a message when .venv-trl is absent.
  C  tools/peers/cleanrl_ppo.py, in this process: exactly hpcppo's passes on plain HF models, nothing around them.

Passes that differ (N = parameters of one model, T = 64 x 21 tokens; a forward is ~2 N T FLOPs, an update 6 N T):
  * hpcppo and C: generate, old-log-prob forward, reference forward, value forward, rule reward, critic update,
    actor update. hpcppo masks a row after an EOS it samples (it has no "no stop token" setting); the shapes, hence
    the FLOPs, are those of C.
  * TRL: no old-log-prob forward (it keeps the logits of generate: -2 N_actor T), a reward-model forward (its scorer
    is a model: +2 N_rm T), one joint actor+critic update per mini-batch (same FLOPs as two). Net, with N_rm =
    N_critic, TRL does the same FLOPs per iteration give or take the heads (printed below).
Times are medians [min-max] over the measured rounds; ratios are per round, then their median [min-max].
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import torch  # noqa: E402
import workload as W  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402
from cleanrl_ppo import CleanRLPPO  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
TRL_MISSING = "TRL not installed: run tools/peers/setup_trl.sh"
HPCPPO_PHASES = ("weight_sync", "generate", "reward", "old_logprob", "ref", "values", "adv", "critic_update",
                 "actor_update")


def write_spec(root: Path, paths: dict[str, Path], steps: int) -> Path:
    q = json.dumps
    spec = f"""
name = "bench-peers"
seed = 1
[model]
path = {q(str(paths["model"]))}
tokenizer_path = {q(str(paths["tokenizer"]))}
dtype = "float32"
[data]
train_files = [{q(str(paths["train"]))}]
max_prompt_length = {W.PROMPT_LEN}
max_response_length = {W.RESPONSE_LEN}
reward_fn = {q(str(Path(W.__file__).resolve()) + ":score_text")}
[rollout]
engine = "hf"
n = 1
temperature = 1.0
micro_batch_size_per_gpu = {W.PROMPTS}
[actor]
lr = {W.LR}
ppo_epochs = {W.EPOCHS}
clip_ratio = {W.CLIP}
ppo_mini_batch_size = {W.PROMPTS // W.MINI_BATCHES}
ppo_micro_batch_size_per_gpu = {W.PROMPTS // W.MINI_BATCHES}
[critic]
lr = {W.LR}
cliprange_value = {W.VALUE_CLIP}
ppo_micro_batch_size_per_gpu = {W.PROMPTS // W.MINI_BATCHES}
[algorithm]
adv_estimator = "gae"
gamma = {W.GAMMA}
lam = {W.LAM}
use_kl_in_reward = true
kl_penalty = "kl"
kl_ctrl = {{ type = "fixed", kl_coef = {W.KL_COEF} }}
[trainer]
train_batch_size = {W.PROMPTS}
total_steps = {steps}
test_freq = 0
log_every = 1000
collective_timeout_s = 120
[checkpoint]
save_every = 0
[resources]
procs_per_node = 1
time = "00:30:00"
"""
    path = root / "bench-peers.toml"
    path.write_text(spec)
    return path


class TRLPeer:
    """The TRL worker in .venv-trl, one iteration per ``step()``."""

    def __init__(self, work: Path, threads: int, iters: int):
        self.proc = subprocess.Popen([str(TRL_PYTHON), str(ROOT / "tools" / "peers" / "trl_worker.py"), str(work),
                                      str(threads), str(iters)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.info = self._read()
        self.rounds: list[dict[str, float]] = []

    def _read(self) -> dict[str, Any]:
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                return json.loads(line[6:])
        raise RuntimeError(f"the TRL worker ended (exit {self.proc.wait()}) before reporting")

    def step(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.rounds.append(self._read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def make_trainer_class(peers: list[Any], profiler: cProfile.Profile | None, warmup: int):
    from hpcppo.train.trainer import Trainer

    class BenchTrainer(Trainer):
        iter_times: list[float] = []
        rows: list[dict[str, float]] = []

        def train(self) -> int:
            self._mark = time.perf_counter()
            return super().train()

        def log_metrics(self, step: int, metrics: dict[str, float], note: str = "") -> None:
            super().log_metrics(step, metrics, note)
            if note:
                return
            self.iter_times.append(time.perf_counter() - self._mark)
            self.rows.append(dict(metrics))
            if profiler is not None:
                profiler.disable()
            for peer in peers:  # B then C: the round goes on outside the trainer's window
                peer()
            if profiler is not None and step >= warmup:
                profiler.enable()
            self._mark = time.perf_counter()

    return BenchTrainer


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}


def fmt(s: dict[str, float], scale: float = 1.0) -> str:
    if not s:
        return f"{'-':>22}"
    return f"{s['median'] * scale:8.3f} [{s['min'] * scale:.3f}-{s['max'] * scale:.3f}]".rjust(22)


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from hpcppo.compiler import compile_config
    from hpcppo.distributed import env as dist_env
    from hpcppo.rundir import RunPaths
    from hpcppo.train.build import build_components

    paths = W.build(root)
    rounds = args.warmup + args.steps
    trl = None
    if args.no_trl:
        print("TRL peer left out (--no-trl)")
    elif not TRL_PYTHON.exists():
        print(TRL_MISSING)
    else:
        trl = TRLPeer(root, args.threads, rounds)
    clean = CleanRLPPO(paths)
    compiled = compile_config(write_spec(root, paths, rounds), "local", check_paths=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    env = dist_env.detect_env(device_type="cpu")
    dist_env.init_distributed(env, timeout_s=120)
    try:
        run_dir = root / "run"
        RunPaths(run_dir).control.mkdir(parents=True, exist_ok=True)
        comps = build_components(compiled, env, run_dir)
        torch.set_num_threads(args.threads)
        peers = ([trl.step] if trl else []) + [clean.iteration]
        profiler = cProfile.Profile() if args.profile else None
        trainer = make_trainer_class(peers, profiler, args.warmup)(comps)
        try:
            code = trainer.train()
        finally:
            trainer.close()
            if trl:
                trl.close()
        if code != 0:
            raise SystemExit(f"the trainer returned exit code {code}")
        params = {"hpcppo": {"actor": sum(p.numel() for p in comps.actor.model.parameters()),
                             "critic": sum(p.numel() for p in comps.critic.model.parameters())},
                  "cleanrl": {"actor": sum(p.numel() for p in clean.actor.parameters()),
                              "critic": sum(p.numel() for p in clean.critic.parameters())}}
    finally:
        dist_env.destroy_distributed()
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
        print("== cProfile of hpcppo's measured steps (the peers' iterations excluded)\n" + out.getvalue())
    w = args.warmup
    iters = {"hpcppo": trainer.iter_times[w:], "cleanrl": clean.iter_times[w:]}
    phases = {"hpcppo": {ph: spread([r[f"time/{ph}_s"] for r in trainer.rows[w:] if f"time/{ph}_s" in r])
                         for ph in HPCPPO_PHASES},
              "cleanrl": {ph: spread(v[w:]) for ph, v in clean.phases.items()}}
    ratios = {"hpcppo/cleanrl": spread([a / b for a, b in zip(iters["hpcppo"], iters["cleanrl"])])}
    if trl:
        params["trl"] = trl.info["params"]
        iters["trl"] = [r["iteration"] for r in trl.rounds[w:]]
        phases["trl"] = {k: spread([r.get(k, 0.0) for r in trl.rounds[w:]]) for k in trl.rounds[-1] if k != "iteration"}
        ratios["trl/hpcppo"] = spread([b / a for a, b in zip(iters["hpcppo"], iters["trl"])])
        ratios["trl/cleanrl"] = spread([b / c for b, c in zip(iters["trl"], iters["cleanrl"])])
    tokens = W.PROMPTS * (W.PROMPT_LEN + W.RESPONSE_LEN)
    n_a, n_c = params["cleanrl"]["actor"], params["cleanrl"]["critic"]
    flops = {"cleanrl/hpcppo": tokens * (2 * n_a + 2 * n_a + 2 * n_c + 6 * n_a + 6 * n_c)}
    if trl:
        p = params["trl"]
        forwards = 2 * (p["critic"] + p["reward_model"] + p["actor"])  # ref (= actor's size), values, reward model
        flops["trl"] = tokens * (forwards + 6 * (p["actor"] + p["critic"]))
    return {"threads": args.threads, "rounds": {"warmup": w, "measured": args.steps}, "params": params,
            "iterations_s": iters, "iteration_s": {k: spread(v) for k, v in iters.items()}, "phases_s": phases,
            "ratios": ratios, "flops_after_generate": flops, "trl": trl is not None,
            "hpcppo_response_tokens": spread([r["response_length/mean"] for r in trainer.rows[w:]
                                              if "response_length/mean" in r])}


def report(r: dict[str, Any]) -> None:
    sides = [s for s in ("hpcppo", "trl", "cleanrl") if s in r["iteration_s"]]
    print(f"== bench_peers: Qwen2 h128 L2 4 heads/2 KV, inter 256, vocab 64, untied, fp32; {W.PROMPTS} prompts x "
          f"{W.PROMPT_LEN} tokens, {W.RESPONSE_LEN} new tokens; {W.EPOCHS} epoch x {W.MINI_BATCHES} mini-batches; "
          f"torch {torch.__version__}, {r['threads']} threads; {r['rounds']['warmup']} warm-up + "
          f"{r['rounds']['measured']} measured rounds, interleaved")
    print(f"params: {json.dumps(r['params'])}")
    print(f"\n{'seconds, median [min-max]':<28}" + "".join(f"{s:>22}" for s in sides))
    names = list(dict.fromkeys(n for s in sides for n in r["phases_s"][s]))
    for name in names:
        print(f"  {name:<26}" + "".join(fmt(r["phases_s"][s].get(name, {})) for s in sides))
    print(f"  {'iteration':<26}" + "".join(fmt(r["iteration_s"][s]) for s in sides))
    print("\nratios of iterations measured in the same round, median [min-max]:")
    for k, v in r["ratios"].items():
        print(f"  {k:<16}{fmt(v)}")
    f = r["flops_after_generate"]
    print("\nFLOPs per iteration besides generate (2N per token per forward, 6N per update; T = "
          f"{W.PROMPTS} x {W.PROMPT_LEN + W.RESPONSE_LEN}): hpcppo = cleanrl {f['cleanrl/hpcppo'] / 1e9:.3f} GFLOP "
          "(old-log-prob, ref, value forwards; critic and actor updates)"
          + (f"; TRL {f['trl'] / 1e9:.3f} GFLOP (no old-log-prob forward, a reward-model forward)" if "trl" in f
             else ""))
    if not r["trl"]:
        print(TRL_MISSING if not TRL_PYTHON.exists() else "TRL peer left out")
    tok = r["hpcppo_response_tokens"]
    if tok:
        print(f"hpcppo's mean response length (EOS ends a row; the others generate all {W.RESPONSE_LEN}): "
              f"{tok['median']:.2f} [{tok['min']:.2f}-{tok['max']:.2f}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="measured rounds (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds left out of the statistics")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for all three")
    ap.add_argument("--quick", action="store_true", help="1 warm-up + 2 rounds on 1 thread (smoke test)")
    ap.add_argument("--no-trl", action="store_true", help="leave the TRL peer out even when .venv-trl exists")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile hpcppo's measured steps (slows its Python; read the ratios from a run without it)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.threads = 2, 1, 1
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
            results = run(args, Path(tmp))
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"total benchmark wall time: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
