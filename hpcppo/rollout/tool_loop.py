"""The tool loop (issue 34): generate until a tool call or EOS, run the calls in the rank's tool worker, append the
tool turn as token ids, continue (docs/tools.md, "The rollout loop").

Per trajectory, as verl's ``ToolAgentLoop`` (verl b178a3c, verl/experimental/agent_loop/tool_agent_loop.py,
``_handle_generating_state`` / ``_handle_processing_tools_state``):

- an assistant turn is sampled until EOS or, with ``max_parallel_calls = 1``, the call format's closing token
  (``</tool_call>``, ``</call>``: a stop token when the tokenizer has it as one token), at most the response budget
  left;
- its calls are parsed (:mod:`hpcppo.agent.parse`; malformed, unknown, badly typed and surplus calls become error
  observations) and run one by one in the tool worker; a trajectory with no call ends;
- the answers become one tool turn (:class:`~hpcppo.rollout.tool_turns.ToolTurns`), appended with loss mask 0 and
  log-prob 0; the model's tokens have loss mask 1 and their sampled log-probs;
- it ends at EOS without a call, at ``max_assistant_turns``, at ``max_user_turns``, when the response budget
  (``data.max_response_length``) is spent, or when the next tool turn would not leave room for one more token
  (verl ends there too, without appending it). The response never exceeds the budget.

Scheduling. With the HF engine the live trajectories of a step generate one turn together (one ``engine.generate``
per turn, each trajectory its own row with ``n = 1``), seeded from the step's seed and the turn number. With an
engine that takes requests one at a time (:class:`~hpcppo.rollout.base.RequestEngine`: vLLM), each continuation is
its own request, seeded from the step's seed, the turn and the trajectory, and a finished turn's tools run on one
thread beside the engine: while a trajectory waits on its tool, the engine keeps stepping the others (with one
rank per engine: a tensor-parallel group's ranks must feed their engine alike, so they batch turn by turn). Either
way a step's rollout is a function of its seed (bit-exact resume). A tool turn is appended as ids: the history is never decoded and tokenised
again (each turn's own tokens are decoded to parse its calls only).

Tool failures (the tool raised, crashed its worker or did not answer) are counted per tool; the step's count is
checked against ``rollout.multi_turn.max_tool_failures_per_step`` by :func:`check_failures` after the ranks'
counts are summed, so every rank stops together (:class:`~hpcppo.errors.ToolFailureError`).

Per-call step rewards (``Tool.execute``'s second value) are kept per trajectory, in call order, and go to the reward
function as ``extra_info["tool_rewards"]``: verl's tool agent loop returns them as ``extra_fields["tool_rewards"]``
(``ToolAgentLoop.run``), its agent loop passes them as ``tool_extra_fields`` and its reward managers merge them into
the sample's ``extra_info`` (verl/experimental/reward_loop/reward_manager/naive.py, ``run_single``). No token
carries them by itself.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import queue
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcppo.agent.parse import COMPACT_END, HERMES_END, parse_calls
from hpcppo.agent.worker import ToolWorker
from hpcppo.errors import ToolFailureError
from hpcppo.rollout.agent_loop import Trajectory, batch_from_trajectories
from hpcppo.rollout.base import (PromptInput, RequestEngine, RolloutBatch, RolloutEngine, SamplingParams,
                                 prompt_lists)
from hpcppo.rollout.tool_turns import ToolTurns

__all__ = ["ToolLoop", "ToolLoopSettings", "LoopStats", "check_failures", "turn_seed", "closing_stop_ids",
           "stats_vector", "stats_metrics"]

_CLOSERS = {"hermes": HERMES_END, "compact": COMPACT_END}


@dataclass(frozen=True)
class ToolLoopSettings:
    """``[rollout.multi_turn]`` as the loop reads it, and the response budget."""

    max_response_length: int
    format: str = "hermes"
    max_assistant_turns: int = 0  # 0: only the budget limits them
    max_user_turns: int = 0
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    max_tool_failures_per_step: int = 32


@dataclass
class LoopStats:
    """One step's counts on this rank (summed over ranks by the trainer before they become metrics).

    ``tool_errors``: every error observation (a call that could not run: malformed, unknown tool, bad arguments,
    too many; or a tool that failed); ``tool_timeouts``: calls whose worker did not answer in time;
    ``failures``: per tool, the calls where the tool raised, crashed its worker or timed out."""

    trajectories: int = 0
    turns: int = 0  # assistant turns, summed
    turns_max: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_s: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


def closing_stop_ids(tokenizer: Any, fmt: str, max_parallel_calls: int) -> tuple[int, ...]:
    """The call format's closing token as a stop id, when the tokenizer has it as one token and a turn holds at
    most one call (``max_parallel_calls`` = 1); else none: the turn runs to EOS and its calls are parsed then, as
    verl always does (a model writes several calls in one turn)."""
    if max_parallel_calls != 1:
        return ()
    closer = tokenizer.convert_tokens_to_ids(_CLOSERS[fmt])
    if not isinstance(closer, int) or closer == tokenizer.unk_token_id:
        return ()
    return (closer,)


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The seed of turn ``turn`` of a step seeded ``seed`` (turn 0 keeps it); None stays None."""
    if seed is None or turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**63 - 1)


def check_failures(failures: Mapping[str, float], limit: int) -> None:
    """Raise :class:`ToolFailureError` (one line naming the tool) when a tool failed more than ``limit`` times in
    the step (``failures``: summed over the ranks)."""
    worst = sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))
    if worst and worst[0][1] > limit:
        name, count = worst[0]
        raise ToolFailureError(f"tool {name!r} failed {int(count)} times in one step (raised, crashed or timed out), "
                               f"more than rollout.multi_turn.max_tool_failures_per_step = {limit}")


@dataclass
class _Live:
    row: int
    prompt_index: int
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    instances: dict[str, str] = field(default_factory=dict)
    tool_rewards: list[float] = field(default_factory=list)
    done: bool = False


class ToolLoop:
    """The multi-turn agent loop over one engine and this rank's tool worker (which the caller owns and closes).

    Args:
        engine: the rank's rollout engine (HF or vLLM).
        worker: the rank's :class:`~hpcppo.agent.worker.ToolWorker`.
        tokenizer: the actor's tokenizer (its chat template renders the tool turns).
        schemas: the tools' OpenAI schemas by name.
        settings: :class:`ToolLoopSettings`.
    """

    def __init__(self, engine: RolloutEngine, worker: ToolWorker, tokenizer: Any, schemas: Mapping[str, Any],
                 settings: ToolLoopSettings):
        self.engine = engine
        self.worker = worker
        self.tokenizer = tokenizer
        self.schemas = dict(schemas)
        self.settings = settings
        self.turns = ToolTurns(tokenizer, max_tool_response_length=settings.max_tool_response_length,
                               truncate_side=settings.tool_response_truncate_side)
        self.stop_ids = closing_stop_ids(tokenizer, settings.format, settings.max_parallel_calls)
        self.stats = LoopStats()
        self.tool_rewards: list[list[float]] = []  # per row of the last run's batch
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # the tool thread (request engines)

    def take_stats(self) -> LoopStats:
        """The last :meth:`run`'s counts (and forget them)."""
        stats, self.stats = self.stats, LoopStats()
        return stats

    def run(self, prompts: PromptInput, sampling: SamplingParams) -> RolloutBatch:
        rows = prompt_lists(prompts)
        live = [_Live(row=i * sampling.n + k, prompt_index=i, prompt=rows[i])
                for i in range(len(rows)) for k in range(sampling.n)]
        self.stats = LoopStats(trajectories=len(live))
        try:
            if isinstance(self.engine, RequestEngine) and self.engine.takes_requests:
                self._run_requests(self.engine, live, sampling)
            else:
                self._run_batched(live, sampling)
        finally:
            for t in live:
                for instance in t.instances.values():
                    self.worker.release(instance)
                t.instances.clear()
        self.stats.turns = sum(t.assistant_turns for t in live)
        self.stats.turns_max = max(t.assistant_turns for t in live)
        self.tool_rewards = [list(t.tool_rewards) for t in live]
        trajectories = [Trajectory(prompt_ids=t.prompt, response_ids=t.response, loss_mask=t.loss_mask,
                                   rollout_log_probs=t.log_probs, policy_version=[-1] * len(t.response),
                                   prompt_index=t.prompt_index) for t in live]
        return batch_from_trajectories(trajectories, sampling.pad_token_id)

    def _turn_sampling(self, sampling: SamplingParams, room: int, seed: int | None) -> SamplingParams:
        return dataclasses.replace(sampling, n=1, max_new_tokens=max(1, room), seed=seed,
                                   stop_token_ids=tuple(sampling.stop_token_ids) + self.stop_ids)

    def _run_batched(self, live: list[_Live], sampling: SamplingParams) -> None:
        """Every live trajectory's next turn in one ``generate`` (the HF engine)."""
        budget = self.settings.max_response_length
        turn = 0
        while True:
                active = [t for t in live if not t.done]
                if not active:
                    break
                room = max(budget - len(t.response) for t in active)
                turn_sampling = self._turn_sampling(sampling, room, turn_seed(sampling.seed, turn))
                out = self.engine.generate([t.prompt + t.response for t in active], turn_sampling)
                lengths = out.response_attention_mask.sum(-1).tolist()
                for j, t in enumerate(active):
                    n = min(int(lengths[j]), budget - len(t.response))
                    self._assistant_turn(t, out.response_ids[j, :n].tolist(), out.rollout_log_probs[j, :n].tolist(),
                                         sampling)
                turn += 1

    def _run_requests(self, engine: RequestEngine, live: list[_Live], sampling: SamplingParams) -> None:
        """Each continuation its own request; a finished turn goes to the tool thread, which appends it, runs its
        calls and hands the trajectory back; the engine steps the others meanwhile."""
        budget = self.settings.max_response_length
        by_key = {f"tool-loop-{t.row}": t for t in live}
        back: queue.Queue[tuple[_Live, BaseException | None]] = queue.Queue()

        def submit(key: str, t: _Live) -> None:
            seed = turn_seed(sampling.seed, t.assistant_turns)
            seed = None if seed is None else (seed + t.row) % (2**63 - 1)
            engine.submit(key, t.prompt + t.response, self._turn_sampling(sampling, budget - len(t.response), seed))

        def turn_then_back(t: _Live, ids: list[int], lps: list[float]) -> None:
            try:
                self._assistant_turn(t, ids, lps, sampling)
                back.put((t, None))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the loop's thread
                back.put((t, exc))

        def handle(t: _Live, exc: BaseException | None) -> int:
            if exc is not None:
                raise exc
            if t.done:
                return 1
            submit(f"tool-loop-{t.row}", t)
            return 0

        if self._pool is None:
            # One thread for the loop's life, not one per step: a tool worker restarted from it (after a crash or
            # a hang) gets its death signal tied to this thread (PR_SET_PDEATHSIG follows the starting thread).
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcppo-tools")
        pool = self._pool
        try:
            for key, t in by_key.items():
                submit(key, t)
            open_, at_tools = len(live), 0
            while open_:
                while True:  # trajectories back from their tools: continue them or count them done
                    try:
                        t, exc = back.get_nowait()
                    except queue.Empty:
                        break
                    at_tools -= 1
                    open_ -= handle(t, exc)
                if not open_:
                    break
                if engine.busy():
                    for key, ids, lps in engine.step_finished():
                        t = by_key[key]
                        n = min(len(ids), budget - len(t.response))
                        at_tools += 1
                        pool.submit(turn_then_back, t, ids[:n], lps[:n])
                elif at_tools:  # nothing to generate until a tool answers
                    t, exc = back.get()
                    at_tools -= 1
                    open_ -= handle(t, exc)
                else:
                    raise RuntimeError("the tool loop has open trajectories but no request or tool call in flight")
        except BaseException:
            engine.abort(list(by_key))  # none of this step's requests may run into the next generate
            raise

    def _assistant_turn(self, t: _Live, ids: list[int], log_probs: list[float], sampling: SamplingParams) -> None:
        s = self.settings
        t.response += ids
        t.loss_mask += [1] * len(ids)
        t.log_probs += log_probs
        t.assistant_turns += 1
        last = ids[-1] if ids else None
        ended = last is not None and (last in sampling.eos_ids or last in self.stop_ids)
        if not ended or len(t.response) >= s.max_response_length:  # cut by the budget
            t.done = True
            return
        if s.max_assistant_turns and t.assistant_turns >= s.max_assistant_turns:
            t.done = True
            return
        if s.max_user_turns and t.user_turns >= s.max_user_turns:
            t.done = True
            return
        text = str(self.tokenizer.decode(ids, skip_special_tokens=False))
        parsed = parse_calls(text, self.schemas, s.format, s.max_parallel_calls)
        if not parsed.calls and not parsed.errors:
            t.done = True
            return
        answers = [f"error: {e.message}" for e in parsed.errors]
        self.stats.tool_errors += len(parsed.errors)
        start = time.perf_counter()
        for call in parsed.calls:
            answers.append(self._run_call(t, call.name, call.arguments))
        self.stats.tool_s += time.perf_counter() - start
        tool_ids = self.turns.ids(answers, after=last)
        if len(t.response) + len(tool_ids) >= s.max_response_length:  # no room for the model's next token
            t.done = True
            return
        t.response += tool_ids
        t.loss_mask += [0] * len(tool_ids)
        t.log_probs += [0.0] * len(tool_ids)
        t.user_turns += 1

    def _run_call(self, t: _Live, name: str, arguments: dict[str, Any]) -> str:
        self.stats.tool_calls += 1
        self.stats.calls[name] += 1
        instance = t.instances.get(name)
        try:
            if instance is None:
                instance = t.instances[name] = self.worker.create(name)
        except Exception as exc:  # noqa: BLE001 - a create that raised or crashed: an observation, counted
            self.stats.tool_errors += 1
            self.stats.failures[name] += 1
            return f"error: {exc}"
        outcome = self.worker.execute(instance, arguments)
        if outcome.error:
            self.stats.tool_errors += 1
            self.stats.failures[name] += 1
            if outcome.error == "timeout":
                self.stats.tool_timeouts += 1
        else:
            t.tool_rewards.append(outcome.reward)
        return outcome.text


def stats_vector(stats: LoopStats, tools: Sequence[str]) -> tuple[list[float], list[float]]:
    """The step's counts as (sums, maxima) for an all-reduce: the sums ``trajectories, turns, tool_calls,
    tool_errors, tool_timeouts`` then per tool (in ``tools``' order) calls and failures; the maxima ``turns_max``,
    ``tool_s``."""
    sums = [float(stats.trajectories), float(stats.turns), float(stats.tool_calls), float(stats.tool_errors),
            float(stats.tool_timeouts)]
    sums += [float(stats.calls.get(n, 0)) for n in tools] + [float(stats.failures.get(n, 0)) for n in tools]
    return sums, [float(stats.turns_max), stats.tool_s]


def stats_metrics(sums: Sequence[float], maxima: Sequence[float], tools: Sequence[str]) -> dict[str, float]:
    """The step's ``rollout/*`` tool metrics from :func:`stats_vector`'s vectors summed / maxed over the ranks
    (``time/tool_s``: the slowest rank's tool time)."""
    trajectories = max(1.0, sums[0])
    k = len(tools)
    metrics = {"rollout/turns_mean": sums[1] / trajectories, "rollout/turns_max": maxima[0],
               "rollout/tool_calls_mean": sums[2] / trajectories, "rollout/tool_errors": sums[3],
               "rollout/tool_timeouts": sums[4], "time/tool_s": maxima[1]}
    metrics |= {f"rollout/tool_calls/{n}": sums[5 + i] for i, n in enumerate(tools)}
    metrics |= {f"rollout/tool_failures/{n}": sums[5 + k + i] for i, n in enumerate(tools)}
    return metrics
