"""The tool loop through the real vLLM engine (CPU backend) against the HF engine: the same scripted model
(tests/unit/tool_loop_fixture.py), the real tool worker with the calculator, greedy decoding whose choices are
clear but whose log-probs are not trivial. The two engines give the same token ids, the same masks, and log-probs
within 1e-4; the call's closing token stops vLLM's turn (stop_token_ids) and stays in its output, as in HF's."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
from _engines import KV_CACHE_BYTES
from _spawn import run_distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from tool_loop_fixture import compact_tokenizer, scripted_model_dir  # noqa: E402

CHAIN = ["<|assistant|>", "<call>", "m", "u", "l", "("]
# after "(": 7 (logit 6*8) or 3 (5.7*8); greedy takes 7 at log-prob log(1/(1+e^-2.4)) ~ -0.087
TABLE = {a: [b] for a, b in zip(CHAIN, CHAIN[1:])} | {"(": {"7": 6.0, "3": 5.7}, "7": ["*"], "*": {"6": 6.0, "9": 5.8},
                                                       "6": [")"], ")": ["</call>"]}
SCHEMA = {"type": "function", "function": {"name": "mul", "description": "arithmetic", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def _both_engines(rank: int, world: int, model_dir: str) -> dict:
    """On a spawned rank (vLLM's external launcher needs one): the tool loop over each engine."""
    from hpcppo.agent.tool import ToolSpec
    from hpcppo.agent.worker import ToolWorker
    from hpcppo.rollout.base import RequestEngine, SamplingParams
    from hpcppo.rollout.hf import HFRolloutEngine
    from hpcppo.rollout.tool_loop import ToolLoop, ToolLoopSettings
    from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

    tok = compact_tokenizer()
    settings = ToolLoopSettings(max_response_length=64, format="compact", max_assistant_turns=3)
    prompt = tok.encode("<bos><|user|>7*6<|assistant|>", add_special_tokens=False)
    sampling = SamplingParams(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, n=2, temperature=0.0,
                              seed=1)
    engines = {"hf": HFRolloutEngine.from_pretrained(model_dir, dtype="float32", device=torch.device("cpu")),
               "vllm": VLLMRolloutEngine(model_dir, dtype="float32", enforce_eager=True, enable_sleep_mode=False,
                                         load_format="auto", max_model_len=128, seed=0,
                                         kv_cache_memory_bytes=KV_CACHE_BYTES)}
    out = {}
    with ToolWorker([ToolSpec("hpcppo.agent.builtin.Calculator", {}, SCHEMA)]) as worker:
        for name, engine in engines.items():
            loop = ToolLoop(engine, worker, tok, {"mul": SCHEMA}, settings)
            batch = loop.run([prompt, prompt[:-2] + prompt[-1:]], sampling)
            stats = loop.take_stats()
            out[name] = {"ids": batch.response_ids, "loss": batch.response_mask,
                         "attend": batch.response_attention_mask, "lp": batch.rollout_log_probs,
                         "calls": stats.tool_calls, "turns": stats.turns,
                         "text": tok.decode(batch.response_ids[0], skip_special_tokens=False),
                         "requests": isinstance(engine, RequestEngine)}
        # sampled, each continuation its own seeded request: the same seed gives the same trajectories
        loop = ToolLoop(engines["vllm"], worker, tok, {"mul": SCHEMA}, settings)
        hot = dataclasses.replace(sampling, temperature=1.0, seed=3)
        runs = [loop.run([prompt] * 3, hot).response_ids for _ in range(2)]
        out["sampled_alike"] = torch.equal(runs[0], runs[1])
        out["sampled_varied"] = len({tuple(r.tolist()) for r in runs[0]}) > 1
    engines["vllm"].close()
    return out


def test_vllm_and_hf_give_the_same_multi_turn_trajectories(tmp_path):
    model_dir = scripted_model_dir(tmp_path / "model", compact_tokenizer(), TABLE)
    [out] = run_distributed(_both_engines, 1, str(model_dir))
    hf, vl = out["hf"], out["vllm"]
    assert vl["requests"] and not hf["requests"]  # vLLM: each continuation its own request; HF: turn by turn
    assert out["sampled_alike"] and out["sampled_varied"]
    assert hf["calls"] == vl["calls"] == 8 and hf["turns"] == vl["turns"] == 12
    for key in ("ids", "loss", "attend"):
        assert torch.equal(hf[key], vl[key]), key
    assert torch.allclose(hf["lp"], vl["lp"], atol=1e-4)
    assert hf["text"].startswith("<call>mul(7*6)</call><eos><|tool|>42<|assistant|><call>mul(7*6)</call>")
    assert -0.2 < float(hf["lp"][0, 5]) < -0.05  # the "7": a real choice, not a certainty
