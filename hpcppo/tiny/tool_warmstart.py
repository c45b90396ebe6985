"""The tool variant's warm start: teach the tiny model the calculator call format, and measure it with the tool.

A trajectory of the task (:mod:`hpcppo.data.arith_tool`), as the chat template renders it::

    <bos><|user|>123*456=<|assistant|><call>calculator(123*456)</call><eos><|tool|>56088<|assistant|>56088<eos>
    `------------ prompt ------------'`------ assistant turn (loss) ------'`-- tool turn --'`-- answer (loss) --'

The model cannot multiply 3-digit numbers (0.5M parameters, a few hundred steps); it can learn to copy: the
operands into the call, the tool's answer into its own. ``warm_start_calls`` trains on such trajectories (teacher
forcing, loss on the assistant turns only: the tool turn is attended to, as in the multi-turn rollout's loss mask)
with a fixed schedule to the end (see :mod:`.warmstart` for why no stopping rule). A fraction ``1 - call_fraction``
of them answer at once instead, with the product the model cannot compute: the warm-started model calls the tool
about half the time and guesses (wrongly) otherwise, so that what RL learns is to call it. Its rows are drawn from the same
operand range as the task with another seed: a held-out range (other numbers of digits) does not transfer to a
0.5M model. Its copying converges (greedy accuracy near the call rate); the calls it does not make are the
headroom RL takes.

``tool_accuracy`` runs the two turns as the rollout loop does (generate until the end token, parse the call in the
compact format, run the built-in calculator, append the tool turn as the chat template renders it, generate the
answer) and scores the response with the task's reward; with ``use_tool=False`` the response ends after the first
turn, as a run with the tool disabled does.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from hpcppo.agent.builtin import Calculator
from hpcppo.agent.parse import COMPACT_END, COMPACT_START, parse_calls
from hpcppo.data import arith_tool
from hpcppo.tiny.settings import CALCULATOR_NAME, TinySettings
from hpcppo.tiny.tokenizer import encode_prompts, prompt_text
from hpcppo.tiny.warmstart import _optimizer, _sft_step

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["call_text", "tool_turn_text", "tool_supervised_batch", "warm_start_calls", "tool_accuracy"]

_SENTINEL = "7"  # a character the template does not write itself
_SEED_OFFSET = 5_000_011  # the warm start's rows: the task's range, not train.parquet's draws


def call_text(row: dict[str, Any]) -> str:
    """The assistant turn that calls the calculator on the row's problem: ``<call>calculator(123*456)</call>``."""
    a, b = row["extra_info"]["operands"]
    return f"{COMPACT_START}{CALCULATOR_NAME}({a}*{b}){COMPACT_END}"


def tool_turn_text(tokenizer: PreTrainedTokenizerFast, result: str) -> str:
    """The tool turn and the next assistant marker, as the chat template renders them after a user turn (what a
    conversation gains from the tool message, verl's way of rendering one turn alone)."""
    before = [{"role": "user", "content": "x"}]
    rendered = str(tokenizer.apply_chat_template(before + [{"role": "tool", "content": result}],
                                                 add_generation_prompt=True, tokenize=False))
    head = str(tokenizer.apply_chat_template(before, tokenize=False))
    if not rendered.startswith(head):
        raise ValueError("the chat template renders a conversation's start differently once a tool turn follows")
    return rendered[len(head):]


def tool_supervised_batch(tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, Any]],
                          calls: list[bool] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded trajectories ``[n, T]``; ``labels`` -100 but on the assistant turns (and their end tokens).

    A row whose ``calls`` entry is False (all call by default) is answered at once: prompt, product, end token."""
    import torch

    eos = tokenizer.eos_token_id

    def ids(texts: list[str]) -> list[list[int]]:
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])

    prompts = ids([prompt_text(tokenizer, r) for r in rows])
    call_ids = ids([call_text(r) for r in rows])
    head, _, tail = tool_turn_text(tokenizer, _SENTINEL).partition(_SENTINEL)  # one render, not one per row
    tools = ids([head + r["reward_model"]["ground_truth"] + tail for r in rows])
    answers = ids([r["reward_model"]["ground_truth"] for r in rows])
    seqs, labels = [], []
    for p, c, t, a, call in zip(prompts, call_ids, tools, answers, calls or [True] * len(rows)):
        if call:
            seqs.append(p + c + [eos] + t + a + [eos])
            labels.append([-100] * len(p) + c + [eos] + [-100] * len(t) + a + [eos])
        else:
            seqs.append(p + a + [eos])
            labels.append([-100] * len(p) + a + [eos])
    width = max(len(s) for s in seqs)
    out = {k: torch.full((len(rows), width), v, dtype=torch.long)
           for k, v in (("input_ids", tokenizer.pad_token_id), ("labels", -100), ("attention_mask", 0))}
    for i, (s, lab) in enumerate(zip(seqs, labels)):
        out["input_ids"][i, : len(s)] = torch.tensor(s)
        out["labels"][i, : len(s)] = torch.tensor(lab)
        out["attention_mask"][i, : len(s)] = 1
    return out


def warm_start_calls(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast,
                     settings: TinySettings) -> dict[str, Any]:
    """``settings.steps`` supervised steps on call trajectories, lr warmed up then decayed to zero.

    Returns ``{"steps", "reached_target", "history": [{"step", "loss", "sampled_accuracy"}]}``; ``reached_target``:
    the final sampled held-out accuracy with the tool is at least ``target_sampled_accuracy`` (a floor here: the
    model must use the tool well enough for RL to have a signal)."""
    n, bs = settings.steps, settings.batch_size
    rows = settings.generate_rows(n * bs, seed=settings.seed + _SEED_OFFSET, split="train")
    rng = random.Random(f"hpcppo-tiny-calls:{settings.seed}")
    calls = [rng.random() < settings.call_fraction for _ in rows]
    eval_rows = settings.generate_rows(settings.eval_size, seed=settings.seed + 1_000_003, split="val")
    opt, sched = _optimizer(model, settings.lr, settings.warmup_steps, n)
    history: list[dict[str, float]] = []
    for step in range(1, n + 1):
        lo, hi = (step - 1) * bs, step * bs
        loss = _sft_step(model, opt, tool_supervised_batch(tokenizer, rows[lo:hi], calls[lo:hi]))
        sched.step()
        if step % settings.eval_every == 0 or step == n:
            acc = tool_accuracy(model, tokenizer, eval_rows, greedy=False, seed=step,
                                max_new_tokens=settings.max_new_tokens)
            history.append({"step": step, "loss": loss, "sampled_accuracy": acc})
    model.eval()
    return {"steps": n, "reached_target": history[-1]["sampled_accuracy"] >= settings.target_sampled_accuracy,
            "history": history}


def _generate(model: Any, tokenizer: Any, seqs: list[list[int]], *, greedy: bool, max_new_tokens: int) -> list[list[int]]:
    """Continue each (left-padded) token sequence up to and including its end token, or ``max_new_tokens``."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    gen = model.generate(input_ids=ids, attention_mask=mask, **sampling, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    out = []
    for row in gen[:, width:].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        out.append(row[:end])
    return out


def tool_accuracy(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, Any]], *,
                  greedy: bool, seed: int, max_new_tokens: int, use_tool: bool = True) -> float:
    """Mean task reward of two-turn trajectories (the call, the calculator's answer, the model's answer)."""
    import torch

    schemas = {CALCULATOR_NAME: Calculator.default_schema or {}}
    calculator = Calculator({}, None)
    model.eval()
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)  # evaluation must not consume the training RNG stream
        prompts = [list(p) for p in encode_prompts(tokenizer, rows)["input_ids"].tolist()]
        prompts = [p[next(i for i, t in enumerate(p) if t != tokenizer.pad_token_id):] for p in prompts]
        first = _generate(model, tokenizer, prompts, greedy=greedy, max_new_tokens=max_new_tokens)
        responses = [list(f) for f in first]
        pending = []
        for i, turn in enumerate(first):
            if not use_tool or not turn or turn[-1] != tokenizer.eos_token_id:
                continue
            parsed = parse_calls(str(tokenizer.decode(turn, skip_special_tokens=True)), schemas, "compact", 1)
            if parsed.calls:
                result, _, _ = calculator.execute("eval", parsed.calls[0].arguments)
                responses[i] += tokenizer(tool_turn_text(tokenizer, result), add_special_tokens=False)["input_ids"]
                pending.append(i)
        if pending:
            second = _generate(model, tokenizer, [prompts[i] + responses[i] for i in pending], greedy=greedy,
                               max_new_tokens=max_new_tokens)
            for i, turn in zip(pending, second):
                responses[i] += turn
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    scores = [arith_tool.compute_score(r["data_source"], t, r["reward_model"]["ground_truth"])
              for r, t in zip(rows, texts)]
    return sum(scores) / len(scores)
