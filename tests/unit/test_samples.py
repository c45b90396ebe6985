"""Sample trajectories (issue 34, point 5): the trainer's rank 0 writes ``samples/step-N.jsonl`` after the reward
phase (``trainer.log_samples`` rows, turns marked model or tool from the two masks), ``hpcppo samples`` prints them
with the tool turns marked, and ``hpcppo metrics summary`` shows a multi-turn run's tool metrics."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpcppo.analysis.samples import MARKS, format_samples, load_samples
from hpcppo.analysis.summary import summarize_target
from hpcppo.analysis.targets import resolve_target
from hpcppo.cli import main
from hpcppo.data.dataset import PromptRecord
from hpcppo.errors import PathError, RunStateError
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir.paths import RunPaths
from hpcppo.train import samples
from hpcppo.train.trainer import PhaseTimer, Trainer

from test_analysis_summary import compiled_run

PAD = 0


class CharTokenizer:
    """Token t is the character chr(ord('a') + t - 1); 0 pads."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + t - 1) for t in ids)


def _batch(rows: int = 4) -> dict:
    """Rows of prompt "ab" (left padded) and a response: model "cd", tool "xyz", model "e", then padding."""
    prompt = [[PAD, 1, 2]] * rows
    response = [[3, 4, 24, 25, 26, 5, PAD, PAD]] * rows
    attention = [[1, 1, 1, 1, 1, 1, 0, 0]] * rows
    loss = [[1, 1, 0, 0, 0, 1, 0, 0]] * rows
    scores = torch.zeros(rows, 8)
    scores[:, 5] = torch.arange(rows, dtype=torch.float32)
    return {
        "input_ids": torch.tensor([p + r for p, r in zip(prompt, response)]),
        "attention_mask": torch.tensor([[0, 1, 1] + a for a in attention]),
        "responses": torch.tensor(response), "response_attention_mask": torch.tensor(attention),
        "response_mask": torch.tensor(loss), "token_level_scores": scores,
        "records": [PromptRecord("arith", [{"role": "user", "content": "?"}], str(i)) for i in range(rows)]}


def test_turns_follow_the_two_masks():
    assert samples.turns([3, 4, 24, 25, 5, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 1, 0]) == [
        ("model", [3, 4]), ("tool", [24, 25]), ("model", [5])]
    assert samples.turns([3, 4, 0], [1, 1, 0], [1, 1, 0]) == [("model", [3, 4])]  # single turn: one model turn


def test_the_writer_spreads_rows_and_marks_turns(tmp_path):
    batch = _batch() | {"tool_calls": torch.tensor([1, 1, 1, 1]), "num_turns": [3, 3, 3, 3],
                        "tool_rewards": [[0.0], [0.1], [0.2], [-0.05]],
                        "tool_scores": [{"calc": 1.0}, {"calc": 0.0}, {"calc": 1.0}, {"calc": 0.5}]}
    path = samples.write_samples(tmp_path, 7, batch, CharTokenizer(), 2)
    assert path == RunPaths(tmp_path).sample_file(7) and path.name == "step-7.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["row"] for r in rows] == [0, 2]  # spread over the batch: two prompts rather than one's samples
    r = rows[1]
    assert r["prompt"] == "ab" and r["reward"] == 2.0 and r["ground_truth"] == "2" and r["step"] == 7
    assert r["turns"] == [{"role": "model", "text": "cd", "tokens": 2}, {"role": "tool", "text": "xyz", "tokens": 3},
                          {"role": "model", "text": "e", "tokens": 1}]
    assert (r["response_tokens"], r["model_tokens"], r["tool_calls"], r["num_turns"]) == (6, 3, 1, 3)
    assert r["tool_rewards"] == [0.2] and r["tool_scores"] == {"calc": 1.0}  # what reached the reward function
    shown = format_samples("run", 7, rows)
    assert "tool rewards [0.2], end-of-trajectory tool scores {'calc': 1.0}" in shown
    assert samples.write_samples(tmp_path, 8, _batch(), CharTokenizer(), 0) is None
    assert not RunPaths(tmp_path).sample_file(8).exists()


def _trainer(tmp_path: Path, *, rank: int, log_samples: int) -> Trainer:
    """A Trainer with every phase but the reward's sample hook stubbed: what train_step does between them."""
    t = Trainer.__new__(Trainer)
    t.c = SimpleNamespace(run_dir=tmp_path, tokenizer=CharTokenizer(), critic=None)
    t.cfg = SimpleNamespace(trainer=SimpleNamespace(log_samples=log_samples, test_freq=0),
                            critic=SimpleNamespace(warmup_updates=0))
    t.env = SimpleNamespace(rank=rank)
    t.state = SimpleNamespace(step=3, branch=0)
    t.timer = PhaseTimer()
    t.inject = SimpleNamespace(before_step=lambda *a: None, on_row=lambda step, branch, metrics: metrics)
    t.recovery = SimpleNamespace(last_checkpoint_s=None)
    t.source_metrics = {}  # what the real rollout() sets: the source's metrics (none colocated single-turn)
    t.rollout = lambda: {k: v for k, v in _batch().items() if k != "token_level_scores"}
    t.score = lambda batch: ({"token_level_scores": _batch()["token_level_scores"]}, {})
    t.old_log_probs_ref_and_values = lambda batch: {}
    t.compute_advantages = lambda batch: ({}, {}, 1)
    t.check_sync = lambda metrics: None
    t.update_actor = lambda batch: {}
    t.peak_memory_gb = lambda: 0.0
    return t


@pytest.mark.parametrize("rank, log_samples, written", [(0, 2, 2), (1, 2, 0), (0, 0, 0)])
def test_the_trainer_writes_samples_after_the_reward_on_rank_0(tmp_path, rank, log_samples, written):
    _trainer(tmp_path, rank=rank, log_samples=log_samples).train_step()
    path = RunPaths(tmp_path).sample_file(3)
    assert (len(path.read_text().splitlines()) if path.exists() else 0) == written
    if written:
        assert json.loads(path.read_text().splitlines()[0])["reward"] == 0.0  # scored: after the reward phase


@pytest.fixture
def run_with_samples(tmp_path) -> Path:
    run = compiled_run(tmp_path / "runs")
    for step in (1, 2, 3, 5):
        samples.write_samples(run, step, _batch(), CharTokenizer(), 2)
    return run


def test_samples_command_marks_tool_turns(run_with_samples, capsys):
    root = ["--runs-root", str(run_with_samples.parent)]
    assert main(["samples", run_with_samples.name, *root]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run_with_samples.name}, step 5: 2 samples")  # the newest step by default
    assert "[model] cd\n[TOOL]  xyz\n[model] e" in out and "[prompt] ab" in out
    assert "2 model turns, 1 tool turn" in out
    assert main(["samples", run_with_samples.name, "--step", "2", "--json", *root]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step"] == 2 and [t["role"] for t in data["samples"][0]["turns"]] == ["model", "tool", "model"]


def test_samples_refusals_are_one_line(run_with_samples, tmp_path, capsys):
    run = RunPaths(run_with_samples)
    with pytest.raises(RunStateError, match="no samples for step 4; steps with samples: 1-3, 5"):
        load_samples(run, 4)
    run.sample_file(5).write_text('{"turns": []}\n{oops\n')
    with pytest.raises(PathError, match="line 2 is not JSON"):
        load_samples(run, 5)
    empty = compiled_run(tmp_path / "other")
    capsys.readouterr()
    assert main(["samples", str(empty)]) == RunStateError.exit_code
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("hpcppo: error: ") and "no samples yet" in line


def test_format_puts_every_line_of_a_turn_under_its_mark():
    text = format_samples("r", 1, [{"row": 0, "turns": [{"role": "tool", "text": "a\nb"}], "prompt": "p"}])
    assert f"{MARKS['tool']} a\n{' ' * (len(MARKS['tool']) + 1)}b" in text


def test_metrics_summary_shows_the_tool_metrics(tmp_path):
    run = compiled_run(tmp_path / "runs")
    cols = ("reward/mean", "rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_errors", "time/tool_s",
            "rollout/tool_calls/calculator", "rollout/tool_failures/calculator", "actor/entropy")
    with MetricsWriter(run, cols, attempt=0) as w:
        for step in range(1, 4):
            w.log(step, {c: float(step) for c in cols})
    names = list(summarize_target(resolve_target(str(run), lambda: tmp_path))["metrics"])
    assert names == ["reward/mean", "actor/entropy", "rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_errors",
                     "time/tool_s", "rollout/tool_calls/calculator", "rollout/tool_failures/calculator"]
