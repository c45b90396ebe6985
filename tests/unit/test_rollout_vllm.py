"""The parts of the vLLM engine that run without vLLM: the install hint and the output conversion."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch

from hpcppo.rollout import EngineSettings, build_engine
from hpcppo.rollout.vllm_engine import VLLMRolloutEngine, _to_rollout_batch


def test_missing_vllm_raises_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    expected = ("rollout.engine = \"vllm\" needs vLLM in the job's Python: pip install 'hpcppo[vllm]' on GPU nodes, "
                "tools/setup.sh --vllm for vLLM's CPU backend (.venv-vllm)")
    with pytest.raises(ImportError) as info:
        VLLMRolloutEngine("/nonexistent/model")
    assert str(info.value).startswith(expected)
    with pytest.raises(ImportError, match="pip install 'hpcppo\\[vllm\\]'"):
        build_engine("vllm", EngineSettings(model_path="/nonexistent/model"))


# Stand-ins with the attributes of vllm.outputs.RequestOutput / CompletionOutput and vllm.sequence.Logprob.
@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Completion:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str = "stop"


@dataclass
class Request:
    prompt_token_ids: list[int]
    outputs: list[Completion]


def completion(index: int, tokens: list[int], lps: list[float]) -> Completion:
    # logprobs=0: each position's mapping holds the sampled token (vLLM may add a top-1 entry next to it)
    entries = [{t: Logprob(lp, rank=1), 999: Logprob(-50.0)} for t, lp in zip(tokens, lps)]
    return Completion(index=index, token_ids=tokens, logprobs=entries)


def test_to_rollout_batch_from_vllm_like_outputs():
    eos, pad = 2, 0
    outputs = [
        # completions may come back in any order; `index` decides
        Request([7, 8, 9], [completion(1, [4, 2], [-0.5, -0.25]), completion(0, [5, 6, 7], [-1.0, -2.0, -3.0])]),
        Request([11], [completion(0, [2], [-0.1]), completion(1, [3, 3, 3, 3], [-0.2, -0.3, -0.4, -0.5])]),
    ]
    b = _to_rollout_batch(outputs, n=2, eos_token_ids=[eos], pad_token_id=pad)
    assert b.prompt_index.tolist() == [0, 0, 1, 1]
    assert b.prompt_ids.tolist() == [[7, 8, 9], [7, 8, 9], [0, 0, 11], [0, 0, 11]]
    assert b.response_ids.tolist() == [[5, 6, 7, 0], [4, 2, 0, 0], [2, 0, 0, 0], [3, 3, 3, 3]]
    assert b.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert torch.allclose(b.rollout_log_probs[0], torch.tensor([-1.0, -2.0, -3.0, 0.0]))
    assert torch.allclose(b.rollout_log_probs[1], torch.tensor([-0.5, -0.25, 0.0, 0.0]))
    assert b.position_ids[2].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert torch.equal(b.input_ids, torch.cat([b.prompt_ids, b.response_ids], 1))


def test_to_rollout_batch_rejects_incomplete_outputs():
    one = [Request([1], [completion(0, [3], [-0.1])])]
    with pytest.raises(ValueError, match="expected n=2 completions, vLLM returned 1"):
        _to_rollout_batch(one, n=2, eos_token_ids=[2], pad_token_id=0)
    no_lp = [Request([1], [Completion(0, [3], None)])]
    with pytest.raises(ValueError, match="logprobs=0"):
        _to_rollout_batch(no_lp, n=1, eos_token_ids=[2], pad_token_id=0)
    short = [Request([1], [Completion(0, [3, 4], [{3: Logprob(-0.1)}])])]
    with pytest.raises(ValueError, match="2 tokens but 1 log-prob entries"):
        _to_rollout_batch(short, n=1, eos_token_ids=[2], pad_token_id=0)


def test_each_prompt_gets_its_own_block_of_seeds():
    from hpcppo.rollout.vllm_engine import prompt_seed

    seeds = [prompt_seed(1000, i, 4) for i in range(3)]
    assert seeds == [1000, 1004, 1008]  # vLLM seeds a request's n samples seed, seed+1, ...: no overlap
    assert prompt_seed(None, 5, 4) is None
    assert 0 <= prompt_seed(2**63 - 2, 3, 4) < 2**63 - 1
