"""Token-budget micro-batches (issue 21, item 2): packing under the budget, trimming to each micro-batch's own
columns, forwards put back in row order, and the same gradient as fixed-size micro-batches for every loss_agg_mode
and for the value loss (run_update end to end, a real tiny Qwen2)."""

from __future__ import annotations

import random

import pytest
import torch

from hpcppo.config import ActorSection, CriticSection, DataSection, Experiment, ModelSection, RolloutSection, resolve
from hpcppo.config.site import LocalSection, Site
from hpcppo.errors import ResolveError
from hpcppo.models import (Critic, compute_log_probs, compute_values, forward_log_probs, forward_log_probs_packed,
                           forward_values, forward_values_packed, position_ids_from_mask, row_lengths, trimmed_columns)
from hpcppo.train import batching
from hpcppo.train.optim import LRSchedule
from hpcppo.train.update import UpdateSettings, actor_loss, critic_loss, run_update

VOCAB = 64


def _config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, attn_implementation="sdpa")


def _actor(seed: int = 0):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config()).train()
    model.config.use_cache = False
    return model


def _critic(seed: int = 0) -> Critic:
    from transformers import Qwen2Model

    torch.manual_seed(seed)
    return Critic(Qwen2Model(_config())).train()


def _batch(prompts: list[int], responses: list[int], seed: int = 0) -> dict:
    """Rows with these prompt (left padded) and response (right padded) lengths, and the tensors an update reads."""
    g = torch.Generator().manual_seed(seed)
    b, p_w, r_w = len(prompts), max(prompts), max(responses)
    prompt_mask = torch.tensor([[0] * (p_w - p) + [1] * p for p in prompts])
    response_mask = torch.tensor([[1] * r + [0] * (r_w - r) for r in responses])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(1, VOCAB, (b, p_w + r_w), generator=g) * attention_mask
    return {
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
        "responses": input_ids[:, p_w:], "response_mask": response_mask,
        "old_log_probs": (-4.2 + 0.3 * torch.randn(b, r_w, generator=g)) * response_mask,
        "ref_log_probs": (-4.2 + 0.3 * torch.randn(b, r_w, generator=g)) * response_mask,
        "advantages": torch.randn(b, r_w, generator=g) * response_mask,
        "values": 0.1 * torch.randn(b, r_w, generator=g) * response_mask,
        "returns": torch.randn(b, r_w, generator=g) * response_mask,
        "prompt_len": prompt_mask.sum(-1), "records": [f"row {i}" for i in range(b)],
    }


PROMPTS = [5, 3, 7, 2, 6, 4, 7, 1]
RESPONSES = [2, 11, 1, 5, 0, 9, 3, 12]  # one row without a response token
LONGEST = max(PROMPTS) + max(RESPONSES)


# -- packing -------------------------------------------------------------------------------------------------------


def _cost(group, p, r, packed=False):
    if packed:
        return sum(p[i] + r[i] for i in group)
    return len(group) * (max(p[i] for i in group) + max(r[i] for i in group))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_packing_keeps_every_row_once_under_the_budget_in_the_count_asked(seed, packed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    p = [rng.randint(1, 30) for _ in range(n)]
    r = [rng.randint(0, 200) for _ in range(n)]
    budget = max(a + b for a, b in zip(p, r)) + rng.randint(0, 600)
    fewest = batching.pack_rows(p, r, budget, packed=packed)
    for count in sorted({len(fewest), min(n, len(fewest) + 1), n}):
        groups = batching.pack_rows(p, r, budget, count, packed=packed)
        assert len(groups) == count and all(groups)
        assert sorted(i for g in groups for i in g) == list(range(n))
        assert all(_cost(g, p, r, packed) <= budget for g in groups)
        # balanced: the costliest micro-batch is no costlier than the costliest of the fewest-first packing
        assert max(_cost(g, p, r, packed) for g in groups) <= max(_cost(g, p, r, packed) for g in fewest)


def test_packed_micro_batches_count_real_tokens():
    p, r = [4] * 6, [100, 3, 98, 5, 4, 97]
    # padded: 2 x 104, 2 x 101 (3 x 101 > 268), 2 x 8; packed: 206 and 125 real tokens
    assert batching.pack_rows(p, r, 268) == [[0, 2], [5, 3], [4, 1]]
    assert batching.pack_rows(p, r, 268, packed=True) == [[0, 2], [5, 3, 4, 1]]


def test_packing_groups_rows_of_like_length_and_needs_fewer_tokens_than_padding_to_the_batch():
    p = [4] * 8
    r = [100, 3, 98, 5, 4, 97, 2, 99]
    groups = batching.pack_rows(p, r, 4 * 104)
    assert [sorted(g) for g in groups] == [[0, 2, 5, 7], [1, 3, 4, 6]]
    assert sum(_cost(g, p, r) for g in groups) == 4 * 104 + 4 * 9  # against 8 x 104 padded


def test_packing_refuses_what_cannot_be_done():
    with pytest.raises(ValueError, match="a row of 12 tokens does not fit a micro-batch of 11 tokens"):
        batching.pack_rows([2, 2], [10, 1], 11)
    with pytest.raises(ValueError, match="2 rows cannot make 3 micro-batches"):
        batching.pack_rows([2, 2], [10, 1], 24, 3)
    with pytest.raises(ValueError, match="between 2 and 2"):
        batching.pack_rows([2, 2], [10, 1], 12, 1)


def test_row_lengths_and_trimmed_columns_follow_left_and_right_padding():
    b = _batch([3, 1, 2], [2, 4, 0])
    prompt, response = row_lengths(b["attention_mask"], 4)
    assert prompt.tolist() == [3, 1, 2] and response.tolist() == [2, 4, 0]
    cols, width = trimmed_columns(b["attention_mask"][[1, 2]], 4)  # longest prompt 2, longest response 4
    assert (cols, width) == (slice(1, 7), 4)
    cols, width = trimmed_columns(b["attention_mask"][[2]], 4)  # no response token: one column kept
    assert (cols, width) == (slice(1, 4), 1)


def test_take_rows_trims_each_key_by_its_width_and_refuses_an_unknown_one():
    b = _batch(PROMPTS, RESPONSES)
    mb = batching.take_rows(b, torch.tensor([3, 1]))  # prompts 2 and 3, responses 5 and 11
    assert mb["input_ids"].shape == (2, 3 + 11) and mb["responses"].shape == (2, 11)
    assert torch.equal(mb["input_ids"], b["input_ids"][[3, 1], 7 - 3: 7 + 11])
    assert torch.equal(mb["advantages"], b["advantages"][[3, 1], :11])
    assert mb["records"] == ["row 3", "row 1"] and mb["prompt_len"].tolist() == [2, 3]
    with pytest.raises(ValueError, match=r"batch key 'odd' is \(2, 5\)"):
        batching.take_rows(b | {"odd": torch.zeros(8, 5)}, torch.tensor([0, 1]))


def test_token_budget_groups_alone_cover_each_batch_in_the_fewest_micro_batches():
    b = _batch(PROMPTS, RESPONSES)
    [groups] = batching.token_budget_groups([b["attention_mask"]], 12, LONGEST)
    assert sorted(torch.cat(groups).tolist()) == list(range(8))
    assert len(groups) == len(batching.pack_rows(PROMPTS, RESPONSES, LONGEST))


# -- forwards -------------------------------------------------------------------------------------------------------


def test_trimmed_forwards_give_the_padded_log_probs_values_and_entropy_in_row_order():
    b = _batch(PROMPTS, RESPONSES, seed=1)
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1])
    [groups] = batching.token_budget_groups([b["attention_mask"]], args[3], LONGEST + 4)
    assert len(groups) > 1 and any(len(g) > 1 for g in groups)
    mask = b["response_mask"].bool()
    actor = _actor()
    lp_fixed, ent_fixed = compute_log_probs(actor, *args, micro_batch_size=3, with_entropy=True)
    lp, ent = compute_log_probs(actor, *args, micro_batch_size=3, with_entropy=True, micro_batches=groups)
    torch.testing.assert_close(lp[mask], lp_fixed[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask], ent_fixed[mask], rtol=0, atol=1e-5)
    for rows in groups:  # the columns past a micro-batch's longest response were not computed: 0
        width = int(b["response_mask"][rows].sum(-1).max())
        assert lp[rows, :max(width, 1)].any() and not lp[rows, max(width, 1):].any()
    critic = _critic()
    v_fixed = compute_values(critic, *args, micro_batch_size=3, response_mask=b["response_mask"])
    v = compute_values(critic, *args, micro_batch_size=3, response_mask=b["response_mask"], micro_batches=groups)
    torch.testing.assert_close(v, v_fixed, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="each of the 8 rows exactly once"):
        compute_log_probs(actor, *args, micro_batch_size=3, micro_batches=groups[1:])
    # packed: the same numbers, fixed-size or token-budget micro-batches
    for micro_batches in (None, batching.token_budget_groups([b["attention_mask"]], args[3], 2 * LONGEST,
                                                             packed=True)[0]):
        lp_p, ent_p = compute_log_probs(actor, *args, micro_batch_size=3, with_entropy=True, packed=True,
                                        micro_batches=micro_batches)
        torch.testing.assert_close(lp_p[mask], lp_fixed[mask], rtol=0, atol=1e-5)
        torch.testing.assert_close(ent_p[mask], ent_fixed[mask], rtol=0, atol=1e-5)
        assert not lp_p[~mask].any()  # packed: only response tokens are scored
        v_p = compute_values(critic, *args, micro_batch_size=3, response_mask=b["response_mask"], packed=True,
                             micro_batches=micro_batches)
        torch.testing.assert_close(v_p, v_fixed, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [None, 3 * VOCAB], ids=["one chunk", "chunks of 3 positions"])
def test_packed_forwards_with_autograd_equal_the_padded_ones(chunk):
    b = _batch(PROMPTS, RESPONSES, seed=5)
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1])
    mask = b["response_mask"].bool()
    actor = _actor()
    lp, ent = forward_log_probs(actor, *args, temperature=0.7, with_entropy=True, chunk_elements=chunk)
    lp_p, ent_p = forward_log_probs_packed(actor, *args, temperature=0.7, with_entropy=True, chunk_elements=chunk)
    torch.testing.assert_close(lp_p[mask], lp[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_p[mask], ent[mask], rtol=0, atol=1e-5)
    # a micro-batch without a response token still runs, and its (zero) output stays in the graph for backward
    lp_e, _ = forward_log_probs_packed(actor, *(a[[4]] for a in args[:3]), args[3])
    assert not lp_e.any() and lp_e.requires_grad
    critic = _critic()
    v, v_p = forward_values(critic, *args), forward_values_packed(critic, *args)
    torch.testing.assert_close(v_p[mask], v[mask], rtol=0, atol=1e-5)
    v_e = forward_values_packed(critic, *(a[[4]] for a in args[:3]), args[3])
    assert not v_e.any() and v_e.requires_grad


# -- the same gradient --------------------------------------------------------------------------------------------


def _update(model, batch, loss_fn_of, budget: int, micro: int = 3, mini: int = 8,
            packed: bool = False) -> dict[str, torch.Tensor]:
    """One run_update with plain SGD at lr 1 and no effective clip: the parameters move by minus the gradient."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    lr = LRSchedule(optim, base_lr=1.0, warmup_steps=0, total_steps=0, schedule="constant", min_lr_ratio=0.0)
    settings = UpdateSettings(prefix="x", epochs=1, mini_batch_per_rank=mini, micro_batch_per_rank=micro,
                              grad_clip=1e9, world_size=1, max_response_length=16, max_tokens_per_micro_batch=budget,
                              remove_padding=packed)
    run_update(batch, model, optim, lr, settings, loss_fn_of(model, packed))
    return {n: before[n] - p.detach() for n, p in model.named_parameters()}


def _assert_same_gradient(fixed, budget):
    assert fixed.keys() == budget.keys()
    assert max(float(g.abs().max()) for g in fixed.values()) > 1e-4  # a gradient that could differ
    for name in fixed:
        torch.testing.assert_close(budget[name], fixed[name], rtol=0, atol=1e-5, msg=name)


MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@pytest.mark.parametrize("packed", [False, True], ids=["trimmed", "packed"])
@pytest.mark.parametrize("mode", MODES)
def test_actor_token_budget_gives_the_fixed_size_gradient(mode, packed):
    b = _batch(PROMPTS, RESPONSES, seed=2)
    cfg = ActorSection(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True)

    def loss_of(model, packed):
        return actor_loss(model, cfg, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=True, temperature=0.9,
                          packed=packed)

    fixed = _update(_actor(), b, loss_of, budget=0)
    budget = _update(_actor(), b, loss_of, budget=LONGEST + 4, packed=packed)
    _assert_same_gradient(fixed, budget)


@pytest.mark.parametrize("packed", [False, True], ids=["trimmed", "packed"])
@pytest.mark.parametrize("mode", MODES)
def test_critic_token_budget_gives_the_fixed_size_gradient(mode, packed):
    b = _batch(PROMPTS, RESPONSES, seed=3)
    cfg = CriticSection(loss_agg_mode=mode, cliprange_value=0.05)

    def loss_of(model, packed):
        return critic_loss(model, cfg, packed=packed)

    _assert_same_gradient(_update(_critic(), b, loss_of, budget=0),
                          _update(_critic(), b, loss_of, budget=2 * LONGEST, packed=packed))


def test_two_mini_batches_and_a_budget_of_one_row_each_still_give_the_same_gradient():
    b = _batch(PROMPTS, RESPONSES, seed=4)
    cfg = ActorSection(loss_agg_mode="seq-mean-token-mean")

    def loss_of(model, packed):
        return actor_loss(model, cfg, clip_ratio_low=0.2, clip_ratio_high=0.28, kl_loss=False, temperature=1.0,
                          packed=packed)

    _assert_same_gradient(_update(_actor(), b, loss_of, budget=0, micro=4, mini=4),
                          _update(_actor(), b, loss_of, budget=LONGEST, mini=4))
    _assert_same_gradient(_update(_actor(), b, loss_of, budget=0, micro=4, mini=4),
                          _update(_actor(), b, loss_of, budget=LONGEST, mini=4, packed=True))


# -- config -------------------------------------------------------------------------------------------------------


def _exp(**sections) -> Experiment:
    base = dict(name="t", model=ModelSection(path="/m"),
                data=DataSection(train_files=["/d.parquet"], max_prompt_length=256, max_response_length=768))
    return Experiment(**(base | sections))


LOCAL = Site(name="l", scheduler="local", local=LocalSection(procs_per_node=2))


@pytest.mark.parametrize("section, value", [("actor", ActorSection(max_tokens_per_micro_batch=1000)),
                                            ("rollout", RolloutSection(max_tokens_per_micro_batch=1023))])
def test_compile_refuses_a_budget_below_the_longest_row_in_one_line(section, value):
    with pytest.raises(ResolveError) as info:
        resolve(LOCAL, _exp(**{section: value}))
    message = str(info.value)
    assert "\n" not in message and f"{section}.max_tokens_per_micro_batch={value.max_tokens_per_micro_batch}" in message
    assert "use at least 1024" in message
    assert resolve(LOCAL, _exp(**{section: type(value)(max_tokens_per_micro_batch=1024)})).world_size == 2


def test_the_critic_budget_is_checked_only_where_a_critic_trains():
    from hpcppo.config import AlgorithmSection

    small = CriticSection(max_tokens_per_micro_batch=10)
    with pytest.raises(ResolveError, match="critic.max_tokens_per_micro_batch=10 .* use at least 1024"):
        resolve(LOCAL, _exp(critic=small))
    resolve(LOCAL, _exp(critic=small, algorithm=AlgorithmSection(adv_estimator="grpo"),
                        rollout=RolloutSection(n=2)))


def test_a_budget_frees_the_fixed_micro_batch_from_dividing_the_mini_batch():
    """6 samples per mini-batch over 2 ranks = 3 per rank, which the default micro-batch of 4 does not divide: refused
    with fixed-size micro-batches, accepted once a budget makes the update's micro-batches (actor and critic)."""
    from hpcppo.config import TrainerSection

    batches = dict(trainer=TrainerSection(train_batch_size=12), rollout=RolloutSection(n=1))
    actor = dict(ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=4)
    with pytest.raises(ResolveError, match="ppo_micro_batch_size_per_gpu=4 = 8; valid micro-batch sizes: 1, 3"):
        resolve(LOCAL, _exp(actor=ActorSection(**actor), **batches))
    with pytest.raises(ResolveError, match=r"critic.ppo_micro_batch_size_per_gpu=0 \(= the actor's 4\)"):
        resolve(LOCAL, _exp(actor=ActorSection(**actor, max_tokens_per_micro_batch=2048), **batches))
    plan = resolve(LOCAL, _exp(actor=ActorSection(**actor, max_tokens_per_micro_batch=2048),
                               critic=CriticSection(max_tokens_per_micro_batch=2048), **batches))
    assert (plan.actor_mini_batch_per_rank, plan.grad_accum_steps_actor) == (3, 1)
    assert (plan.critic_mini_batch_per_rank, plan.grad_accum_steps_critic) == (3, 1)


# -- import-verl ------------------------------------------------------------------------------------------------------


def _imported(*tokens: str, tmp_path):
    from hpcppo.verl.importer import read_command_line, translate

    settings, _ = read_command_line("python3 -m verl.trainer.main_ppo " + " ".join(tokens))
    imp = translate(settings, cwd=tmp_path)
    return {k: v for k, v in imp.values.items() if k.endswith("max_tokens_per_micro_batch")}, imp.report


def test_import_verl_translates_dynamic_micro_batches_with_verls_defaults(tmp_path):
    A = "actor_rollout_ref.actor."
    # on alone: verl's budgets (16384; the critic's 32768), the log-prob and critic flags following the actor's
    values, _ = _imported(A + "use_dynamic_bsz=True", tmp_path=tmp_path)
    assert values == {"actor.max_tokens_per_micro_batch": 16384, "rollout.max_tokens_per_micro_batch": 16384,
                      "critic.max_tokens_per_micro_batch": 32768}
    # the log-prob budgets follow the actor's; one budget for every forward here: the smallest
    values, _ = _imported(A + "use_dynamic_bsz=true", A + "ppo_max_token_len_per_gpu=24000",
                          "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40000",
                          "critic.ppo_max_token_len_per_gpu=50000", tmp_path=tmp_path)
    assert values == {"actor.max_tokens_per_micro_batch": 24000, "rollout.max_tokens_per_micro_batch": 24000,
                      "critic.max_tokens_per_micro_batch": 50000}
    # a budget without its flag does nothing in verl: reported, not applied
    values, report = _imported(A + "ppo_max_token_len_per_gpu=24000", tmp_path=tmp_path)
    assert values == {}
    assert ("ignored", A + "ppo_max_token_len_per_gpu=24000",
            f"only with {A}use_dynamic_bsz=true, as in verl (fixed-size micro-batches otherwise)") in report
    # the critic alone: its forward budget follows its ppo_max_token_len_per_gpu
    values, _ = _imported(A + "use_dynamic_bsz=false", "critic.use_dynamic_bsz=true",
                          "critic.ppo_max_token_len_per_gpu=9000", tmp_path=tmp_path)
    assert values == {"critic.max_tokens_per_micro_batch": 9000, "rollout.max_tokens_per_micro_batch": 9000}
    from hpcppo.verl.importer import read_command_line, translate

    settings, _ = read_command_line("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.use_remove_padding=True")
    assert translate(settings, cwd=tmp_path).values["model.remove_padding"] is True
    values, report = _imported(A + "use_dynamic_bsz=true", A + "ppo_max_token_len_per_gpu=-5", tmp_path=tmp_path)
    assert "actor.max_tokens_per_micro_batch" not in values
    assert any(kind == "unsupported" and "is not a positive number of tokens" in why for kind, _, why in report)
