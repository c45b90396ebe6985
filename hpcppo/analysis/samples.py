"""``hpcppo samples RUN [--step N]``: the sample trajectories the trainer wrote for a step (``samples/step-N.jsonl``,
:mod:`hpcppo.train.samples` writes them; ``trainer.log_samples`` rows per step), with each turn marked as the
model's or a tool's. No torch: a login-node command."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from hpcppo.errors import PathError, RunStateError
from hpcppo.rundir.paths import RunPaths

__all__ = ["load_samples", "format_samples", "MARKS"]

#: How each turn's role is shown in the text output: tool turns (a tool's answer and the template around it, no
#: loss) stand out from the model's.
MARKS = {"model": "[model]", "tool": "[TOOL] "}


def _ranges(steps: list[int]) -> str:
    """``1-5, 8, 10-12``: the (sorted) steps that have samples, short."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def load_samples(run: RunPaths, step: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(step, its samples): of ``step``, or of the newest step with samples.

    Raises:
        RunStateError: the run has no samples (none written yet, or ``trainer.log_samples = 0``), or none for
            ``step`` (the message names the steps that have them).
        PathError: the file is not sample lines (damaged, or not written by hpcppo).
    """
    files = run.sample_files()
    if not files:
        raise RunStateError(f"{run.run_id}: no samples yet ({run.samples} is empty or missing: no step done, or "
                            f"trainer.log_samples = 0)")
    if step is None:
        step = max(files)
    if step not in files:
        raise RunStateError(f"{run.run_id}: no samples for step {step}; steps with samples: {_ranges(sorted(files))}")
    path = files[step]
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PathError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    for n, line in enumerate(lines, 1):
        try:
            sample = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PathError(f"{path}: line {n} is not JSON ({exc.msg}); the file is damaged") from None
        if not isinstance(sample, dict) or not isinstance(sample.get("turns"), list):
            raise PathError(f"{path}: line {n} is not a sample (an object with turns); the file is damaged")
        out.append(sample)
    return step, out


def _counts(sample: dict[str, Any]) -> str:
    roles = [t.get("role") for t in sample["turns"]]
    parts = [f"{roles.count('model')} model turn{'s' * (roles.count('model') != 1)}",
             f"{roles.count('tool')} tool turn{'s' * (roles.count('tool') != 1)}"]
    if "tool_calls" in sample:
        parts.append(f"{sample['tool_calls']} tool call{'s' * (sample['tool_calls'] != 1)}")
    return ", ".join(parts)


def _block(mark: str, text: str) -> list[str]:
    """A turn's text under its mark, every line indented so that the mark stays the only thing in the margin."""
    lines = text.splitlines() or [""]
    return [f"{mark} {lines[0]}"] + [textwrap.indent(line, " " * (len(mark) + 1)) for line in lines[1:]]


def format_samples(run_id: str, step: int, samples: list[dict[str, Any]]) -> str:
    """The text of ``hpcppo samples``: per sample a header (row, data source, reward, turns), the prompt, then each
    turn under its mark (:data:`MARKS`)."""
    out = [f"{run_id}, step {step}: {len(samples)} sample{'s' * (len(samples) != 1)} (tool turns marked "
           f"{MARKS['tool'].strip()}: a tool's answer and its template, attended to, no loss)"]
    for i, s in enumerate(samples):
        reward = s.get("reward")
        shown = f"{reward:.4g}" if isinstance(reward, (int, float)) else str(reward)
        out += ["", f"--- sample {i}: row {s.get('row')}, {s.get('data_source')}, reward {shown}, ground truth "
                    f"{s.get('ground_truth')!r}; {_counts(s)}, {s.get('response_tokens')} response tokens"]
        if "tool_rewards" in s or "tool_scores" in s:  # what the tools gave the reward function
            out.append(f"tool rewards {s.get('tool_rewards', [])}, end-of-trajectory tool scores "
                       f"{s.get('tool_scores', {})}")
        out += _block("[prompt]", str(s.get("prompt", "")))
        for turn in s["turns"]:
            out += _block(MARKS.get(str(turn.get("role")), f"[{turn.get('role')}]"), str(turn.get("text", "")))
    return "\n".join(out)
