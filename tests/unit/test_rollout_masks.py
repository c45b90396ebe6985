"""The two masks of a rollout batch (docs/rollout-phase.md): the attention mask covers every response token, the
loss mask only the model's. A hand-built trajectory with a tool turn in the middle of its response (model tokens,
two tool tokens, model tokens and EOS) makes them differ: the forwards attend to the tool turn, the losses, the
token counts and the advantages ignore it, the scoring and the length metrics count it.

A second, hand-built trajectory of three assistant turns and two tool turns is checked against a hand computation:
masks, positions, log-prob alignment and the PPO loss.

Each test compares the trajectory with the same tokens as one plain turn (both masks all ones): what reads the
attention mask must not see a difference, what reads the loss mask must not see what lies under the tool turn.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hpcppo import algos
from hpcppo.config.experiment import ActorSection, AlgorithmSection, CriticSection
from hpcppo.config.reward import RewardManagerSection
from hpcppo.rollout.agent_loop import SingleTurnLoop, Trajectory, batch_from_trajectories
from hpcppo.rollout.base import RolloutBatch, assemble_batch, batch_from_lists
from hpcppo.train import batching
from hpcppo.train.update import actor_loss, critic_loss

PAD, EOS, VOCAB = 0, 2, 48
PROMPTS = [[5, 6, 7], [8, 9]]
TOOL = slice(2, 4)  # the tool turn's columns in the first sample's response
RESPONSES = [[11, 12, 30, 31, 13, EOS], [14, 15, EOS]]
LOSS = [[1, 1, 0, 0, 1, 1], [1, 1, 1]]


def trajectories(loss_masks: list[list[int]]) -> list[Trajectory]:
    return [Trajectory(prompt_ids=p, response_ids=r, loss_mask=m, rollout_log_probs=[-0.5 * k for k in m],
                       policy_version=[3] * len(r), prompt_index=i)
            for i, (p, r, m) in enumerate(zip(PROMPTS, RESPONSES, loss_masks))]


def two_masks() -> RolloutBatch:
    return batch_from_trajectories(trajectories(LOSS), PAD)


def one_turn() -> RolloutBatch:
    """The same tokens, all the model's: both masks all ones (a single-turn batch)."""
    return batch_from_trajectories(trajectories([[1] * len(r) for r in RESPONSES]), PAD)


def training_batch(out: RolloutBatch) -> dict:
    prompts = [SimpleNamespace(index=10 + i, record=SimpleNamespace(data_source="arith", ground_truth=str(i),
                                                                    extra_info={}, prompt=""))
               for i in range(len(PROMPTS))]
    return batching.to_training_batch(out, prompts, torch.device("cpu"))


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=VOCAB,
                                        max_position_embeddings=64)).eval()


def test_a_trajectory_batch_attends_to_every_token_and_trains_on_the_models():
    b = two_masks()
    assert b.response_attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]]
    assert b.attention_mask[:, b.prompt_width:].tolist() == b.response_attention_mask.tolist()
    assert b.position_ids[0].tolist() == list(range(9))  # no gap where the tool turn is
    assert b.response_lengths.tolist() == [6, 3]  # the whole continuation
    assert b.rollout_log_probs[0, TOOL].tolist() == [0.0, 0.0]
    assert b.policy_version.tolist() == [[3] * 6, [3, 3, 3, -1, -1, -1]]
    batch = training_batch(b)
    assert torch.equal(batch["response_attention_mask"], b.response_attention_mask)
    assert torch.equal(batch["response_mask"], b.response_mask)
    assert torch.equal(batch["policy_version"], b.policy_version)
    assert batch["seq_tokens"].tolist() == [9, 5]
    with pytest.raises(ValueError, match="inside response_attention_mask"):  # a loss token nobody attends to
        assemble_batch(prompt_ids=b.prompt_ids, prompt_mask=b.prompt_mask, response_ids=b.response_ids,
                       response_mask=b.response_attention_mask, rollout_log_probs=b.rollout_log_probs,
                       prompt_index=b.prompt_index, response_attention_mask=b.response_mask)


def test_a_single_turn_batch_has_one_mask_and_is_stamped_by_its_source():
    b = batch_from_lists(PROMPTS, [RESPONSES[1], [14, EOS, 9]], [[-1.0] * 3] * 2, n=1, eos_token_ids=[EOS],
                         pad_token_id=PAD)
    assert torch.equal(b.response_attention_mask, b.response_mask)
    assert (b.policy_version == -1).all()  # an engine does not know the version
    assert b.stamped(7).policy_version.tolist() == [[7, 7, 7], [7, 7, -1]]

    class Engine:
        def generate(self, prompts, sampling):
            return b

    assert SingleTurnLoop(Engine()).run(PROMPTS, None) is b  # type: ignore[arg-type]  # the engine's batch as is


def test_forwards_attend_to_the_tool_turn():
    from hpcppo.models import compute_log_probs, row_lengths

    model = tiny_model()
    outs = []
    for out in (two_masks(), one_turn()):
        batch = training_batch(out)
        args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], out.response_width)
        outs.append(compute_log_probs(model, *args, micro_batch_size=2))
        # the token budget and padding removal count every attended token
        assert row_lengths(batch["attention_mask"], out.response_width)[1].tolist() == [6, 3]
    assert torch.equal(outs[0], outs[1])  # the model's tokens after the tool turn see it
    blind = training_batch(two_masks())
    blind["attention_mask"][:, 3:][:, TOOL] = 0  # a forward that took the loss mask
    lp = compute_log_probs(model, blind["input_ids"], blind["attention_mask"], blind["position_ids"], 6,
                           micro_batch_size=2)
    assert not torch.allclose(lp[0, 4:], outs[0][0, 4:])  # (so the comparison above can tell)


class Critic(torch.nn.Module):
    """A value per position: the tiny model's first logit."""

    def __init__(self) -> None:
        super().__init__()
        self.body = tiny_model(2)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.body(**inputs).logits[..., 0]


def _update_inputs(batch: dict, model: torch.nn.Module, garbage: bool) -> dict:
    """The tensors the losses read, with (``garbage``) nonsense under the tool turn of the first sample."""
    from hpcppo.models import compute_log_probs

    with torch.no_grad():
        lp = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 6,
                               micro_batch_size=2)
    g = torch.Generator().manual_seed(0)
    extra = {"old_log_probs": lp + 0.1 * torch.randn(lp.shape, generator=g),
             "advantages": torch.randn(lp.shape, generator=g), "values": torch.randn(lp.shape, generator=g),
             "returns": torch.randn(lp.shape, generator=g), "ref_log_probs": lp - 0.2}
    if garbage:
        for key in extra:
            extra[key][0, TOOL] = torch.tensor([50.0, -70.0])
    return batch | extra


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_losses_and_their_denominators_ignore_the_tool_turn(agg):
    from hpcppo.models import forward_log_probs

    batch = training_batch(two_masks())
    assert batching.global_batch_info(batch["response_mask"], 1, 6).batch_num_tokens == 7  # 4 + 3 model tokens
    results = []
    for garbage in (False, True):
        actor, critic = tiny_model(1), Critic()
        mb = _update_inputs(batch, actor, garbage)
        info = batching.global_batch_info(mb["response_mask"], 1, 6)
        cfg = ActorSection(loss_agg_mode=agg, entropy_coeff=0.01, use_kl_loss=True)
        losses = []
        for fn, model in ((actor_loss(actor, cfg, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=True,
                                      temperature=0.2), actor),
                          (critic_loss(critic, CriticSection(loss_agg_mode=agg)), critic)):
            sums = batching.UpdateMetrics()
            loss = fn(mb, info, sums, 1)
            loss.backward()
            losses.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
            # The entropy depends on no input under the tool turn: compared with its definition (at a low
            # temperature, where the tokens' entropies differ enough to tell the masks apart).
            if model is actor:
                entropy = forward_log_probs(actor, mb["input_ids"], mb["attention_mask"], mb["position_ids"], 6,
                                            temperature=0.2, with_entropy=True)[1]
                assert entropy is not None
                want = {m: float(algos.agg_loss(entropy.detach(), mb[m], agg, batch_info=info))
                        for m in ("response_mask", "response_attention_mask")}
                got = sums.reduce()["actor/entropy"]
                assert got == pytest.approx(want["response_mask"], rel=1e-5)
                assert got != pytest.approx(want["response_attention_mask"], rel=1e-3)
        results.append(losses)
    for (clean, clean_grads), (noisy, noisy_grads) in zip(*results):
        assert torch.allclose(clean, noisy, atol=1e-6)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(clean_grads, noisy_grads))


def _trainer(estimator: str):
    from hpcppo.train.trainer import PhaseTimer, Trainer
    from hpcppo.watchdog import TrainingState

    trainer = Trainer.__new__(Trainer)  # only the phases under test: score and compute_advantages
    texts: list = []

    def score_fn(sources, decoded, truths, extras, preds=None, lengths=None, penalties=None):
        texts.append((decoded, lengths))
        return [1.0, 0.0]

    tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [
        " ".join(str(t) for t in row if t not in (PAD, EOS)) for row in ids.tolist()])
    trainer.c = SimpleNamespace(reward_model=None, tokenizer=tokenizer, score_fn=score_fn,
                                kl_ctrl=SimpleNamespace(next_coef=lambda coef, kl, n: coef))
    trainer.cfg = SimpleNamespace(reward_manager=RewardManagerSection(), data=SimpleNamespace(max_response_length=6),
                                  algorithm=AlgorithmSection(adv_estimator=estimator, kl_penalty="kl"))
    trainer.plan = SimpleNamespace(kl_penalty_in_reward=True)
    trainer.env = SimpleNamespace(rank=0)
    trainer.state, trainer.timer = TrainingState(kl_coef=0.1), PhaseTimer()
    return trainer, texts


def test_scoring_reads_the_whole_continuation():
    trainer, texts = _trainer("gae")
    batch = training_batch(two_masks())
    scored, _ = trainer.score(batch)
    assert texts == [(["11 12 30 31 13", "14 15"], [6, 3])]  # the tool turn's text and length count
    assert scored["token_level_scores"].tolist()[0] == [0, 0, 0, 0, 0, 1.0]  # on the last token, EOS


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_advantages_whitening_and_the_kl_penalty_ignore_the_tool_turn(estimator):
    out = []
    for garbage in (False, True):
        trainer, _ = _trainer(estimator)
        batch = training_batch(two_masks())
        batch |= trainer.score(batch)[0]
        batch = _update_inputs(batch, tiny_model(), garbage)
        if estimator == "grpo":
            del batch["values"]
        mine, metrics, tokens = trainer.compute_advantages(batch)
        out.append((mine, metrics))
        assert tokens == 14
    (clean, clean_metrics), (noisy, noisy_metrics) = out
    mask = training_batch(two_masks())["response_mask"].bool()
    for key in ("advantages", "returns", "token_level_rewards"):
        assert torch.allclose(clean[key][mask], noisy[key][mask], atol=1e-6), key
    for key in ("advantages/mean", "advantages/std", "returns/mean", "kl/actor_ref", "reward/mean"):
        assert clean_metrics[key] == pytest.approx(noisy_metrics[key], abs=1e-6), key
    assert clean_metrics["response/length_mean"] == 4.5  # (6 + 3) / 2: the whole continuation
    assert clean_metrics["response/length_max"] == 6
    assert clean_metrics["response/clip_ratio"] == 0.5  # 6 >= max_response_length 6
    if estimator == "gae":  # whitened over the model's tokens
        assert algos.masked_mean(clean["advantages"], mask.long()).abs() < 1e-5


# ---------------------------------------------------------------- a hand-built 3-turn trajectory (issue 34)
# prompt, then: assistant [11, 12], tool [30, 31, 32], assistant [13], tool [33, 34], assistant [14, EOS]
P3 = [5, 6, 7]
TURNS = [([11, 12], 1), ([30, 31, 32], 0), ([13], 1), ([33, 34], 0), ([14, EOS], 1)]
R3 = [t for ids, _ in TURNS for t in ids]
M3 = [m for ids, m in TURNS for _ in ids]


def test_three_turns_masks_positions_log_probs_and_loss_by_hand():
    from hpcppo.models import compute_log_probs

    model = tiny_model(3)
    with torch.no_grad():  # by hand: one forward of the unpadded sequence, log-softmax at the previous position
        full = torch.tensor([P3 + R3])
        logits = model(input_ids=full).logits[0].float()
        by_hand = torch.log_softmax(logits, -1)[len(P3) - 1:-1].gather(-1, torch.tensor(R3)[:, None])[:, 0]
    sampled = [float(by_hand[j]) if m else 0.0 for j, m in enumerate(M3)]
    # a second, shorter sample left pads the prompt and right pads the response
    out = batch_from_trajectories([Trajectory(prompt_ids=P3, response_ids=R3, loss_mask=M3, rollout_log_probs=sampled,
                                              policy_version=[4] * len(R3), prompt_index=0),
                                   Trajectory(prompt_ids=[9], response_ids=[15, EOS], loss_mask=[1, 1],
                                              rollout_log_probs=[-1.0, -2.0], policy_version=[4, 4], prompt_index=1)],
                                  PAD)
    assert out.response_mask[0].tolist() == M3 and out.response_attention_mask[0].tolist() == [1] * 10
    assert out.response_mask[1].tolist() == [1, 1] + [0] * 8
    assert out.position_ids[0].tolist() == list(range(13))  # prompt and every turn: one run of positions
    assert out.position_ids[1, out.prompt_width - 1:out.prompt_width + 2].tolist() == [0, 1, 2]
    batch = batching.to_training_batch(out, [SimpleNamespace(index=i, record=None) for i in range(2)],
                                       torch.device("cpu"))
    with torch.no_grad():
        lp = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 10,
                               micro_batch_size=2)
    assert torch.allclose(lp[0], by_hand, atol=1e-5)  # aligned: column j is response token j's log-prob
    assert torch.allclose(lp[0] * out.response_mask[0], out.rollout_log_probs[0], atol=1e-5)
    assert out.rollout_log_probs[0].tolist() == pytest.approx(sampled)

    # the PPO loss (token-mean, clip 0.2) against its hand computation over the five model tokens
    g = torch.Generator().manual_seed(1)
    old = lp + 0.3 * torch.randn(lp.shape, generator=g)
    adv = torch.randn(lp.shape, generator=g)
    mb = batch | {"old_log_probs": old, "advantages": adv}
    info = batching.global_batch_info(mb["response_mask"], 1, 2)
    assert info.batch_num_tokens == 7  # 5 + 2 model tokens: no tool token counts
    loss = actor_loss(model, ActorSection(loss_agg_mode="token-mean", entropy_coeff=0.0),
                      clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0)(
        mb, info, batching.UpdateMetrics(), 1)
    ratio = torch.exp(lp - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    mask = out.response_mask.float()
    want = (per_token * mask).sum() / mask.sum()
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
