"""Issue 20, item 3: the vLLM engine (vLLM's CPU backend) against the HF engine, same model, same prompts, in one
process, interleaved round by round.

    .venv-vllm/bin/python tools/bench_vllm.py                 # the ~86M bench model, then the local default's model
    .venv-vllm/bin/python tools/bench_vllm.py --rounds 2 --layers 4

Figures, each engine measured right next to the other:
  start-up     building the engine: ``HFRolloutEngine.from_pretrained`` (reads the checkpoint) against
               ``VLLMRolloutEngine`` (dummy weights, as the trainer builds it) plus its first weight sync;
  weight sync  the trainer's call, ``engine.sync_weights(iter_full_params(actor, dtype=engine.sync_dtype,
               into=engine.sync_targets))``, from a plain float32 model holding the same weights;
  generation   ``engine.generate`` of ``--prompts`` random prompts of ``--prompt-len`` tokens, temperature 1.0, at
               most ``--new`` new tokens each; tokens/s counts the tokens actually generated (an EOS can end a row).
Two workloads: ``bench_scale``'s Qwen2 (h768, 10 layers, vocab 16000: ~86M parameters) at 64 prompts x 128 new
tokens, and the local default's (``examples/arith-tiny.toml``: the ~0.5M tiny Llama, 64 samples of at most 8 new
tokens per rank). Float32 on both engines (what the CPU sites train in). Like the trainer, the process joins a
1-rank gloo group first (vLLM's external launcher runs inside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

import torch  # noqa: E402


def _bench_model(args: argparse.Namespace, out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 8 // 3,
                      vocab_size=args.vocab, tie_word_embeddings=False, max_position_embeddings=1024,
                      eos_token_id=args.vocab - 1, bos_token_id=args.vocab - 2)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def _tiny_model(out: Path) -> Path:
    from hpcppo.tiny import TinySettings, build_model, build_tokenizer

    tok = build_tokenizer()
    build_model(tok, TinySettings(seed=3)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _join_one_rank_group() -> None:
    import torch.distributed as dist

    from hpcppo.distributed.env import detect_env, init_distributed

    from _bench_train_workload import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    if not dist.is_initialized():
        init_distributed(detect_env(os.environ, device_type="cpu"), timeout_s=600)


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def workload(name: str, model_dir: Path, *, prompts: int, prompt_len: int, new: int, vocab: int, eos: int,
             rounds: int, max_len: int) -> dict:
    from transformers import AutoModelForCausalLM

    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.rollout import SamplingParams
    from hpcppo.rollout.hf import HFRolloutEngine
    from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, vocab - 2, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    sampling = SamplingParams(eos_token_id=(eos,), pad_token_id=0, n=1, temperature=1.0, max_new_tokens=new)

    def sync(engine) -> int:
        return engine.sync_weights(iter_full_params(source, dtype=engine.sync_dtype, into=engine.sync_targets))

    startup: dict[str, float] = {}
    startup["hf"], hf = _timed(lambda: HFRolloutEngine.from_pretrained(model_path=model_dir, dtype="float32",
                                                                       device=torch.device("cpu")))
    build_s, vllm = _timed(lambda: VLLMRolloutEngine(
        model_dir, dtype="float32", enforce_eager=True, enable_sleep_mode=False, load_format="dummy",
        max_model_len=max_len, seed=0, kv_cache_memory_bytes=512 * 2**20, skip_tokenizer_init=True))
    first_sync_s, nbytes = _timed(lambda: sync(vllm))
    startup["vllm"] = build_s + first_sync_s
    sync(hf)
    rows: dict[str, dict[str, list[float]]] = {k: {"sync_s": [], "gen_s": [], "tokens": []} for k in ("hf", "vllm")}
    for r in range(rounds):
        order = (("hf", hf), ("vllm", vllm)) if r % 2 == 0 else (("vllm", vllm), ("hf", hf))
        for key, engine in order:
            seconds, _ = _timed(lambda: sync(engine))
            rows[key]["sync_s"].append(seconds)
            seconds, batch = _timed(lambda: engine.generate(ids, dataclasses.replace(sampling, seed=100 + r)))
            rows[key]["gen_s"].append(seconds)
            rows[key]["tokens"].append(float(batch.response_lengths.sum()))
    vllm.close()
    out = {"workload": name, "bytes": nbytes, "startup_s": startup, "rounds": rounds}
    for key in ("hf", "vllm"):
        gen = rows[key]
        tps = [t / s for t, s in zip(gen["tokens"], gen["gen_s"])]
        out[key] = {"tokens_per_s": statistics.median(tps), "tokens_per_s_range": [min(tps), max(tps)],
                    "sync_s": statistics.median(gen["sync_s"]), "tokens_per_round": statistics.median(gen["tokens"])}
    out["vllm_over_hf_tokens_per_s"] = out["vllm"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
    return out


def show(r: dict) -> None:
    print(f"\n{r['workload']}: {r['bytes'] / 2**20:.1f} MiB of weights, {r['rounds']} interleaved rounds (medians)")
    print(f"  {'':<8}{'start-up s':>12}{'sync s':>10}{'gen tok/s':>12}  {'range':>17}  tokens/round")
    for key in ("hf", "vllm"):
        e = r[key]
        lo, hi = e["tokens_per_s_range"]
        print(f"  {key:<8}{r['startup_s'][key]:>12.2f}{e['sync_s']:>10.3f}{e['tokens_per_s']:>12.0f}  "
              f"[{lo:>7.0f}-{hi:>7.0f}]  {e['tokens_per_round']:.0f}")
    print(f"  vLLM / HF generation tokens/s: {r['vllm_over_hf_tokens_per_s']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--skip-large", action="store_true", help="only the local default's workload")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    torch.set_num_threads(os.cpu_count() or 1)
    _join_one_rank_group()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        if not args.skip_large:
            model = _bench_model(args, Path(tmp) / "bench")
            results.append(workload(f"bench model (h{args.hidden}, {args.layers} layers, vocab {args.vocab}), "
                                    f"{args.prompts} prompts x {args.new} new tokens", model,
                                    prompts=args.prompts, prompt_len=args.prompt_len, new=args.new, vocab=args.vocab,
                                    eos=args.vocab - 1, rounds=args.rounds, max_len=args.prompt_len + args.new))
            show(results[-1])
        tiny = _tiny_model(Path(tmp) / "tiny")
        results.append(workload("local default (tiny Llama, arith-tiny: 64 samples x <= 8 new tokens per rank)", tiny,
                                prompts=64, prompt_len=12, new=8, vocab=64, eos=3, rounds=max(args.rounds, 5),
                                max_len=64))
        show(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
