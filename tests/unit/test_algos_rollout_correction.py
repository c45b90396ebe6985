"""Rollout correction (hpcppo.algos.rollout_correction) against hand computations of verl's documented formulas
(verl b178a3c, verl/trainer/ppo/rollout_corr_helper.py, docs/algo/rollout_corr.md)."""

from __future__ import annotations

import math

import pytest
import torch

from hpcppo import rollout_corr
from hpcppo.algos import rollout_correction as rc

# Two sequences of 3 tokens, the second with 2 valid ones; log r = log pi_train - log pi_rollout.
LR = torch.tensor([[0.1, -0.3, 1.0], [0.5, 0.2, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]], dtype=torch.float64)
OLD = ROLLOUT + LR


def _correct(**kw):
    return rc.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, **kw)


def test_token_weights_are_truncated_ratios_zero_on_padding():
    w, mask, m = _correct(rollout_is="token", rollout_is_threshold=2.0)
    ratio = [[math.exp(0.1), math.exp(-0.3), math.exp(1.0)], [math.exp(0.5), math.exp(0.2), 0.0]]
    want = torch.tensor([[min(r, 2.0) for r in row] for row in ratio], dtype=torch.float64)
    assert torch.allclose(w, want)
    assert torch.equal(mask, MASK)  # no rejection asked
    valid = [math.exp(x) for x in (0.1, -0.3, 1.0, 0.5, 0.2)]
    # metrics are of the weights before truncation
    assert m["rollout_corr/rollout_is_mean"].item() == pytest.approx(sum(valid) / 5)
    assert m["rollout_corr/rollout_is_max"].item() == pytest.approx(math.e)
    assert m["rollout_corr/rollout_is_min"].item() == pytest.approx(math.exp(-0.3))
    assert m["rollout_corr/rollout_is_ratio_fraction_high"].item() == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"].item() == pytest.approx(0.0)
    clamped = [min(max(v, 0.5), 2.0) for v in valid]
    mean = sum(clamped) / 5
    assert m["rollout_corr/rollout_is_std"].item() == pytest.approx(
        math.sqrt(sum(c * c for c in clamped) / 5 - mean**2))
    assert m["rollout_corr/rollout_is_eff_sample_size"].item() == pytest.approx(
        1 / (sum((c / (mean + 1e-8)) ** 2 for c in clamped) / 5))
    seq = [sum(valid[:3]) / 3, sum(valid[3:]) / 2]
    assert m["rollout_corr/rollout_is_seq_mean"].item() == pytest.approx(sum(seq) / 2)
    assert m["rollout_corr/rollout_is_seq_max_deviation"].item() == pytest.approx(max(abs(s - 1) for s in seq))
    assert w.requires_grad is False


def test_sequence_weights_are_the_truncated_product_and_batch_normalised():
    w, _, m = _correct(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    s0, s1 = math.exp(0.1 - 0.3 + 1.0), math.exp(0.5 + 0.2)  # the padded 7.0 is not in the product
    t0, t1 = min(s0, 2.0), min(s1, 2.0)
    norm = (t0 + t1) / 2  # mean over non-empty sequences of each one's weight
    want = torch.tensor([[t0 / norm] * 3, [t1 / norm, t1 / norm, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, want)
    assert m["rollout_corr/rollout_is_batch_norm_factor"].item() == pytest.approx(norm)
    assert m["rollout_corr/rollout_is_max"].item() == pytest.approx(max(s0, s1))
    assert m["rollout_corr/rollout_is_ratio_fraction_high"].item() == pytest.approx(
        sum(x > math.log(2.0) for x in (0.8, 0.7)) / 2)


def test_batch_normalisation_over_ranks_uses_the_callers_sum():
    # Two identical ranks: summing over ranks doubles both sums; the result is the whole batch's normalisation.
    both = torch.cat([OLD, OLD]), torch.cat([ROLLOUT, ROLLOUT]), torch.cat([MASK, MASK])
    for level in ("token", "sequence"):
        whole, _, _ = rc.compute_rollout_correction_and_rejection_mask(*both, rollout_is=level,
                                                                       rollout_is_batch_normalize=True)
        mine, _, m = _correct(rollout_is=level, rollout_is_batch_normalize=True, all_reduce_sum=lambda t: t * 2)
        assert torch.allclose(mine, whole[:2], atol=1e-7)
        alone, _, _ = _correct(rollout_is=level, rollout_is_batch_normalize=True, all_reduce_sum=lambda t: t)
        assert torch.allclose(alone, mine, atol=1e-7)  # one rank, or two alike: the same normalisation


def test_token_k1_keeps_tokens_whose_minus_log_ratio_is_within_the_log_bounds():
    _, mask, m = _correct(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    lo, hi = math.log(0.6), math.log(1.6)
    keep = [[lo <= -x <= hi for x in row] for row in LR.tolist()]
    want = torch.tensor(keep, dtype=torch.float64) * MASK
    assert torch.equal(mask, want)  # -1.0 (r = e) is rejected: -log r = -1 < log 0.6
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"].item() == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_rs_token_k1_seq_masked_fraction"].item() == pytest.approx(1 / 2)
    assert m["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"].item() == pytest.approx(1 / 2)
    assert m["rollout_corr/rollout_rs_token_k1_mean"].item() == pytest.approx(-(0.1 - 0.3 + 1.0 + 0.5 + 0.2) / 5)
    assert m["rollout_corr/rollout_rs_token_k1_fraction_low"].item() == pytest.approx(1 / 5)


def test_a_single_k1_threshold_is_the_upper_ratio_and_its_reciprocal():
    assert rollout_corr.parse_rollout_rs_thresholds(("seq_mean_k1",), 2.0) == {"seq_mean_k1": (0.5, 2.0)}
    _, a, _ = _correct(rollout_rs="seq_mean_k1", rollout_rs_threshold=2.0)
    _, b, _ = _correct(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.5_2.0")
    assert torch.equal(a, b)


def test_sequence_options_reject_whole_sequences_and_options_combine_with_and():
    k2 = 0.5 * LR**2
    k3 = torch.exp(LR) - 1 - LR
    seq_sum_k2 = [(k2[0] * MASK[0]).sum().item(), (k2[1] * MASK[1]).sum().item()]
    seq_mean_k3 = [(k3[0] * MASK[0]).sum().item() / 3, (k3[1] * MASK[1]).sum().item() / 2]
    seq_max_k3 = [k3[0].max().item(), k3[1, :2].max().item()]  # padding ignored
    assert seq_sum_k2[0] > 0.3 > seq_sum_k2[1]
    _, mask, m = _correct(rollout_rs="seq_sum_k2", rollout_rs_threshold=0.3)
    assert torch.equal(mask, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=torch.float64))
    assert m["rollout_corr/rollout_rs_seq_sum_k2_max"].item() == pytest.approx(seq_sum_k2[0])
    assert m["rollout_corr/rollout_rs_seq_sum_k2_seq_fraction_high"].item() == pytest.approx(0.5)
    # seq statistics are reported per token too: the token mean weighs sequences by their length
    assert m["rollout_corr/rollout_rs_seq_sum_k2_mean"].item() == pytest.approx((3 * seq_sum_k2[0] + 2 * seq_sum_k2[1]) / 5)
    _, mask, _ = _correct(rollout_rs="seq_mean_k3", rollout_rs_threshold=seq_mean_k3[1] + 1e-9)
    assert torch.equal(mask, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=torch.float64))
    _, mask, _ = _correct(rollout_rs="seq_max_k3", rollout_rs_threshold=seq_max_k3[1] + 1e-9)
    assert torch.equal(mask, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=torch.float64))
    # token_k2 rejects the 1.0 token only; with seq_max_k3 at a loose bound the AND keeps that verdict
    _, mask, m = _correct(rollout_rs="token_k2,seq_max_k3", rollout_rs_threshold="0.4,100")
    assert torch.equal(mask, torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float64))
    assert m["rollout_corr/rollout_rs_seq_max_k3_masked_fraction"].item() == 0.0
    assert "rollout_corr/rollout_rs_token_k2_seq_fraction_low" not in m  # only k1 options have a lower bound


def test_threshold_specs_are_checked_like_verls():
    parse = rollout_corr.parse_rollout_rs_thresholds
    assert parse(("token_k1", "seq_max_k2"), "0.6_1.6,2.5") == {"token_k1": (0.6, 1.6), "seq_max_k2": (None, 2.5)}
    assert parse(("token_k2", "seq_sum_k3"), 0.5) == {"token_k2": (None, 0.5), "seq_sum_k3": (None, 0.5)}
    for options, spec in ((("token_k2",), "0.1_0.2"), (("token_k1", "token_k2", "token_k3"), "1,2"),
                          (("token_k2",), "-1"), (("token_k2",), None), (("token_k1",), "x")):
        with pytest.raises(ValueError):
            parse(options, spec)
    assert rollout_corr.parse_rollout_rs("token_k1, token_k1,seq_max_k2") == ("token_k1", "seq_max_k2")
    with pytest.raises(ValueError, match="seq_max_k1"):
        rollout_corr.parse_rollout_rs("seq_max_k1")
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        _correct(rollout_rs="token_k2")


def test_offpolicy_metrics_by_hand():
    _, _, m = _correct()
    assert set(m) == {rollout_corr.PREFIX + n for n in rollout_corr.offpolicy_metric_names()}
    valid = [0.1, -0.3, 1.0, 0.5, 0.2]
    assert m["rollout_corr/kl"].item() == pytest.approx(-sum(valid) / 5)
    assert m["rollout_corr/k3_kl"].item() == pytest.approx(sum(math.exp(x) - x - 1 for x in valid) / 5)
    assert m["rollout_corr/chi2_token"].item() == pytest.approx(sum(math.exp(2 * x) for x in valid) / 5 - 1)
    assert m["rollout_corr/chi2_seq"].item() == pytest.approx((math.exp(2 * 0.8) + math.exp(2 * 0.7)) / 2 - 1)
    mt = [(OLD[0] * MASK[0]).sum().item() / 3, (OLD[1] * MASK[1]).sum().item() / 2]
    mr = [(ROLLOUT[0] * MASK[0]).sum().item() / 3, (ROLLOUT[1] * MASK[1]).sum().item() / 2]
    assert m["rollout_corr/training_ppl"].item() == pytest.approx(sum(math.exp(-x) for x in mt) / 2)
    assert m["rollout_corr/rollout_log_ppl"].item() == pytest.approx(-sum(mr) / 2)
    diffs = [r - t for r, t in zip(mr, mt)]
    assert m["rollout_corr/log_ppl_diff"].item() == pytest.approx(sum(diffs) / 2)
    assert m["rollout_corr/ppl_ratio"].item() == pytest.approx(sum(math.exp(d) for d in diffs) / 2)


def test_metric_names_match_what_the_function_reports():
    for kw in ({"rollout_is": "token"}, {"rollout_is": "sequence", "rollout_is_batch_normalize": True},
               {"rollout_rs": "token_k1,seq_mean_k3,seq_max_k2", "rollout_rs_threshold": "2,0.1,0.1"},
               {"rollout_is": "token", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2"}):
        _, _, m = _correct(**kw)
        names = rollout_corr.metric_names(kw.get("rollout_is"), kw.get("rollout_is_batch_normalize", False),
                                          kw.get("rollout_rs"))
        assert sorted(m) == sorted(names) and len(names) == len(set(names))
        assert all(v.dim() == 0 for v in m.values())


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="rollout_is"):
        _correct(rollout_is="geometric")
    with pytest.raises(ValueError, match="shape"):
        rc.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT[:, :2], MASK)
    with pytest.raises(ValueError, match="at least one valid token"):
        rc.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, torch.zeros_like(MASK))
    with pytest.raises(ValueError, match="positive"):
        _correct(rollout_is="token", rollout_is_threshold=0.0)
