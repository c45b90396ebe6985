"""Actor/reference/critic builders and the batched log-prob / value forwards, on a tiny random Qwen2 model."""

from __future__ import annotations

import pytest
import torch

from hpcppo.rollout import SamplingParams
from hpcppo.models import position_ids_from_mask
from hpcppo.rollout.base import left_pad
from hpcppo.rollout.hf import HFRolloutEngine
from hpcppo.models import (
    Critic,
    as_torch_dtype,
    build_actor,
    build_critic,
    build_reference,
    compute_log_probs,
    compute_values,
    forward_log_probs,
    forward_values,
)

VOCAB = 64
EOS = tuple(range(56, 64))
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19, 20, 21]]


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    tiny_model(seed=0).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compute_log_probs_match_the_rollout_engine(temperature):
    model = tiny_model()
    engine = HFRolloutEngine(model)
    sp = SamplingParams(eos_token_id=EOS, pad_token_id=0, n=3, temperature=temperature, max_new_tokens=10, seed=5)
    batch = engine.generate(PROMPTS, sp)
    lp = compute_log_probs(model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_width,
                           temperature=temperature, micro_batch_size=4)
    assert lp.shape == batch.rollout_log_probs.shape and lp.dtype == torch.float32
    mask = batch.response_mask.bool()
    assert torch.allclose(lp[mask], batch.rollout_log_probs[mask], atol=1e-5, rtol=0)
    # a different temperature gives different values: the temperature really is applied
    other = compute_log_probs(model, batch.input_ids, batch.attention_mask, batch.position_ids,
                              batch.response_width, temperature=temperature * 2, micro_batch_size=4)
    assert not torch.allclose(other[mask], batch.rollout_log_probs[mask], atol=1e-3)


def sample_batch(model, seed=0):
    engine = HFRolloutEngine(model)
    return engine.generate(PROMPTS, SamplingParams(eos_token_id=EOS, pad_token_id=0, n=2, max_new_tokens=8, seed=seed))


def test_micro_batching_does_not_change_results():
    model = tiny_model()
    b = sample_batch(model)
    args = (b.input_ids, b.attention_mask, b.position_ids, b.response_width)
    one, ent_one = compute_log_probs(model, *args, micro_batch_size=len(b.input_ids), with_entropy=True)
    for mbs in (1, 3, 4):
        lp, ent = compute_log_probs(model, *args, micro_batch_size=mbs, with_entropy=True)
        assert torch.allclose(lp, one, atol=1e-5) and torch.allclose(ent, ent_one, atol=1e-5)


def test_entropy_and_log_probs_against_a_plain_full_forward():
    model = tiny_model()
    b = sample_batch(model, seed=1)
    R = b.response_width
    lp, ent = compute_log_probs(model, b.input_ids, b.attention_mask, b.position_ids, R, temperature=0.9,
                                micro_batch_size=4, with_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    ref_logp = torch.log_softmax(logits[:, -R - 1:-1].float() / 0.9, dim=-1)
    expected = ref_logp.gather(-1, b.response_ids.unsqueeze(-1)).squeeze(-1)
    expected_ent = -(ref_logp.exp() * ref_logp).sum(-1)
    assert torch.allclose(lp, expected, atol=1e-5) and torch.allclose(ent, expected_ent, atol=1e-5)


def test_left_padding_does_not_change_a_sequences_log_probs():
    model = tiny_model()
    prompt, response = [16, 17, 18], [3, 4, 5, 6]
    alone = torch.tensor([prompt + response])
    ones = torch.ones_like(alone)
    lp_alone = compute_log_probs(model, alone, ones, position_ids_from_mask(ones), len(response),
                                 micro_batch_size=1)
    # the same sequence in a batch with a longer prompt: it gets 5 columns of left padding
    ids, mask = left_pad([prompt + response, [1, 2, 3, 4, 5, 6, 7, 8] + response], pad_token_id=0)
    lp_batch = compute_log_probs(model, ids, mask, position_ids_from_mask(mask), len(response), micro_batch_size=2)
    assert ids.shape[1] - len(prompt + response) == 5
    assert torch.allclose(lp_batch[0], lp_alone[0], atol=1e-5)


def test_forward_log_probs_has_gradients_and_checks_shapes():
    model = tiny_model().train()
    b = sample_batch(tiny_model())  # the engine freezes the module it is given: sample with a copy
    args = (b.input_ids[:2], b.attention_mask[:2], b.position_ids[:2], b.response_width)
    lp, ent = forward_log_probs(model, *args, temperature=0.7)
    assert ent is None
    (lp * b.response_mask[:2]).sum().backward()
    assert model.lm_head.weight.grad is not None and model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    # the gradient is that of log_softmax(logits / T): compare with a plain autograd computation
    grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logits = model(input_ids=args[0], attention_mask=args[1], position_ids=args[2]).logits[:, -args[3] - 1:-1] / 0.7
    plain = torch.log_softmax(logits, -1).gather(-1, b.response_ids[:2].unsqueeze(-1)).squeeze(-1)
    (plain * b.response_mask[:2]).sum().backward()
    assert torch.allclose(lp, plain, atol=1e-5) and torch.allclose(grad, model.lm_head.weight.grad, atol=1e-5)
    with pytest.raises(ValueError, match="response_len must be in"):
        forward_log_probs(model, b.input_ids, b.attention_mask, b.position_ids, b.input_ids.shape[1])
    with pytest.raises(ValueError, match="must all be"):
        forward_log_probs(model, b.input_ids, b.attention_mask[:, 1:], b.position_ids, 2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        compute_log_probs(model, b.input_ids, b.attention_mask, b.position_ids, 2, micro_batch_size=0)


# -- builders -----------------------------------------------------------------------------------------------------


def test_build_actor_and_reference(model_dir):
    actor = build_actor(model_dir, dtype="float32")
    assert actor.training and all(p.requires_grad for p in actor.parameters())
    assert actor.config.use_cache is False
    ref = build_reference(model_dir, dtype="bf16")
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert next(ref.parameters()).dtype == torch.bfloat16
    from hpcppo.distributed.fsdp import apply_activation_checkpointing

    ckpt = apply_activation_checkpointing(build_actor(model_dir))
    flag = getattr(ckpt, "is_activation_checkpointing", None)
    assert flag if flag is not None else ckpt.is_gradient_checkpointing
    # gradient checkpointing gives the same log-probs and gradients
    b = sample_batch(tiny_model())
    args = (b.input_ids, b.attention_mask, b.position_ids, b.response_width)
    lp_a, _ = forward_log_probs(actor, *args)
    lp_c, _ = forward_log_probs(ckpt, *args)
    lp_a.sum().backward()
    lp_c.sum().backward()
    assert torch.allclose(lp_a, lp_c, atol=1e-6)
    assert torch.allclose(actor.lm_head.weight.grad, ckpt.lm_head.weight.grad, atol=1e-5)
    from hpcppo.errors import PathError

    with pytest.raises(PathError, match="no config.json"):
        build_actor(model_dir / "nope")
    with pytest.raises(ValueError, match="unknown dtype 'float99'; use bfloat16, float16, float32 or auto"):
        as_torch_dtype("float99")


def test_one_dtype_map_covers_every_name_a_spec_may_use():
    from hpcppo.config.experiment import DTYPE_NAMES
    from hpcppo.models import DTYPES

    assert tuple(DTYPES) == DTYPE_NAMES
    assert {as_torch_dtype(n) for n in DTYPE_NAMES} == {torch.bfloat16, torch.float16, torch.float32}
    assert as_torch_dtype("bf16") is torch.bfloat16 and as_torch_dtype("auto") == "auto"


def test_critic_values_shapes_and_gradients(model_dir):
    critic = build_critic(model_dir)
    assert isinstance(critic, Critic) and critic.training
    assert not hasattr(critic.backbone, "lm_head")
    # same backbone weights as the causal LM it came from
    lm = tiny_model(seed=0)
    assert torch.equal(critic.backbone.layers[0].mlp.up_proj.weight, lm.model.layers[0].mlp.up_proj.weight)
    b = sample_batch(lm)
    values = critic(b.input_ids, b.attention_mask, b.position_ids)
    assert values.shape == b.input_ids.shape and values.dtype == torch.float32
    R = b.response_width
    v = forward_values(critic, b.input_ids, b.attention_mask, b.position_ids, R)
    assert v.shape == (b.num_samples, R) and torch.allclose(v, values[:, -R - 1:-1])
    ((v - 1.0) ** 2 * b.response_mask).sum().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0
    assert critic.backbone.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert critic.backbone.embed_tokens.weight.grad.abs().sum() > 0

    cv = compute_values(critic, b.input_ids, b.attention_mask, b.position_ids, R, micro_batch_size=3,
                        response_mask=b.response_mask)
    assert torch.allclose(cv, v.detach() * b.response_mask, atol=1e-6)
    assert (cv[b.response_mask == 0] == 0).all()


def test_critic_value_head_is_identical_across_builds_and_reloads(model_dir, tmp_path):
    torch.manual_seed(1)
    a = build_critic(model_dir)
    torch.manual_seed(2)
    b = build_critic(model_dir)
    # every rank must build the same head before FSDP shards it, whatever its RNG state
    assert torch.equal(a.value_head.weight, b.value_head.weight) and (a.value_head.bias == 0).all()
    assert 0 < a.value_head.weight.std() < 0.1
    with torch.no_grad():
        a.value_head.weight.add_(1.0)
        a.value_head.bias.fill_(0.5)
    a.save_pretrained(tmp_path)
    c = build_critic(tmp_path)
    assert torch.equal(c.value_head.weight, a.value_head.weight) and torch.equal(c.value_head.bias, a.value_head.bias)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(c(ids), a(ids), atol=1e-6)


def test_critic_layers_are_found_by_the_fsdp_helper(model_dir):
    from hpcppo.distributed.fsdp import find_layers

    critic = build_critic(model_dir)
    layers = find_layers(critic)
    assert len(layers) == 2 and all(type(m).__name__ == "Qwen2DecoderLayer" for m in layers)
