"""The reward model sharded like the reference (issue 23), on 2 real gloo ranks: built on the meta device, each rank
loading its shards (hpcppo.train.build.load_sharded), FSDP2 over both ranks, its scores equal an unsharded forward of
each row alone, with fixed micro-batches and with token-budget micro-batches whose count the ranks agree on (the
ranks' rows differ in length), offloaded or not; and the reward phase's scorer (re-templating, padding, metrics over
both ranks) on the tiny reward model."""

from __future__ import annotations

import pytest
import torch
from _spawn import run_distributed


def _save(directory: str) -> None:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(3)
    # Odd sizes: uneven dim-0 shards on 2 ranks.
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=97, vocab_size=67, max_position_embeddings=64, num_labels=1, pad_token_id=0)
    model = Qwen2ForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.normal_()
    model.save_pretrained(directory)


def _rows(rank: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(10 + rank)
    lengths = (3, 17, 9, 30, 5) if rank == 0 else (12, 12, 2, 6, 25)
    return [torch.randint(1, 67, (n,), generator=gen).tolist() for n in lengths]


def _sharded_scores(rank: int, world_size: int, directory: str, offload: bool) -> dict:
    import functools

    from hpcppo.config.experiment import FsdpSection
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models.reward_model import STRIP, build_reward_model, compute_rm_scores
    from hpcppo.train.build import _sharded, load_sharded
    from hpcppo.train.reward_phase import _agreed_groups, right_pad

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    model = load_sharded(functools.partial(build_reward_model, directory), directory, torch.device("cpu"),
                         lambda m: _sharded(m, mesh, FsdpSection(), "float32", frozen=True, offload=offload),
                         offload=offload, strip=STRIP)
    rows = _rows(rank)
    ids, mask = right_pad(rows, 0, torch.device("cpu"))
    groups = _agreed_groups([len(r) for r in rows], 34)
    return {"fixed": compute_rm_scores(model, ids, mask, micro_batch_size=2),
            "budget": compute_rm_scores(model, ids, mask, groups), "groups": len(groups),
            "sharded": type(model).__name__ != "RewardModel" or any(
                type(p).__name__ == "DTensor" for p in model.parameters())}


@pytest.mark.parametrize("offload", [False, True])
def test_sharded_reward_model_scores_equal_an_unsharded_forward(tmp_path, offload):
    from hpcppo.models.reward_model import build_reward_model

    _save(str(tmp_path))
    results = run_distributed(_sharded_scores, 2, str(tmp_path), offload)
    whole = build_reward_model(tmp_path)
    for rank, result in enumerate(results):
        alone = torch.stack([whole(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long),
                                   torch.arange(len(r))[None])[0, -1] for r in _rows(rank)])
        assert result["sharded"]
        torch.testing.assert_close(result["fixed"], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["budget"], alone, rtol=1e-5, atol=1e-5)
    # rank 0's rows need more micro-batches under the budget than rank 1's: both ran rank 0's count
    assert results[0]["groups"] == results[1]["groups"] >= 3


def _scorer(rank: int, world_size: int, rm_dir: str) -> dict:
    import functools
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from hpcppo.config.experiment import FsdpSection
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models.reward_model import STRIP, build_reward_model
    from hpcppo.tiny import build_tokenizer
    from hpcppo.train.build import _sharded, load_sharded
    from hpcppo.train.reward_phase import RewardModelScorer, right_pad

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    model = load_sharded(functools.partial(build_reward_model, rm_dir), rm_dir, torch.device("cpu"),
                         lambda m: _sharded(m, mesh, FsdpSection(), "float32", frozen=True), strip=STRIP)
    actor = build_tokenizer()
    scorer = RewardModelScorer(model=model, tokenizer=AutoTokenizer.from_pretrained(rm_dir), max_length=64,
                               micro_batch_size=2, max_tokens=40)
    answers = ["17", "172", "3"] if rank == 0 else ["9", "44", "1000"]
    records = [SimpleNamespace(prompt=[{"role": "user", "content": f"{rank}+{i}="}]) for i in range(3)]
    ids = [actor(a, add_special_tokens=False)["input_ids"] + [actor.eos_token_id] for a in answers]
    responses, mask = right_pad(ids, actor.pad_token_id, torch.device("cpu"))
    mask[2, len(ids[2]) - 2:] = 0  # a response cut short: its last digit and EOS are outside the mask
    scores, metrics = scorer.score(actor, records, responses, mask)
    return {"scores": scores, "metrics": metrics, "answers": answers}


def test_the_scorer_re_templates_and_reports_the_whole_batch(random_tiny_rm):
    from hpcppo.models.reward_model import build_reward_model
    from hpcppo.tiny import build_tokenizer

    results = run_distributed(_scorer, 2, str(random_tiny_rm))
    whole, tok = build_reward_model(random_tiny_rm), build_tokenizer()
    every = []
    for rank, result in enumerate(results):
        for i, answer in enumerate(result["answers"]):
            text = answer if i < 2 else answer[:-1]  # the third lost its last digit to the mask
            ids = tok.apply_chat_template([{"role": "user", "content": f"{rank}+{i}="},
                                           {"role": "assistant", "content": text}], tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in transformers 5
            expect = whole(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                           torch.arange(len(ids))[None])[0, -1]
            torch.testing.assert_close(result["scores"][i], expect, rtol=1e-5, atol=1e-5)
            every.append(float(expect))
    for result in results:  # the same numbers on both ranks: the whole batch's
        m = result["metrics"]
        assert m["reward_model/score_mean"] == pytest.approx(sum(every) / 6, abs=1e-5)
        assert m["reward_model/score_max"] == pytest.approx(max(every), abs=1e-5)
        assert m["reward_model/score_min"] == pytest.approx(min(every), abs=1e-5)
        assert m["reward_model/truncated_frac"] == 0.0
