"""The tool loop (hpcppo.rollout.tool_loop) on the HF engine: a real (scripted) model, real tokenizers, the real
tool worker. The model's next token depends on its current token only (tests/unit/tool_loop_fixture.py), so each
test writes down what the model does: here it calls ``counter`` (tests/unit/agent_tools_fixture.py: per-trajectory
state, the sum of its arguments) with a random digit, as often as it is let."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import torch

from hpcppo.agent.builtin import Gsm8kAnswer
from hpcppo.agent.check import tool_schemas
from hpcppo.agent.tool import ToolSpec
from hpcppo.agent.tool_turns import ToolTurns
from hpcppo.agent.worker import ToolWorker
from hpcppo.errors import ToolFailureError
from hpcppo.rollout.base import SamplingParams
from hpcppo.rollout.source import ColocatedSource, StepContext
from hpcppo.rollout.tool_loop import (ToolLoop, ToolLoopSettings, check_failures, run_kwargs, stats_metrics,
                                      stats_vector)
from hpcppo.train.rollout_phase import tool_metrics

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker gets this process's sys.path: the fixture tools import there too

from tool_loop_fixture import ECHO_HEAD, ECHO_TAIL, compact_tokenizer, hermes_tokenizer, scripted_engine  # noqa: E402

DIGITS = list("0123456789")


def calls(name: str, *, then: list[str] | None = None) -> dict[str, list[str]]:
    """The model writes ``<call>NAME(D)</call>`` after ``<|assistant|>`` (D a random digit), then ``then``
    (default: nothing more: the closing token stops the turn; EOS after it)."""
    chain = ["<|assistant|>", "<call>", *name, "("]
    table = {a: [b] for a, b in zip(chain, chain[1:])}
    table["("] = DIGITS
    table |= {d: [")"] for d in DIGITS}
    table[")"] = ["</call>"]
    if then is not None:
        table["</call>"] = then
    return table


@pytest.fixture(scope="module")
def tok():
    return compact_tokenizer()


@pytest.fixture(scope="module")
def worker():
    specs = [ToolSpec("agent_tools_fixture.Counter"),
             ToolSpec("agent_tools_fixture.Raises", {}, {"type": "function", "function": {
                 "name": "fail", "description": "raises", "parameters": {
                     "type": "object", "properties": {"x": {"type": "integer"}}, "required": []}}})]
    with ToolWorker(specs, call_timeout_s=30) as w:
        w.test_schemas = tool_schemas(specs)  # type: ignore[attr-defined]
        yield w


def loop(tok, worker, table, **settings) -> ToolLoop:
    s = ToolLoopSettings(**({"max_response_length": 64, "format": "compact"} | settings))
    return ToolLoop(scripted_engine(tok, table), worker, tok, worker.test_schemas, s)


def sampling(tok, n=2, seed=7) -> SamplingParams:
    return SamplingParams(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, n=n, seed=seed,
                          max_new_tokens=64)


def prompt(tok) -> list[int]:
    return tok.encode("<bos><|user|>count<|assistant|>", add_special_tokens=False)


def rows(batch):
    """(response ids, loss mask, log-probs) of each row, cut at its length."""
    out = []
    for i in range(batch.response_ids.shape[0]):
        n = int(batch.response_attention_mask[i].sum())
        out.append((batch.response_ids[i, :n].tolist(), batch.response_mask[i, :n].tolist(),
                    batch.rollout_log_probs[i, :n].tolist()))
    return out


def test_stops_at_the_call_and_appends_the_tool_turn_as_ids(tok, worker):
    lp = loop(tok, worker, calls("counter"), max_assistant_turns=3, max_response_length=128)
    batch = lp.run([prompt(tok)], sampling(tok, n=2))
    turns = ToolTurns(tok, max_tool_response_length=256)
    stats = lp.take_stats()
    assert (stats.trajectories, stats.turns, stats.turns_max, stats.tool_calls) == (2, 6, 3, 4)
    assert stats.calls == {"counter": 4} and stats.tool_errors == 0
    for r, (ids, mask, lps) in enumerate(rows(batch)):
        # three assistant turns of 12 tokens (<call>counter(D)</call>), a tool turn after each of the first two
        first, rest = ids[:12], ids[12:]
        text = tok.decode(first, skip_special_tokens=False)
        assert text.startswith("<call>counter(") and text.endswith(")</call>")
        d1 = int(text[len("<call>counter(")])
        pid = worker.pid
        tool1 = turns.ids([f"sum={d1} pid={pid}"], after=first[-1])
        assert rest[:len(tool1)] == tool1  # exactly the template's tool turn: <eos><|tool|>sum=..<|assistant|>
        second = rest[len(tool1):len(tool1) + 12]
        d2 = int(tok.decode(second, skip_special_tokens=False)[len("<call>counter(")])
        tool2 = turns.ids([f"sum={d1 + d2} pid={pid}"], after=second[-1])  # the trajectory's own instance
        assert rest[len(tool1) + 12:len(tool1) + 12 + len(tool2)] == tool2
        assert len(ids) == 36 + len(tool1) + len(tool2)
        want_mask = [1] * 12 + [0] * len(tool1) + [1] * 12 + [0] * len(tool2) + [1] * 12
        assert mask == want_mask
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if m == 0)
        # the digit is one of ten equally likely tokens: log(1/10); every other sampled token is certain
        digits = [i for i, m in enumerate(mask) if m and tok.convert_ids_to_tokens(ids[i]) in DIGITS
                  and i > 0 and tok.convert_ids_to_tokens(ids[i - 1]) == "("]
        assert len(digits) == 3
        assert all(abs(lps[i] - torch.log(torch.tensor(0.1)).item()) < 1e-4 for i in digits)
        assert lp.tool_rewards[r] == [0.5, 0.5]
    assert batch.policy_version.eq(-1).all()  # stamped by the source


def test_max_user_turns_and_eos_end_a_trajectory(tok, worker):
    lp = loop(tok, worker, calls("counter"), max_user_turns=1)
    ids, mask, _ = rows(lp.run([prompt(tok)], sampling(tok, n=1)))[0]
    assert mask.count(0) > 0 and lp.take_stats().turns == 2  # one tool turn, then the next call is not run
    # the model ends its turn with EOS instead of a call: one turn, no tool
    table = calls("counter")
    table["<|assistant|>"] = ["z"]
    lp = loop(tok, worker, table)
    ids, mask, _ = rows(lp.run([prompt(tok)], sampling(tok, n=1)))[0]
    assert tok.convert_ids_to_tokens(ids) == ["z", "<eos>"] and mask == [1, 1]
    assert lp.take_stats().tool_calls == 0


@pytest.mark.parametrize("budget", [8, 20, 35])
def test_the_response_never_exceeds_the_budget(tok, worker, budget):
    lp = loop(tok, worker, calls("counter"), max_response_length=budget)
    for ids, mask, lps in rows(lp.run([prompt(tok)], sampling(tok, n=3))):
        assert len(ids) <= budget
        if budget == 8:  # cut inside the first call: no tool runs
            assert len(ids) == 8 and mask == [1] * 8
        if budget == 20:  # the tool turn does not fit with room for one more token: not appended (verl)
            assert len(ids) == 12 and mask == [1] * 12
        if budget == 35:  # a tool turn, then the second call cut at the budget
            assert len(ids) == 35 and mask[-1] == 1 and 0 in mask
    stats = lp.take_stats()
    assert stats.tool_calls == (0 if budget == 8 else 3)


def test_parallel_calls_past_the_limit_are_error_observations(tok, worker):
    # several calls in one turn, then EOS; with max_parallel_calls = 2 the turn runs to EOS (no stop at </call>)
    lp = loop(tok, worker, calls("counter", then=["<call>", "<eos>"]), max_parallel_calls=2, max_assistant_turns=2)
    assert lp.stop_ids == ()
    batch = lp.run([prompt(tok)], sampling(tok, n=6, seed=3))
    stats = lp.take_stats()
    seen_many = False
    total_run = total_errors = 0
    for ids, mask, _ in rows(batch):
        first = ids[:mask.index(0)] if 0 in mask else ids
        k = tok.decode(first, skip_special_tokens=False).count("</call>")
        seen_many |= k > 2
        total_run, total_errors = total_run + min(k, 2), total_errors + max(0, k - 2)
        if 0 in mask:
            tool = tok.decode(ids[mask.index(0):], skip_special_tokens=False)
            assert tool.count("sum=") == min(k, 2)
            assert tool.count("error: more than max_parallel_calls = 2") == max(0, k - 2)
    assert seen_many, "the seed should give a turn with more than two calls"
    assert stats.calls["counter"] == total_run and stats.tool_errors == total_errors


def test_a_raising_tool_gives_an_observation_and_is_counted(tok, worker):
    lp = loop(tok, worker, calls("fail"), max_assistant_turns=2, max_response_length=128)
    batch = lp.run([prompt(tok)], sampling(tok, n=2))
    want = ToolTurns(tok, max_tool_response_length=256).ids(["error: tool 'fail' failed: ValueError: bug in the tool"],
                                                            after=tok.convert_tokens_to_ids("</call>"))
    for ids, mask, _ in rows(batch):
        assert [t for t, m in zip(ids, mask) if m == 0] == want
    stats = lp.take_stats()
    assert stats.tool_errors == 2 and stats.failures == {"fail": 2} and stats.tool_timeouts == 0
    names = ["counter", "fail"]
    metrics = stats_metrics(*stats_vector(stats, names), names)
    assert metrics["rollout/tool_failures/fail"] == 2 and metrics["rollout/tool_calls/fail"] == 2
    assert metrics["rollout/tool_errors"] == 2 and metrics["rollout/turns_mean"] == 2.0
    assert metrics["rollout/tool_calls_mean"] == 1.0 and metrics["rollout/tool_calls/counter"] == 0


def test_too_many_failures_in_a_step_stop_the_job_in_one_line(tok, worker):
    lp = loop(tok, worker, calls("fail"), max_assistant_turns=3, max_response_length=200)
    batch = lp.run([prompt(tok)], sampling(tok, n=2))  # 4 failures
    got = SimpleNamespace(tool_stats=lp.take_stats(), batch=batch)
    c = SimpleNamespace(tools=SimpleNamespace(schemas=worker.test_schemas),
                        cfg=SimpleNamespace(rollout=SimpleNamespace(multi_turn=SimpleNamespace(
                            max_tool_failures_per_step=3))))
    with pytest.raises(ToolFailureError) as err:
        tool_metrics(c, got)
    line = str(err.value)
    assert "\n" not in line and "'fail' failed 4 times" in line and "max_tool_failures_per_step = 3" in line
    c.cfg.rollout.multi_turn.max_tool_failures_per_step = 4
    assert tool_metrics(c, got)["rollout/tool_failures/fail"] == 4  # at the limit: goes on
    check_failures({"counter": 0.0, "fail": 0.0}, 0)  # none failed: no error at a limit of 0
    with pytest.raises(ToolFailureError, match="'counter' failed 1 times"):
        check_failures({"counter": 1.0, "fail": 0.0}, 0)


def test_a_step_is_a_function_of_its_seed(tok, worker):
    def run(seed):
        lp = loop(tok, worker, calls("counter"), max_assistant_turns=3)
        batch = lp.run([prompt(tok), prompt(tok)], sampling(tok, n=3, seed=seed))
        return [(i, m) for i, m, _ in rows(batch)]

    a, b, c = run(11), run(11), run(12)
    assert a == b and a != c


def test_hermes_calls_through_the_loop():
    tok = hermes_tokenizer()
    table = {"\n": ["<tool_call>"], "<tool_call>": [ECHO_HEAD], ECHO_HEAD: DIGITS, **{d: [ECHO_TAIL] for d in DIGITS},
             ECHO_TAIL: ["</tool_call>"]}
    schema = {"type": "function", "function": {"name": "echo", "description": "says n back", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    with ToolWorker([ToolSpec("agent_tools_fixture.Echo")]) as w:
        lp = ToolLoop(scripted_engine(tok, table), w, tok, {"echo": schema},
                      ToolLoopSettings(max_response_length=80, format="hermes", max_assistant_turns=2))
        assert lp.stop_ids == (tok.convert_tokens_to_ids("</tool_call>"),)
        p = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        ids, mask, _ = rows(lp.run([p], SamplingParams(eos_token_id=tok.eos_token_id,
                                                      pad_token_id=tok.pad_token_id, seed=5)))[0]
    text = tok.decode(ids, skip_special_tokens=False)
    d = text[len("<tool_call>" + ECHO_HEAD)]
    call = f"<tool_call>{ECHO_HEAD}{d}{ECHO_TAIL}</tool_call>"
    tool = f"<|im_end|>\n<|im_start|>user\n<tool_response>\necho {d}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert text.startswith(call + tool) and text[len(call + tool):].startswith("<tool_call>")
    n_tool = len(tok.encode(tool, add_special_tokens=False))
    assert mask == [1] * 5 + [0] * n_tool + [1] * 5


class OneRequestPerStep:
    """The HF engine behind the request interface (what vLLM offers): each step finishes the oldest pending
    request, so a test sees the loop step some trajectories while others are at their tools."""

    takes_requests = True

    def __init__(self, engine):
        self.engine, self.pending, self.steps = engine, [], []

    def submit(self, key, prompt_ids, sampling):
        self.pending.append((key, list(prompt_ids), sampling))

    def busy(self):
        return bool(self.pending)

    def step_finished(self):
        key, ids, sampling = self.pending.pop(0)
        out = self.engine.generate([ids], sampling)
        n = int(out.response_attention_mask[0].sum())
        self.steps.append(time.monotonic())
        return [(key, out.response_ids[0, :n].tolist(), out.rollout_log_probs[0, :n].tolist())]

    def abort(self, keys):
        self.pending = [p for p in self.pending if p[0] not in keys]


class TimedWorker:
    """The real worker, each execute's start and end recorded."""

    def __init__(self, worker):
        self.worker, self.calls = worker, []

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def execute(self, instance, arguments, kwargs=None):
        start = time.monotonic()
        time.sleep(0.3)  # a slow tool
        out = self.worker.execute(instance, arguments, kwargs)
        self.calls.append((start, time.monotonic()))
        return out


def test_with_a_request_engine_a_trajectory_at_its_tool_holds_up_no_other(tok, worker):
    table = calls("counter")
    table["("] = {"4": 6.0, "5": 5.0}  # greedy takes 4, at a log-prob that is not 0
    settings = ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=3)
    greedy = dataclasses.replace(sampling(tok, n=3), temperature=0.0)
    timed = TimedWorker(worker)
    requests = OneRequestPerStep(scripted_engine(tok, table))
    by_request = ToolLoop(requests, timed, tok, worker.test_schemas, settings).run([prompt(tok)], greedy)
    batched = ToolLoop(scripted_engine(tok, table), worker, tok, worker.test_schemas, settings).run([prompt(tok)],
                                                                                                    greedy)
    for key in ("response_ids", "response_mask", "response_attention_mask"):
        assert torch.equal(getattr(by_request, key), getattr(batched, key)), key
    assert torch.allclose(by_request.rollout_log_probs, batched.rollout_log_probs, atol=1e-6)
    assert len(timed.calls) == 6
    # the engine stepped other trajectories while a tool ran
    assert any(start < step < end for start, end in timed.calls for step in requests.steps)


def test_a_hanging_tool_times_out_into_an_observation_and_a_metric(tok):
    with ToolWorker([ToolSpec("agent_tools_fixture.Hangs")], call_timeout_s=1.0) as w:
        schemas = tool_schemas([ToolSpec("agent_tools_fixture.Hangs")])
        lp = ToolLoop(scripted_engine(tok, calls("hangs")), w, tok, schemas,
                      ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=2))
        ids, mask, _ = rows(lp.run([prompt(tok)], sampling(tok, n=1)))[0]
        stats = lp.take_stats()
        assert w.counts["hangs"]["timeouts"] == 1 and w.counts["hangs"]["restarts"] == 1
    assert stats.tool_timeouts == 1 and stats.tool_errors == 1 and stats.failures == {"hangs": 1}
    want = ToolTurns(tok, max_tool_response_length=256).ids(["error: tool 'hangs' failed: no answer within 1 s"],
                                                            after=tok.convert_tokens_to_ids("</call>"))
    assert [t for t, m in zip(ids, mask) if m == 0] == want


def test_agent_loop_of_a_run(tok, worker):
    from hpcppo.config.multi_turn import MultiTurnSection, ToolEntry
    from hpcppo.errors import ConfigError
    from hpcppo.rollout.agent_loop import SingleTurnLoop
    from hpcppo.train.rollout_phase import agent_loop

    section = MultiTurnSection(enable=True, format="compact", max_assistant_turns=4,
                               tools=[ToolEntry(class_name="agent_tools_fixture.Counter")])
    engine = scripted_engine(tok, calls("counter"))
    c = SimpleNamespace(engine=engine, tokenizer=tok, tools=SimpleNamespace(worker=worker, schemas=worker.test_schemas),
                        cfg=SimpleNamespace(rollout=SimpleNamespace(multi_turn=section), model=SimpleNamespace(path="m"),
                                            data=SimpleNamespace(max_response_length=48)))
    loop = agent_loop(c)
    assert isinstance(loop, ToolLoop) and loop.settings.max_assistant_turns == 4
    assert loop.settings.max_response_length == 48 and loop.settings.format == "compact"
    c.cfg.rollout.multi_turn = MultiTurnSection()
    assert isinstance(agent_loop(c), SingleTurnLoop)
    c.cfg.rollout.multi_turn, c.tokenizer = section, hermes_tokenizer()
    with pytest.raises(ConfigError) as err:  # the compact format on a tokenizer without its markers (as compile)
        agent_loop(c)
    assert str(err.value) == ("rollout.multi_turn.enable: the compact call format needs <call> and </call> as one "
                              "token each, and the tokenizer has no such token (m)")
    c.cfg.rollout.multi_turn = attrs.evolve(section, format="hermes")
    c.tokenizer.chat_template = None
    with pytest.raises(ConfigError) as err:
        agent_loop(c)
    assert str(err.value) == ("rollout.multi_turn.enable: the tool loop needs a tokenizer with a chat template (it "
                              "renders the tool turns) (m)")


# Per-row tool arguments (verl's extra_info.tools_kwargs): each row's reach its trajectories' tools, per phase.

def _record(tools_kwargs):
    return SimpleNamespace(extra_info={"index": 0, "tools_kwargs": tools_kwargs})


def _log_by_instance(path: Path) -> dict[str, list[tuple[str, dict]]]:
    import json

    out: dict[str, list[tuple[str, dict]]] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out.setdefault(entry["instance"], []).append((entry["phase"], entry["kwargs"]))
    return out


@pytest.mark.parametrize("requests", [False, True], ids=["batched", "requests"])
def test_each_rows_tools_kwargs_reach_its_tools_in_every_phase(tok, tmp_path, requests):
    log = tmp_path / "phases.jsonl"
    specs = [ToolSpec("agent_tools_fixture.Recorder", {"log": str(log)})]
    row_a = {"kw": {"create_kwargs": {"secret": "a"}, "execute_kwargs": {"mode": 1},
                    "calc_reward_kwargs": {"bonus": 10.0}, "release_kwargs": {"why": "done"}}}
    row_c = {"kw": {"create_kwargs": {"secret": "c"}, "execute_kwargs": None, "calc_reward_kwargs": None,
                    "release_kwargs": None}}  # Parquet's nulls: absent
    prompts = [SimpleNamespace(input_ids=prompt(tok), record=_record(tools_kwargs))
               for tools_kwargs in (row_a, None, row_c)]
    settings = ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=3)
    with ToolWorker(specs, call_timeout_s=30) as w:
        engine = scripted_engine(tok, calls("kw"))
        lp = ToolLoop(OneRequestPerStep(engine) if requests else engine, w, tok, tool_schemas(specs), settings)
        batch = lp.run([p.input_ids for p in prompts], sampling(tok, n=2), **run_kwargs(lp, prompts))
        assert batch.response_ids.shape[0] == 6
    by_instance = _log_by_instance(log)
    assert len(by_instance) == 6  # one instance per trajectory, two calls each
    want = {"a": (row_a["kw"]["execute_kwargs"], {"bonus": 10.0}, {"why": "done"}), None: ({}, {}, {}),
            "c": ({}, {}, {})}
    seen = []
    for phases in by_instance.values():
        assert [p for p, _ in phases] == ["create", "execute", "execute", "calc_reward", "release"]
        secret = phases[0][1].get("secret")
        execute, calc, release = want[secret]
        assert phases[0][1] == ({"secret": secret} if secret else {})
        assert phases[1][1] == phases[2][1] == execute
        assert phases[3][1] == calc and phases[4][1] == release
        seen.append(secret)
    assert sorted(seen, key=str) == sorted(["a", "a", None, None, "c", "c"], key=str)
    # calc_reward's scores, per row (prompt-major): the bonus of row a's calc_reward_kwargs plus the two calls
    assert lp.reward_scores == [{"kw": 12.0}] * 2 + [{"kw": 2.0}] * 4


def test_a_gsm8k_trajectory_is_scored_against_its_rows_ground_truth(tok):
    """verl's GSM8K tool (hpcppo.agent.builtin.Gsm8kAnswer, named ``gsm`` here: the tiny tokenizer has no ``_``)
    gets each row's ground truth from its create_kwargs; the model answers 7 to both rows."""
    schema = {"type": "function", "function": {"name": "gsm", "description": "check an answer", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    specs = [ToolSpec("hpcppo.agent.builtin.Gsm8kAnswer", {}, schema)]
    table = calls("gsm")
    table["("] = ["7"]
    table["7"] = [")"]
    prompts = [SimpleNamespace(input_ids=prompt(tok), record=_record({"gsm": {"create_kwargs": {"ground_truth": t}}}))
               for t in ("7", "3")]
    settings = ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=2)
    with ToolWorker(specs, call_timeout_s=30) as w:
        lp = ToolLoop(scripted_engine(tok, table), w, tok, tool_schemas(specs), settings)
        batch = lp.run([p.input_ids for p in prompts], sampling(tok, n=2), **run_kwargs(lp, prompts))
    texts = [tok.decode(ids, skip_special_tokens=False) for ids, _, _ in rows(batch)]
    assert all("reward=1.0" in t for t in texts[:2]) and all("reward=0.0" in t for t in texts[2:])
    assert lp.reward_scores == [{"gsm": 1.0}] * 2 + [{"gsm": 0.0}] * 2
    assert lp.tool_rewards == [[0.0]] * 2 + [[Gsm8kAnswer.NO_IMPROVEMENT_PENALTY]] * 2


def test_the_source_gives_the_sampled_and_the_greedy_rows_their_tools_kwargs(tok, tmp_path):
    """ColocatedSource: each prompt's record's tools_kwargs reach both the sampled run and ReMax's greedy run; the
    calc_reward scores come back per sampled row."""
    log = tmp_path / "phases.jsonl"
    specs = [ToolSpec("agent_tools_fixture.Recorder", {"log": str(log)})]
    table = calls("kw")
    table["("] = {"4": 6.0, "5": 5.0}
    prompts = [SimpleNamespace(input_ids=prompt(tok), record=SimpleNamespace(
        data_source="d", ground_truth="", extra_info={"tools_kwargs": {
            "kw": {"create_kwargs": {"secret": s}, "calc_reward_kwargs": {"bonus": b}}}}))
        for s, b in (("x", 1), ("y", 2))]
    settings = ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=2)
    with ToolWorker(specs, call_timeout_s=30) as w:
        engine = scripted_engine(tok, table)
        lp = ToolLoop(engine, w, tok, tool_schemas(specs), settings)
        src = ColocatedSource(engine, lp, weights=lambda **kw: iter(()), prompts=lambda: prompts,
                              sampling=sampling(tok, n=3), greedy_baseline=True)
        src.engine_version = 0  # the engine's weights are the actor's: no sync
        got = src.collect(StepContext(step=1, branch=0, actor_version=0, seed=3))
    assert got.greedy is not None and got.greedy.response_ids.shape[0] == 2
    creates = [kw["secret"] for phases in _log_by_instance(log).values() for p, kw in phases if p == "create"]
    assert sorted(creates) == ["x"] * 4 + ["y"] * 4  # 3 sampled + 1 greedy trajectory per prompt
    assert got.tool_scores == [{"kw": 2.0}] * 3 + [{"kw": 3.0}] * 3  # the sampled run's, not the greedy one's
    assert got.greedy_tool_scores == [{"kw": 2.0}, {"kw": 3.0}] and got.greedy_tool_rewards == [[0.0], [0.0]]
    # ReMax's baseline: the greedy rows are scored with their tool results, as the sampled rows are
    from hpcppo.train.rollout_phase import greedy_baseline_scores

    def score_fn(sources, texts, truths, extra, lengths=None):
        return [e["rollout_reward_scores"]["kw"] + len(e["tool_rewards"]) for e in extra]

    c = SimpleNamespace(reward_model=None, tokenizer=tok, score_fn=score_fn)
    baselines = greedy_baseline_scores(c, prompts, got.greedy, got.greedy_tool_rewards, got.greedy_tool_scores)
    assert baselines.tolist() == [3.0, 4.0]


def test_validation_gives_the_tool_loop_its_rows_tools_kwargs(tok):
    """Trainer.validate with the tool loop: each validation row's ground truth reaches the GSM8K tool, and the
    tool's results reach the reward function's extra_info as in training."""
    from hpcppo.config.reward import RewardManagerSection
    from hpcppo.rollout.source import generate
    from hpcppo.train.trainer import Trainer

    schema = {"type": "function", "function": {"name": "gsm", "description": "check an answer", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    specs = [ToolSpec("hpcppo.agent.builtin.Gsm8kAnswer", {}, schema)]
    table = calls("gsm")
    table["("] = ["7"]
    table["7"] = [")"]
    records = [SimpleNamespace(data_source="d", ground_truth=t, reward_style="rule",
                               extra_info={"tools_kwargs": {"gsm": {"create_kwargs": {"ground_truth": t}}}})
               for t in ("7", "3")]
    items = [SimpleNamespace(input_ids=prompt(tok), record=r) for r in records]
    extras: list = []

    def score_fn(sources, texts, truths, extra, preds=None, lengths=None, penalties=None):
        extras.extend(extra)
        return [e["rollout_reward_scores"]["gsm"] for e in extra]

    settings = ToolLoopSettings(max_response_length=128, format="compact", max_assistant_turns=2)
    with ToolWorker(specs, call_timeout_s=30) as w:
        lp = ToolLoop(scripted_engine(tok, table), w, tok, tool_schemas(specs), settings)
        trainer = Trainer.__new__(Trainer)
        trainer.c = SimpleNamespace(val_data=items, reward_model=None, tokenizer=tok, score_fn=score_fn,
                                    val_sources=["d"], val_sampling=sampling(tok, n=1),
                                    groups=SimpleNamespace(dp_rank=0, dp_size=1, is_tp_leader=True),
                                    tools=SimpleNamespace(schemas={"gsm": schema}))
        trainer.cfg = SimpleNamespace(seed=0, reward_manager=RewardManagerSection())
        trainer.state = SimpleNamespace(step=1, branch=0, actor_version=0)
        def validation(ctx, prompts, sampling, seed_of, per_call):  # a stand-in source: the colocated one's generate
            chunk = [prompts[i] for i in range(len(prompts))]
            yield chunk, generate(lp, chunk, sampling, seed=seed_of(0), greedy_baseline=False)

        trainer.source = SimpleNamespace(validation=validation)
        metrics = trainer.validate()
    assert [e["rollout_reward_scores"] for e in extras] == [{"gsm": 1.0}, {"gsm": 0.0}]
    assert [e["tool_rewards"] for e in extras] == [[0.0], [Gsm8kAnswer.NO_IMPROVEMENT_PENALTY]]
    assert metrics["val/score"] == 0.5
    # the tool loop's counts over the validation's trajectories, beside the training's rollout/* ones
    assert (metrics["val/tool_calls_mean"], metrics["val/tool_calls/gsm"], metrics["val/turns_max"]) == (1.0, 2.0, 2.0)
    assert metrics["val/tool_failures/gsm"] == 0.0 and metrics["val/tool_s"] > 0
