"""The rollout protocol's pure parts: sampling parameters, batch assembly, prompt forms, the engine factory."""

from __future__ import annotations

import pytest
import torch

from hpcppo.rollout import EngineSettings, SamplingParams, build_engine, derive_seed
from hpcppo.models import position_ids_from_mask
from hpcppo.rollout.base import batch_from_lists, prompt_lists


def test_sampling_params_normalise_and_validate():
    sp = SamplingParams(eos_token_id=3, pad_token_id=0)
    assert sp.eos_ids == (3,) and not sp.greedy and sp.logprob_temperature == 1.0
    greedy = SamplingParams(eos_token_id=[3, 4], pad_token_id=0, temperature=0.0)
    assert greedy.eos_ids == (3, 4) and greedy.greedy and greedy.logprob_temperature == 1.0
    assert SamplingParams(eos_token_id=3, pad_token_id=0, temperature=0.7).logprob_temperature == 0.7
    for bad, message in [
        (dict(n=0), "n must be >= 1"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(eos_token_id=()), "at least one end-of-sequence"),
    ]:
        kwargs = dict(eos_token_id=3, pad_token_id=0) | bad
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kwargs)
    with pytest.raises(TypeError):
        SamplingParams(3, 0)  # keyword-only: positional ids are too easy to swap


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    seeds = {derive_seed(0, step, rank) for step in range(50) for rank in range(8)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)


def test_batch_from_lists_layout():
    eos, pad = 9, 0
    prompts = [[5, 6, 7], [8]]
    responses = [[1, 9, 2, 2], [3, 4], [9], [1, 1, 1]]  # the first runs on past its EOS: cut after it
    lps = [[-0.1, -0.2, -0.3, -0.4], [-1.0, -1.1], [-2.0], [-0.5, -0.6, -0.7]]
    b = batch_from_lists(prompts, responses, lps, n=2, eos_token_ids=[eos], pad_token_id=pad)
    assert b.prompt_index.tolist() == [0, 0, 1, 1]
    assert b.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert b.response_ids.tolist() == [[1, 9, 0], [3, 4, 0], [9, 0, 0], [1, 1, 1]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert b.response_lengths.tolist() == [2, 2, 1, 3]
    assert torch.equal(b.input_ids, torch.cat([b.prompt_ids, b.response_ids], 1))
    assert b.position_ids[2].tolist() == [0, 0, 0, 1, 1, 1]  # left padding, then the response continues
    assert b.position_ids[0].tolist() == [0, 1, 2, 3, 4, 4]
    assert torch.allclose(b.rollout_log_probs[0], torch.tensor([-0.1, -0.2, 0.0]))
    assert b.rollout_log_probs.dtype == torch.float32
    padded = b.pad_responses_to(5, pad)
    assert padded.response_width == 5 and padded.input_ids.shape == (4, 8)
    assert torch.equal(padded.response_mask[:, :3], b.response_mask) and padded.response_mask[:, 3:].sum() == 0
    with pytest.raises(ValueError, match="down to"):
        b.pad_responses_to(2, pad)


def test_batch_from_lists_rejects_mismatches():
    with pytest.raises(ValueError, match="need 4 responses"):
        batch_from_lists([[1], [2]], [[1]], [[0.0]], n=2, eos_token_ids=[9], pad_token_id=0)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        batch_from_lists([[1]], [[1, 2]], [[0.0]], n=1, eos_token_ids=[9], pad_token_id=0)


def test_prompt_lists_accepts_lists_and_left_padded_tensors():
    assert prompt_lists([[1, 2], (3,)]) == [[1, 2], [3]]
    ids = torch.tensor([[0, 0, 4, 5], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_lists({"input_ids": ids, "attention_mask": mask}) == [[4, 5], [1, 2, 3, 4]]
    with pytest.raises(ValueError, match="left padded"):
        prompt_lists({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])})
    with pytest.raises(ValueError, match="missing"):
        prompt_lists({"input_ids": ids})
    with pytest.raises(ValueError, match="at least one prompt"):
        prompt_lists([])
    with pytest.raises(ValueError, match=r"prompts \[1\] are empty"):
        prompt_lists([[1], []])


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def test_build_engine_unknown_kind_lists_known():
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; known engines: hf, vllm"):
        build_engine("sglang", EngineSettings(model_path="m"))


def test_the_factory_builds_every_kind_of_the_registry():
    from hpcppo import engines
    from hpcppo.rollout.factory import BUILDERS

    assert tuple(BUILDERS) == engines.names() == ("hf", "vllm")
