"""The Hugging Face rollout engine on a tiny random Qwen2 model: decoding, seeding, EOS handling, weight sync."""

from __future__ import annotations

import pytest
import torch

from hpcppo.rollout import EngineSettings, SamplingParams, build_engine
from hpcppo.rollout.hf import HFRolloutEngine, filter_top_k_top_p

VOCAB = 64
PAD = 0
# Several end tokens, so that a random model stops after a few sampled tokens (each step ~1/8 chance).
EOS = tuple(range(56, 64))


def tiny_model(seed: int = 0, tie: bool = False) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128,
                         tie_word_embeddings=tie)
    return Qwen2ForCausalLM(config).eval()


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15]]


def sampling(**kw) -> SamplingParams:
    return SamplingParams(eos_token_id=kw.pop("eos_token_id", EOS), pad_token_id=PAD, **kw)


@pytest.fixture(scope="module")
def engine() -> HFRolloutEngine:
    return HFRolloutEngine(tiny_model())


def test_greedy_matches_transformers_generate_and_is_deterministic(engine):
    sp = sampling(temperature=0.0, max_new_tokens=6, eos_token_id=63)
    batch = engine.generate(PROMPTS, sp)
    again = engine.generate(PROMPTS, sp)
    assert torch.equal(batch.response_ids, again.response_ids)
    assert torch.equal(batch.rollout_log_probs, again.rollout_log_probs)

    ids, mask = batch.prompt_ids, batch.prompt_mask
    with torch.no_grad():
        ref = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                                    eos_token_id=63, pad_token_id=PAD)
    expected = ref[:, ids.shape[1]:]
    got = batch.response_ids[:, :expected.shape[1]]
    # Compare the tokens each row actually generated (HF pads after EOS with pad_token_id too).
    assert torch.equal(got * batch.response_mask[:, :expected.shape[1]],
                       expected * batch.response_mask[:, :expected.shape[1]])


def test_sampling_is_reproducible_with_a_seed_and_ignores_global_rng(engine):
    sp = sampling(temperature=1.0, n=3, max_new_tokens=8, seed=1234)
    torch.manual_seed(1)
    a = engine.generate(PROMPTS, sp)
    torch.manual_seed(2)
    b = engine.generate(PROMPTS, sp)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    c = engine.generate(PROMPTS, sampling(temperature=1.0, n=3, max_new_tokens=8, seed=1235))
    assert not torch.equal(a.response_ids[:, :4], c.response_ids[:, :4])
    # seed=None follows torch's global RNG
    torch.manual_seed(7)
    d = engine.generate(PROMPTS, sampling(n=3, max_new_tokens=8))
    torch.manual_seed(7)
    e = engine.generate(PROMPTS, sampling(n=3, max_new_tokens=8))
    assert torch.equal(d.response_ids, e.response_ids)


def test_rows_are_prompt_major_and_masks_end_at_eos(engine):
    n = 4
    batch = engine.generate(PROMPTS, sampling(n=n, max_new_tokens=12, seed=0))
    B, P = len(PROMPTS) * n, max(len(p) for p in PROMPTS)
    assert batch.prompt_ids.shape == (B, P) and batch.response_ids.shape[0] == B
    assert batch.prompt_index.tolist() == [i for i in range(len(PROMPTS)) for _ in range(n)]
    for row in range(B):
        prompt = PROMPTS[row // n]
        assert batch.prompt_ids[row, P - len(prompt):].tolist() == prompt
        assert batch.prompt_mask[row].sum() == len(prompt)
        length = int(batch.response_lengths[row])
        mask = batch.response_mask[row].tolist()
        assert mask == [1] * length + [0] * (batch.response_width - length)  # contiguous from the start
        tokens = batch.response_ids[row].tolist()
        ends = [j for j in range(length) if tokens[j] in EOS]
        if length < 12:
            assert ends == [length - 1]  # stopped exactly at its first EOS, which the mask includes
        else:
            assert ends in ([], [11])  # ran to max_new_tokens (possibly ending on EOS)
        assert all(t == PAD for t in tokens[length:])
        assert (batch.rollout_log_probs[row, length:] == 0).all()
        assert (batch.rollout_log_probs[row, :length] < 0).all()
    assert (batch.response_lengths < 12).any(), "with 8 end tokens some row should stop early"
    assert batch.response_width == int(batch.response_lengths.max())  # width = the batch's longest response
    assert torch.equal(batch.attention_mask, torch.cat([batch.prompt_mask, batch.response_mask], 1))


def test_pad_equal_to_eos_does_not_confuse_the_mask(engine):
    # Many tokenizers pad with their EOS token. Pick as EOS the second greedy token of prompt 0, so row 0 stops
    # after two tokens while the others run on and row 0 keeps receiving pad (== EOS) tokens.
    probe = engine.generate(PROMPTS, sampling(temperature=0.0, max_new_tokens=8, eos_token_id=VOCAB - 1))
    first, second = probe.response_ids[0, :2].tolist()
    assert first != second, "pick another seed: the probe's first two tokens coincide"
    sp = SamplingParams(eos_token_id=second, pad_token_id=second, temperature=0.0, max_new_tokens=8)
    batch = engine.generate(PROMPTS, sp)
    assert batch.response_lengths[0] == 2
    assert batch.response_mask[0].tolist() == [1, 1] + [0] * (batch.response_width - 2)
    assert batch.response_width > 2, "another row must run longer for the padding to be exercised"
    assert (batch.response_ids[0, 2:] == second).all()


def test_mapping_prompts_equal_list_prompts(engine):
    from hpcppo.rollout.base import left_pad

    ids, mask = left_pad(PROMPTS, PAD)
    extra = torch.full((len(PROMPTS), 2), PAD)  # extra left padding columns are re-trimmed
    sp = sampling(n=2, max_new_tokens=6, seed=3)
    a = engine.generate(PROMPTS, sp)
    b = engine.generate({"input_ids": torch.cat([extra, ids], 1),
                         "attention_mask": torch.cat([torch.zeros_like(extra), mask], 1)}, sp)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.rollout_log_probs, b.rollout_log_probs)


def test_top_k_one_is_greedy(engine):
    greedy = engine.generate(PROMPTS, sampling(temperature=0.0, max_new_tokens=5))
    topk1 = engine.generate(PROMPTS, sampling(temperature=1.0, top_k=1, max_new_tokens=5, seed=9))
    assert torch.equal(greedy.response_ids, topk1.response_ids)
    # log-probs are those of the unfiltered distribution at the sampling temperature (1 here, as for greedy)
    assert torch.allclose(greedy.rollout_log_probs, topk1.rollout_log_probs)


def test_filter_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_top_k_top_p(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # top_p=0.8: 0.5 + 0.3 reaches 0.8, so the third token is dropped
    assert torch.isinf(filter_top_k_top_p(logits, -1, 0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_k_top_p(logits, -1, 0.81)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_top_k_top_p(logits, -1, 0.1)).tolist() == [[False, True, True, True]]
    assert not torch.isinf(filter_top_k_top_p(logits, 0, 1.0)).any()


def test_top_p_samples_stay_in_the_nucleus():
    model = tiny_model(seed=3)
    engine = HFRolloutEngine(model)
    batch = engine.generate([[1, 2, 3]], sampling(n=64, max_new_tokens=1, top_p=0.3, seed=0, temperature=1.0))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits[0, -1]
    allowed = ~torch.isinf(filter_top_k_top_p(logits[None], -1, 0.3))[0]
    assert allowed[batch.response_ids[:, 0]].all()
    assert int(allowed.sum()) < VOCAB


# -- weight sync ------------------------------------------------------------------------------------------------


def perturbed_named(model: torch.nn.Module, scale: float = 0.5, seed: int = 11) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + scale * torch.randn(p.shape, generator=g)) for n, p in model.named_parameters()]


def test_sync_weights_copies_everything_and_reports_bytes():
    source = tiny_model(seed=1)
    engine = HFRolloutEngine(tiny_model(seed=2))
    new = perturbed_named(source)
    nbytes = engine.sync_weights(iter(new))
    assert nbytes == sum(t.numel() * t.element_size() for _, t in new)
    engine_params = dict(engine.model.named_parameters())
    for name, tensor in new:
        assert torch.equal(engine_params[name], tensor), name
    # a bf16 engine takes fp32 tensors (copy_ casts)
    bf16 = HFRolloutEngine(tiny_model(seed=2).to(torch.bfloat16))
    bf16.sync_weights(iter(new))
    assert torch.equal(dict(bf16.model.named_parameters())["lm_head.weight"], dict(new)["lm_head.weight"].bfloat16())


def test_sync_weights_errors_name_the_problem():
    engine = HFRolloutEngine(tiny_model())
    named = perturbed_named(tiny_model())
    with pytest.raises(KeyError, match="no parameter named 'model.nope.weight'"):
        engine.sync_weights([("model.nope.weight", torch.zeros(1))])
    bad_shape = [(n, t[:1] if n == "lm_head.weight" else t) for n, t in named]
    with pytest.raises(ValueError, match=r"shape mismatch for 'lm_head.weight': rollout model has \(64, 64\)"):
        engine.sync_weights(bad_shape)
    with pytest.raises(KeyError, match="1 rollout parameters received nothing: \\['model.norm.weight'\\]"):
        engine.sync_weights([(n, t) for n, t in named if n != "model.norm.weight"])
    with pytest.raises(ValueError, match="sent twice"):
        engine.sync_weights(named + named[:1])


def test_sync_weights_tied_embeddings_either_or_both_names():
    engine = HFRolloutEngine(tiny_model(tie=True))
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    source = perturbed_named(tiny_model(seed=5, tie=True))  # named_parameters lists the tied weight once
    assert "lm_head.weight" not in dict(source)
    engine.sync_weights(source)
    assert torch.equal(model.lm_head.weight, dict(source)["model.embed_tokens.weight"])
    # a stream that names the tied weight only as lm_head.weight also fills it
    renamed = [("lm_head.weight" if n == "model.embed_tokens.weight" else n, t) for n, t in source]
    engine.sync_weights(renamed)
    # both names with equal values are fine; different values are an error
    emb = dict(source)["model.embed_tokens.weight"]
    engine.sync_weights(source + [("lm_head.weight", emb.clone())])
    with pytest.raises(ValueError, match="tied to 'model.embed_tokens.weight'"):
        engine.sync_weights(source + [("lm_head.weight", emb + 1)])
    # an untied engine needs both
    untied = HFRolloutEngine(tiny_model(tie=False))
    with pytest.raises(KeyError, match="lm_head.weight"):
        untied.sync_weights(source)


def test_sync_changes_generation_and_close(engine):
    other = tiny_model(seed=42)
    local = HFRolloutEngine(tiny_model(seed=0))
    sp = sampling(temperature=0.0, max_new_tokens=5)
    before = local.generate(PROMPTS, sp)
    local.sync_weights(other.named_parameters())
    after = local.generate(PROMPTS, sp)
    expected = HFRolloutEngine(other).generate(PROMPTS, sp)
    assert torch.equal(after.response_ids, expected.response_ids)
    assert not torch.equal(before.rollout_log_probs, after.rollout_log_probs)
    local.sleep()
    local.wake_up()
    local.close()
    with pytest.raises(RuntimeError, match="closed"):
        local.generate(PROMPTS, sp)


def test_build_engine_hf_from_a_directory(tmp_path):
    model = tiny_model(seed=4)
    model.save_pretrained(tmp_path)
    engine = build_engine("hf", EngineSettings(model_path=tmp_path, dtype="float32", device="cpu"))
    sp = sampling(temperature=0.0, max_new_tokens=4)
    expected = HFRolloutEngine(model).generate(PROMPTS, sp).response_ids
    assert torch.equal(engine.generate(PROMPTS, sp).response_ids, expected)
    from hpcppo.errors import PathError

    with pytest.raises(PathError, match="not a Hugging Face model directory"):
        build_engine("hf", EngineSettings(model_path=tmp_path / "missing"))
