"""Validation at n responses per prompt: verl's statistics (mean@n, std@n, best@k, worst@k, maj@k with its
bootstrap), their column names, the scorers' preds and the import of verl's val_kwargs."""

from __future__ import annotations

import numpy as np
import pytest

from hpcppo.verl.importer import read_command_line, translate
from hpcppo.data.rewards import NO_PRED, build_reward_fn, score_batch
from hpcppo.rundir import metric_names
from hpcppo.train.validation import majority_value, prompt_stats, validation_metrics

# Golden values: verl b178a3c, verl/trainer/ppo/metric_utils.py, process_validation_metrics(data_sources,
# sample_uids, {"reward": SCORES, "pred": PREDS}) with its default seed 42, run once on these inputs.
SOURCES = ["a"] * 8 + ["b"] * 4
UIDS = [0] * 4 + [1] * 4 + [2] * 4
SCORES = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.25, 0.75, 0.0, 1.0]
PREDS = ["7", "3", "7", "3", "1", "2", "9", "9", "", "x", "", "x"]
VERL = {
    "a": {"mean@4": 0.4375, "std@4": 0.4572890493972125, "best@2/mean": 0.675, "best@2/std": 0.41234445918809487,
          "worst@2/mean": 0.20124999999999998, "worst@2/std": 0.3651372561759178, "maj@2/mean": 0.4395,
          "maj@2/std": 0.4557940907225738, "best@4/mean": 0.86825, "best@4/std": 0.2723156758515443,
          "worst@4/mean": 0.04525, "worst@4/std": 0.18026735186343568, "maj@4/mean": 0.46725,
          "maj@4/std": 0.4593420654890475},
    "b": {"mean@4": 0.5, "std@4": 0.39528470752104744, "best@2/mean": 0.718, "best@2/std": 0.3320030120345296,
          "worst@2/mean": 0.274, "worst@2/std": 0.31670017366588227, "maj@2/mean": 0.49575,
          "maj@2/std": 0.39312140300421194, "best@4/mean": 0.89275, "best@4/std": 0.1925095776838129,
          "worst@4/mean": 0.11575, "worst@4/std": 0.19884526018992757, "maj@4/mean": 0.49325,
          "maj@4/std": 0.3887697744166848},
}
# The same function on one prompt of 3 scores and no pred (no maj@k), sizes 2 and 3.
VERL_3 = {"mean@3": 0.5, "std@3": 0.408248290463863, "best@2/mean": 0.715, "best@2/std": 0.34463749070581395,
          "worst@2/mean": 0.27, "worst@2/std": 0.3451086785347479, "best@3/mean": 0.8325,
          "best@3/std": 0.2714659278804616, "worst@3/mean": 0.165, "worst@3/std": 0.27977669667075566}


def test_statistics_equal_verls_process_validation_metrics():
    got = validation_metrics(SOURCES, UIDS, SCORES, PREDS)
    assert got.keys() == VERL.keys()
    for src, stats in VERL.items():
        assert list(got[src]) == list(stats)  # verl's names, in verl's order
        assert got[src] == pytest.approx(stats, abs=1e-12)
    three = validation_metrics(["c"] * 3, [5] * 3, [0.0, 1.0, 0.5], [NO_PRED] * 3)
    assert three == {"c": pytest.approx(VERL_3, abs=1e-12)}


def test_the_bootstrap_leaves_numpys_global_generator_alone():
    np.random.seed(1)
    expected = np.random.rand()
    np.random.seed(1)
    prompt_stats([0.0, 1.0, 1.0, 0.0], ["1", "2", "1", "2"])
    assert np.random.rand() == expected


def test_majority_vote_ties_go_to_the_answer_seen_first():
    # verl's calc_maj_val: the most frequent pred, the score of its first occurrence; a tie keeps the first seen.
    assert majority_value([0.0, 1.0, 0.5, 1.0], ["a", "b", "a", "b"]) == 0.0
    assert majority_value([0.0, 1.0, 0.5, 1.0], ["b", "a", "a", "c"]) == 1.0
    assert majority_value([0.3, 0.7], [None, None]) == 0.3  # None is an answer like any other


def test_one_response_per_prompt_has_no_statistics_and_no_pred_no_majority():
    assert prompt_stats([1.0]) == {}
    assert not any(k.startswith("maj") for k in prompt_stats([1.0, 0.0], [NO_PRED, "1"]))


def test_column_names_are_verls_statistics_under_val_score():
    assert metric_names.bootstrap_sizes(1) == [] and metric_names.bootstrap_sizes(2) == [2]
    assert metric_names.bootstrap_sizes(5) == [2, 4, 5] and metric_names.bootstrap_sizes(8) == [2, 4, 8]
    assert list(VERL["a"]) == [s for s in metric_names.validation_stats(4)]
    assert metric_names.validation_columns(["arith"], 1) == ["val/score/arith"]
    cols = metric_names.trainer_columns(["openai/gsm8k"], 4)
    assert "val/score/openai/gsm8k/best@4/mean" in cols and "val/score/openai/gsm8k/maj@2/std" in cols
    assert all(metric_names.is_trainer_column(c) for c in cols)


def test_scorers_report_their_pred_for_the_majority_vote():
    preds: list = []
    scores = score_batch(build_reward_fn("auto"), ["hpcppo/arith", "hpcppo/arith", "openai/gsm8k"],
                         ["12", "the answer is 13", "#### 4"], ["12", "12", "4"], None, preds=preds)
    assert scores == [1.0, 0.0, 1.0]
    assert preds == ["12", "13", NO_PRED]  # verl's gsm8k returns a number: no pred
    assert score_batch(build_reward_fn("arith"), ["hpcppo/arith"], ["x"], ["1"]) == [0.0]


def test_import_verl_translates_val_kwargs():
    settings, _ = read_command_line("python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.val_kwargs.n=8 "
                                    "actor_rollout_ref.rollout.val_kwargs.top_p=0.95 "
                                    "actor_rollout_ref.rollout.val_kwargs.temperature=0.6")
    imp = translate(settings)
    assert imp.values["rollout.val_n"] == 8 and imp.values["rollout.val_top_p"] == 0.95
    assert imp.values["rollout.val_temperature"] == 0.6
    assert not [r for r in imp.report if "val_kwargs" in r[1]]


def test_dapos_acc_columns_mirror_the_score_columns():
    """With DAPO's overlong buffer the trainer also declares val/acc/<source>[/<stat>] (verl's acc, the score
    before the penalty), and watchdog rules may name them."""
    plain = metric_names.validation_columns(["arith"], 4)
    both = metric_names.validation_columns(["arith"], 4, acc=True)
    assert both == plain + [c.replace("val/score/", "val/acc/", 1) for c in plain]
    assert "val/acc/arith/maj@4/mean" in metric_names.trainer_columns(["arith"], 4, acc=True)
    assert "val/acc/arith" not in metric_names.trainer_columns(["arith"], 4)
    assert metric_names.is_trainer_column("val/acc/arith") and not metric_names.is_trainer_column("val/acc/")

