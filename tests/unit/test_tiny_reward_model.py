"""The tiny reward model (``hpcppo tools make-model --reward-out``): regressed onto the arith rule's score, so an arith
run scored by it learns what the rule rewards; read by the trainer's reward-model code; idempotent without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hpcppo.errors import PathError
from hpcppo.tiny.reward_model import RM_INFO_FILE, build_tiny_reward_model


@pytest.mark.slow
def test_the_tiny_reward_model_agrees_with_the_rule_and_loads_as_a_reward_model(tmp_path):
    from transformers import AutoTokenizer

    from hpcppo.data.rm_inputs import reward_model_ids
    from hpcppo.models.reward_model import build_reward_model, compute_rm_scores
    from hpcppo.train.reward_phase import right_pad

    info = build_tiny_reward_model(tmp_path / "rm", seed=0)
    held_out = info["held_out"]
    # measured: agreement 0.84, mean score 0.65 on right answers and 0.17 on wrong ones (seed 0, 300 steps)
    assert info["built"] and held_out["agreement"] >= 0.75, info
    assert held_out["score_mean_right"] - held_out["score_mean_wrong"] >= 0.3, info
    # the trainer's path: re-templated ids, last-token score; a right answer outscores a stray digit after it
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    model = build_reward_model(tmp_path / "rm")
    prompts = [[{"role": "user", "content": f"{a}+{b}="}] for a, b in ((12, 5), (7, 9), (3, 14))]
    right = [tok(str(a + b), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
             for a, b in ((12, 5), (7, 9), (3, 14))]
    wrong = [r[:-1] + tok("5", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in right]
    ids, _ = reward_model_ids(tok, tok, prompts * 2, right + wrong, max_length=64)
    scores = compute_rm_scores(model, *right_pad(ids, tok.pad_token_id, torch.device("cpu")), micro_batch_size=6)
    assert (scores[:3] > scores[3:]).sum() >= 2, scores
    # up to date: returned from its record, without importing torch
    code = ("import sys\nfrom hpcppo.tiny.reward_model import build_tiny_reward_model\n"
            "info = build_tiny_reward_model(sys.argv[1])\nassert info['built'] is False, info\n"
            "assert 'torch' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "rm")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "rm" / RM_INFO_FILE).is_file()


def test_a_foreign_directory_is_never_replaced(tmp_path):
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "mine.txt").write_text("keep")
    with pytest.raises(PathError, match="not a tiny reward-model build"):
        build_tiny_reward_model(tmp_path / "rm")
    assert (tmp_path / "rm" / "mine.txt").read_text() == "keep"
