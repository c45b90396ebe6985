"""The reward model (issue 23) against verl b178a3c, re-derived from its source: which token's score it reads
(``RewardModelWorker._forward_micro_batch``), where the score goes (``_expand_to_token_level``, the reward loop's
``compute_rm_score``), how a response is re-templated for the reward model's tokenizer (``_switch_chat_template``);
the model as hpcppo builds and micro-batches it; and DAPO's overlong penalty (``DAPORewardManager.__call__``)."""

from __future__ import annotations


import pytest
import torch

from hpcppo.data.reward_manager import OverlongBuffer, apply_overlong, overlong_reward
from hpcppo.data.rm_inputs import reward_model_ids
from hpcppo.models.reward_model import build_reward_model, compute_rm_scores, last_token_scores
from hpcppo.train import batching
from hpcppo.train.reward_phase import right_pad


def _verl_position_ids(mask: torch.Tensor) -> torch.Tensor:
    # verl/utils/model.py compute_position_id_with_mask: clip(cumsum(mask) - 1, min=0)
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0, max=None)


def _left_right_batch():
    """Left-padded prompts + right-padded responses, verl's layout; one response is empty."""
    prompt = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    response = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    return torch.cat([prompt, response], dim=1), response


def test_the_score_goes_where_verls_expand_to_token_level_puts_it():
    mask, response_mask = _left_right_batch()
    scores = torch.tensor([0.5, -1.25, 2.0, 3.0])
    # verl: eos_mask_idx = argmax(position_ids * attention_mask); scores there; then the response's columns.
    eos = torch.argmax(_verl_position_ids(mask) * mask, dim=-1)
    verl = torch.zeros_like(mask, dtype=scores.dtype)
    verl[torch.arange(4), eos] = scores
    verl = verl[:, -response_mask.shape[1]:]
    assert torch.equal(batching.place_scores(scores.tolist(), response_mask), verl)
    # the reward loop: rm_scores[i, valid_response_length - 1] (rows with a response)
    loop = torch.zeros_like(response_mask, dtype=torch.float32)
    loop[torch.arange(3), response_mask[:3].sum(-1) - 1] = scores[:3]
    assert torch.equal(batching.place_scores(scores.tolist(), response_mask)[:3], loop[:3])


def test_the_score_read_is_the_last_valid_tokens_as_verls_forward_micro_batch():
    token_scores = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    verl = token_scores[torch.arange(3), torch.argmax(_verl_position_ids(mask) * mask, dim=-1)]
    assert torch.equal(last_token_scores(token_scores, mask), verl)


def test_the_head_is_hfs_sequence_classification_head_and_micro_batches_do_not_change_a_score(random_tiny_rm):
    from transformers import AutoModelForSequenceClassification

    model = build_reward_model(random_tiny_rm)
    hf = AutoModelForSequenceClassification.from_pretrained(str(random_tiny_rm)).eval()
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(8, 40, (n,), generator=gen).tolist() for n in (5, 11, 3, 9, 7)]
    ids, mask = right_pad(rows, 0, torch.device("cpu"))
    alone = torch.stack([hf(input_ids=torch.tensor([r])).logits[0, 0] for r in rows]).detach()
    for micro in (1, 2, 5):
        torch.testing.assert_close(compute_rm_scores(model, ids, mask, micro_batch_size=micro), alone,
                                   rtol=1e-5, atol=1e-5)
    groups = [torch.tensor([4, 1]), torch.tensor([0]), torch.tensor([2, 3])]
    torch.testing.assert_close(compute_rm_scores(model, ids, mask, groups), alone, rtol=1e-5, atol=1e-5)
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def _permuted_tokenizer(template: str):
    """The tiny tokenizer's tokens under other ids, with another chat template: a reward model's own tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hpcppo.tiny import build_tokenizer

    vocab = build_tokenizer().get_vocab()
    tokens = sorted(vocab, key=lambda t: -vocab[t])
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(["<pad>", "<unk>", "<bos>", "<eos>", "<|user|>", "<|assistant|>", "<|end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = template
    return tok


RM_TEMPLATE = "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"


def test_a_response_is_re_templated_for_the_reward_models_tokenizer_as_verl_does():
    from hpcppo.tiny import build_tokenizer

    actor, rm = build_tokenizer(), _permuted_tokenizer(RM_TEMPLATE)
    prompt = [{"role": "user", "content": "12+5="}]
    response = actor("17", add_special_tokens=False)["input_ids"] + [actor.eos_token_id]
    odd = actor("1", add_special_tokens=False)["input_ids"] + [actor.eos_token_id] + actor("7")["input_ids"]
    ids, cut = reward_model_ids(rm, actor, [prompt, prompt], [response, odd], max_length=64)
    # verl: decode with special tokens, drop every EOS string, append as the assistant's turn, render with the reward
    # model's template (no generation prompt), tokenise without special tokens.
    text = "<|user|>12+5=<|end|><|assistant|>17<|end|>"
    assert rm.apply_chat_template(prompt + [{"role": "assistant", "content": "17"}], tokenize=False) == text
    assert ids == [rm(text, add_special_tokens=False)["input_ids"]] * 2 and cut == 0
    assert ids[0] != actor(text, add_special_tokens=False)["input_ids"]  # the reward model's own ids
    short, cut = reward_model_ids(rm, actor, [prompt], [response], max_length=5)
    assert short == [ids[0][:5]] and cut == 1  # cut from the right (verl's postprocess_data, truncation="right")


def _verl_dapo(score: float, valid_response_length: int, max_resp_len: int, buffer_len: int,
               penalty_factor: float) -> torch.Tensor:
    """verl's DAPORewardManager.__call__ on one row, with its tensor types: valid_response_length is an int64
    tensor (attention_mask[...].sum()), the reward lands in a float32 reward tensor."""
    length = torch.tensor(valid_response_length)
    expected_len = max_resp_len - buffer_len
    exceed_len = length - expected_len
    overlong = min(-exceed_len / buffer_len * penalty_factor, 0)
    reward_tensor = torch.zeros(1, dtype=torch.float32)
    reward_tensor[0] = score + overlong
    return reward_tensor[0]


@pytest.mark.parametrize("max_resp_len, buffer_len, factor", [(16, 4, 1.0), (16, 16, 0.5), (9, 3, 2.0)])
def test_dapo_overlong_penalty_matches_verls_formula(max_resp_len, buffer_len, factor):
    buffer = OverlongBuffer(max_resp_len, buffer_len, factor)
    lengths = list(range(0, max_resp_len + 1))
    scores = [float(i % 2) for i in lengths]
    rewards, penalties = apply_overlong(scores, lengths, buffer)
    for s, n, r, p in zip(scores, lengths, rewards, penalties):
        torch.testing.assert_close(torch.tensor(r, dtype=torch.float32), _verl_dapo(s, n, max_resp_len, buffer_len,
                                                                                     factor), rtol=0, atol=1e-6)
        assert (p < 0) == (n > max_resp_len - buffer_len)  # verl's "overlong" flag
    assert overlong_reward(max_resp_len, buffer) == pytest.approx(-factor)
    assert overlong_reward(max_resp_len - buffer_len, buffer) == 0.0


def test_build_score_fn_adds_the_penalty_only_for_dapo_with_the_buffer():
    from hpcppo.config.experiment import DataSection
    from hpcppo.config.reward import OverlongBufferSection, RewardManagerSection
    from hpcppo.train.build import build_score_fn

    data = DataSection(train_files=["x.parquet"], reward_fn="arith", max_response_length=8)
    args = (["hpcppo/arith"] * 3, ["17", "17", "3"], ["17", "17", "17"], [{}, {}, {}])
    dapo = RewardManagerSection(name="dapo", overlong_buffer=OverlongBufferSection(enable=True, len=4,
                                                                                   penalty_factor=1.0))
    penalties: list[float] = []
    got = build_score_fn(data, dapo)(*args, lengths=[3, 8, 6], penalties=penalties)
    assert got == pytest.approx([1.0, 1.0 - 1.0, 0.0 - 0.5]) and penalties == pytest.approx([0.0, -1.0, -0.5])
    assert build_score_fn(data, RewardManagerSection(name="dapo"))(*args, lengths=[3, 8, 6]) == [1.0, 1.0, 0.0]
    assert build_score_fn(data)(*args) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="length"):
        build_score_fn(data, dapo)(*args)
