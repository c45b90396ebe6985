"""Hostile and careless inputs to config loading, compile and ``import-verl`` (issue 25): each ends at once with one
line naming the file or key and what is allowed, the error class's exit code, no traceback and no run directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.config.convert import MAX_INPUT_BYTES
from hpcppo.verl.importer import MAX_SETTINGS, YAML_MAX_DEPTH
from hpcppo.errors import ConfigError, PathError, ResolveError, RunIdError

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
VERL_LINE = "python3 -m verl.trainer.main_ppo data.train_files=d.parquet actor_rollout_ref.model.path=/m\n"

#: A refusal must come, not hang (a FIFO, /dev/zero): bounded generously, as the machine may be busy.
HANG_S = 60


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def run(capsys, *argv: str) -> tuple[int, str, float]:
    start = time.monotonic()
    rc = main(list(argv))
    return rc, capsys.readouterr().err, time.monotonic() - start


def assert_one_line(rc: int, err: str, code: int, *needles: str, runs: Path | None = None) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcppo: error: "), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert rc == code, (rc, err)
    if runs is not None:
        assert not runs.exists() or sorted(runs.iterdir()) == [], sorted(runs.iterdir())
    return lines[0]


def compile_(capsys, runs: Path, spec: Path | str, *extra: str) -> tuple[int, str, float]:
    return run(capsys, "compile", str(spec), "--no-check-paths", *extra, "--runs-root", str(runs))


# ----------------------------------------------------------------------------- overrides: one key=value each

@pytest.mark.parametrize("item", [
    "actor.lr=1e-4\nactor.clip_ratio=5",  # the tail was silently dropped
    'name="ok"\nseed=5',
    "actor.lr=1e-4\r\nseed=5",
    "name=ok\x00",
])
def test_an_override_with_a_line_break_or_nul_is_refused_whole(item, runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", item)
    assert_one_line(rc, err, ConfigError.exit_code, "command line (-o)", "one key=value on one line", runs=runs)


def test_an_override_of_five_thousand_digits_is_one_line(runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", "actor.lr=" + "7" * 5000)
    line = assert_one_line(rc, err, ConfigError.exit_code, "actor.lr", "expected float", "5000 characters", "4300 digits",
                           runs=runs)
    assert len(line) < 300  # the value is quoted by its start and length, not whole


def test_an_override_nested_fifty_thousand_deep_is_one_line(runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", "actor.lr=" + "[" * 50_000)
    assert_one_line(rc, err, ConfigError.exit_code, "actor.lr", "nested too deeply", runs=runs)


# ----------------------------------------------------------------------------- spec and site files

def test_a_spec_nested_fifty_thousand_deep_is_one_line(tmp_path, runs, capsys):
    spec = tmp_path / "deep.toml"
    spec.write_text("name = " + "[" * 50_000 + "\n")
    rc, err, _ = compile_(capsys, runs, spec)
    assert_one_line(rc, err, ConfigError.exit_code, str(spec), "nested too deeply", runs=runs)


def test_a_fifo_spec_is_refused_at_once(tmp_path, runs, capsys):
    fifo = tmp_path / "exp.toml"
    os.mkfifo(fifo)  # no writer: reading it would wait forever
    rc, err, seconds = compile_(capsys, runs, fifo)
    assert_one_line(rc, err, ConfigError.exit_code, str(fifo), "is a FIFO", "a regular file", runs=runs)
    assert seconds < HANG_S


def test_a_device_spec_is_refused_at_once(runs, capsys):
    rc, err, seconds = compile_(capsys, runs, "/dev/zero")
    assert_one_line(rc, err, ConfigError.exit_code, "/dev/zero", "is a device", "a regular file", runs=runs)
    assert seconds < HANG_S


def test_a_spec_past_the_size_limit_is_refused(tmp_path, runs, capsys):
    spec = tmp_path / "big.toml"
    spec.write_text(ARITH.read_text() + "#" * MAX_INPUT_BYTES + "\n")
    rc, err, _ = compile_(capsys, runs, spec)
    assert_one_line(rc, err, ConfigError.exit_code, str(spec), f"larger than {MAX_INPUT_BYTES // 1024} KiB",
                    runs=runs)


def test_a_fifo_site_is_refused_at_once(tmp_path, runs, capsys):
    fifo = tmp_path / "site.toml"
    os.mkfifo(fifo)
    rc, err, seconds = compile_(capsys, runs, ARITH, "--site", str(fifo))
    assert_one_line(rc, err, ConfigError.exit_code, str(fifo), runs=runs)
    assert seconds < HANG_S


@pytest.mark.parametrize(("where", "text"), [
    ("vars", 'FOO = "a\\u0000b"'),
    ("nccl", 'NCCL_IB_HCA = "\\u0000"'),
])
def test_an_environment_value_with_nul_is_refused(where, text, tmp_path, runs, capsys):
    site = tmp_path / "mine.toml"
    site.write_text(f'name = "mine"\nscheduler = "local"\n[env.{where}]\n{text}\n')
    rc, err, _ = compile_(capsys, runs, ARITH, "--site", str(site))
    assert_one_line(rc, err, ConfigError.exit_code, str(site), f"env.{where}", "contains a NUL character",
                    "allowed: any text without NUL", runs=runs)


# ----------------------------------------------------------------------------- ranges

@pytest.mark.parametrize("item", ["actor.lr=1e308", "critic.lr=11", "actor.lr=0"])
def test_a_learning_rate_out_of_range_names_the_range(item, runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", item)
    assert_one_line(rc, err, ConfigError.exit_code, item.split("=")[0], "out of range", "> 0.0 and <= 10.0",
                    runs=runs)


def test_kill_rank_past_the_world_size_names_it(runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", "debug.inject.kill_rank=5")
    assert_one_line(rc, err, ResolveError.exit_code, "debug.inject.kill_rank=5", "world size 2", "allowed: 0 to 1",
                    runs=runs)


def test_kill_rank_inside_the_world_size_compiles(runs, capsys):
    rc, err, _ = compile_(capsys, runs, ARITH, "-o", "debug.inject.kill_rank=1")
    assert rc == 0, err


# ----------------------------------------------------------------------------- import-verl

def import_verl(capsys, tmp_path: Path, source: Path | str, *extra: str) -> tuple[int, str, float]:
    return run(capsys, "import-verl", str(source), "-o", str(tmp_path / "out.toml"), *extra)


def test_import_verl_refuses_devices_and_fifos_at_once(tmp_path, capsys):
    fifo = tmp_path / "run.sh"
    os.mkfifo(fifo)
    for source, kind in ((Path("/dev/zero"), "is a device"), (fifo, "is a FIFO")):
        rc, err, seconds = import_verl(capsys, tmp_path, source)
        assert_one_line(rc, err, ConfigError.exit_code, str(source), kind)
        assert seconds < HANG_S
    assert not (tmp_path / "out.toml").exists()


def test_import_verl_refuses_a_line_of_200k_settings(tmp_path, capsys):
    script = tmp_path / "run.sh"  # 3.7 MB on one line
    script.write_text("python3 -m verl.trainer.main_ppo " + " ".join(f"data.x{i}={i}" for i in range(200_000)))
    rc, err, seconds = import_verl(capsys, tmp_path, script)
    assert_one_line(rc, err, ConfigError.exit_code, str(script), f"larger than {MAX_INPUT_BYTES // 1024} KiB")
    assert seconds < HANG_S


def test_import_verl_refuses_more_settings_than_a_run_has(tmp_path, capsys):
    script = tmp_path / "run.sh"  # under the size limit, and each unknown key costs a did-you-mean
    script.write_text("python3 -m verl.trainer.main_ppo " + " ".join(f"data.x{i}={i}" for i in range(50_000)))
    rc, err, seconds = import_verl(capsys, tmp_path, script)
    assert_one_line(rc, err, ConfigError.exit_code, str(script), "50,000 settings", f"at most {MAX_SETTINGS:,}")
    assert seconds < HANG_S


def _laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ndata:\n  train_files: *a{levels - 1}\n"


@pytest.mark.parametrize(("text", "needle"), [
    (_laughs(9), "expands to more than 100,000 values"),  # 10^9 strings once expanded
    ("data: &x\n  train_files: *x\n", "an alias to itself"),
    ("data: " + "[" * 50_000 + "\n", f"nested more than {YAML_MAX_DEPTH} levels"),
    ("".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n", f"nested more than {YAML_MAX_DEPTH}"),
])
def test_import_verl_bounds_yaml_expansion_and_depth(text, needle, tmp_path, capsys):
    path = tmp_path / "ppo.yaml"
    path.write_text(text)
    rc, err, seconds = import_verl(capsys, tmp_path, path)
    assert_one_line(rc, err, ConfigError.exit_code, str(path), needle)
    assert seconds < HANG_S and not (tmp_path / "out.toml").exists()


def test_import_verl_yaml_with_a_few_aliases_still_imports(tmp_path, capsys):
    path = tmp_path / "ppo.yaml"
    path.write_text("common: &len 256\ndata:\n  max_prompt_length: *len\n  max_response_length: *len\n")
    rc, err, _ = import_verl(capsys, tmp_path, path)
    assert rc == 0, err
    assert "max_prompt_length = 256" in (tmp_path / "out.toml").read_text()


def test_import_verl_reports_a_node_count_that_is_not_a_number(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text('python3 -m verl.trainer.main_ppo trainer.nnodes="1;touch x" '
                      'actor_rollout_ref.actor.ppo_micro_batch_size=8 '
                      'actor_rollout_ref.actor.fsdp_config.fsdp_size="x"\n')
    rc, err, _ = import_verl(capsys, tmp_path, script)
    assert rc == 0, err
    assert "Traceback" not in err and not (tmp_path / "x").exists()
    text = (tmp_path / "out.toml").read_text()
    assert '[unsupported] trainer.nnodes=1;touch x: resources.nodes: expected an integer' in text
    assert "[unsupported] actor_rollout_ref.actor.fsdp_config.fsdp_size=x: fsdp_size x: verl takes an integer" in text


@pytest.mark.parametrize("name", ["../../x", "a\nb"])
def test_import_verl_refuses_a_bad_name_at_once(name, tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(VERL_LINE)
    rc, err, _ = import_verl(capsys, tmp_path, script, "--name", name)
    assert_one_line(rc, err, ConfigError.exit_code, "--name", "does not match")
    assert not (tmp_path / "out.toml").exists()


def test_import_verl_creates_no_directories_for_its_output(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(VERL_LINE)
    out = tmp_path / "missing" / "deeper" / "x.toml"
    rc = main(["import-verl", str(script), "-o", str(out)])
    assert_one_line(rc, capsys.readouterr().err, PathError.exit_code, f"{out} cannot be written",
                    f"{out.parent} does not exist")
    assert not (tmp_path / "missing").exists()


# ----------------------------------------------------------------------------- paths checked at compile

def model_dir(tmp_path: Path, config: str | None) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(config)
    return path


def compile_checked(capsys, runs: Path, *overrides: str) -> tuple[int, str]:
    argv = ["compile", str(ARITH), "--runs-root", str(runs)]
    for item in overrides:
        argv += ["-o", item]
    return main(argv), capsys.readouterr().err


@pytest.mark.parametrize(("value", "needle"), [
    ('""', "model.path is empty"),
    ("/etc", "model.path: /etc holds no model (no config.json)"),
])
def test_a_model_path_without_a_model_is_refused(value, needle, runs, capsys):
    rc, err = compile_checked(capsys, runs, f"model.path={value}")
    assert_one_line(rc, err, PathError.exit_code, needle, "allowed: a Hugging Face model directory", runs=runs)


def test_a_critic_path_without_a_model_is_refused(tmp_path, runs, capsys):
    model = model_dir(tmp_path, '{"max_position_embeddings": 64}')
    rc, err = compile_checked(capsys, runs, f"model.path={model}", f"model.critic_path={tmp_path}")
    assert_one_line(rc, err, PathError.exit_code, f"model.critic_path: {tmp_path} holds no model", runs=runs)


def test_a_model_config_that_is_not_json_is_refused(tmp_path, runs, capsys):
    model = model_dir(tmp_path, "{not json")
    rc, err = compile_checked(capsys, runs, f"model.path={model}")
    assert_one_line(rc, err, PathError.exit_code, f"{model}/config.json cannot be read as a model config", runs=runs)


@pytest.mark.parametrize(("config", "name"), [
    ('{"max_position_embeddings": 64}', "max_position_embeddings"),
    ('{"n_positions": 64}', "n_positions"),
    ('{"text_config": {"max_position_embeddings": 64}}', "max_position_embeddings"),
])
def test_prompt_and_response_past_the_model_positions_are_refused(config, name, tmp_path, runs, capsys):
    model = model_dir(tmp_path, config)
    rc, err = compile_checked(capsys, runs, f"model.path={model}", "data.max_prompt_length=60",
                              "data.max_response_length=8")
    assert_one_line(rc, err, ConfigError.exit_code, "data.max_prompt_length", "= 68 positions",
                    f"the model's {name} = 64", "at most 64 together", runs=runs)


def test_prompt_and_response_that_fill_the_positions_exactly_pass_the_model_check(tmp_path, runs, capsys):
    model = model_dir(tmp_path, '{"max_position_embeddings": 64}')
    missing = tmp_path / "no-data.parquet"
    rc, err = compile_checked(capsys, runs, f"model.path={model}", "data.max_prompt_length=56",
                              "data.max_response_length=8", f"data.train_files=[\"{missing}\"]")
    # past the model check: the next check refuses the data that is not there
    assert_one_line(rc, err, PathError.exit_code, f"data.train_files[0]: {missing} does not exist", runs=runs)


def test_import_verl_from_an_endless_stdin_ends_at_once(tmp_path):
    out = tmp_path / "out.toml"
    with open("/dev/zero", "rb") as endless:
        proc = subprocess.run([sys.executable, "-m", "hpcppo.cli", "import-verl", "-", "-o", str(out)], stdin=endless,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == ConfigError.exit_code, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"<stdin>: is larger than {MAX_INPUT_BYTES // 1024} KiB" in proc.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- run ids and options of the run commands
RUN_ID_COMMANDS = [("follow",), ("logs",), ("metrics", "summary"), ("metrics", "export", "-o", "m.csv"), ("plot",),
                   ("compare",), ("status",), ("cancel",), ("resume",), ("rollback",), ("export", "--out", "x"),
                   ("watchdog", "replay")]


def run_cmd(capsys, runs: Path, command: tuple[str, ...], run_id: str) -> tuple[int, str, float]:
    words = list(command)
    at = 2 if words[0] in ("metrics", "watchdog") else 1  # the RUN argument follows the (sub)command
    return run(capsys, *words[:at], run_id, *words[at:], "--runs-root", str(runs))


@pytest.mark.parametrize("command", RUN_ID_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_five_thousand_character_run_id_is_refused_like_everywhere(command, tmp_path, runs, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, err, _ = run_cmd(capsys, runs, command, "r" * 5000)
    assert_one_line(rc, err, RunIdError.exit_code, "invalid run id 'rrrr", "no '/' or '..'", runs=runs)


@pytest.mark.parametrize("command", RUN_ID_COMMANDS[:6], ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("text", ["a/b", "run/../../x", "../nope", "x/" + "r" * 5000])
def test_a_run_path_that_is_not_there_is_one_line(command, text, tmp_path, runs, capsys, monkeypatch):
    # These commands also take a run directory or a metric file: a text with '/' is a path, reported as one.
    monkeypatch.chdir(tmp_path)
    rc, err, _ = run_cmd(capsys, runs, command, text)
    assert_one_line(rc, err, PathError.exit_code, "no such run directory or metric file", runs=runs)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "-nan", "inf", "1e300"])
def test_follow_refuses_an_interval_that_is_not_a_positive_number_of_seconds(value, runs, capsys):
    rc, err, _ = run(capsys, "follow", "some-run", f"--interval={value}", "--runs-root", str(runs))
    assert_one_line(rc, err, ConfigError.exit_code, f"--interval {float(value)}", "a number of seconds > 0",
                    "<= 3600", runs=runs)


def test_logs_refuses_a_negative_line_count(runs, capsys):
    rc, err, _ = run(capsys, "logs", "some-run", "-n", "-5", "--runs-root", str(runs))
    assert_one_line(rc, err, ConfigError.exit_code, "-n/--lines -5", "a whole number of lines >= 0", runs=runs)


def test_logs_n_zero_prints_none_of_the_log(tmp_path):
    from io import BytesIO

    from hpcppo.analysis.logs import copy_log

    log = tmp_path / "job.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    for lines, shown in [(0, b""), (1, b"three\n"), (2, b"two\nthree\n"), (9, b"one\ntwo\nthree\n")]:
        out = BytesIO()
        assert copy_log(log, out, lines=lines) == len(log.read_bytes())
        assert out.getvalue() == shown, lines


def test_status_of_an_empty_run_id_is_refused_not_the_list_of_runs(runs, capsys):
    rc, err, _ = run(capsys, "status", "", "--runs-root", str(runs))
    assert_one_line(rc, err, RunIdError.exit_code, "invalid run id ''", runs=runs)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("key", ["", "  "])
def test_config_explain_of_an_empty_key_is_refused(key, capsys):
    rc, err, _ = run(capsys, "config", "explain", key)
    assert_one_line(rc, err, ConfigError.exit_code, "config explain: empty key", "e.g. actor.lr", "actor, critic")


def metric_run(path: Path) -> Path:
    from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter

    (path / "metrics").mkdir(parents=True)
    with MetricsWriter(path, STANDARD_COLUMNS, attempt=0, swmr=False) as w:
        for step in range(1, 4):
            w.log(step, {"reward/mean": step / 3})
    return path


@pytest.mark.parametrize("title", [r"$\frac{1}{0}$", r"$\frac{1}$", "$5 per run", r"a \$ and $x^$"])  # 2, 4: bad TeX
@pytest.mark.parametrize("usetex", [False, True])  # a matplotlibrc with text.usetex on (no LaTeX here) is overridden
def test_plot_draws_a_title_as_plain_text(title, usetex, tmp_path, capsys):
    import matplotlib

    run_dir, out = metric_run(tmp_path / "r$1"), tmp_path / "fig.png"
    with matplotlib.rc_context({"text.usetex": usetex}):
        rc = main(["plot", str(run_dir), "-m", "reward/mean", "--title", title, "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0 and captured.err == "", captured.err
    assert out.read_bytes().startswith(b"\x89PNG")


def test_plot_labels_are_never_mathtext():
    from matplotlib.cbook import is_math_text

    from hpcppo.analysis.plot import _plain

    for text in (r"$\frac{1}{0}$", "$5 per run", "$a$ $b$", r"\$x$"):
        assert not is_math_text(_plain(text)), text


@pytest.mark.parametrize("where", ["missing/deeper/m.csv", "afile/m.csv"])
def test_metrics_export_creates_no_directories_for_its_output(where, tmp_path, capsys):
    run_dir = metric_run(tmp_path / "r1")
    (tmp_path / "afile").write_text("")
    out = tmp_path / where
    rc, err, _ = run(capsys, "metrics", "export", str(run_dir), "-o", str(out))
    why = "is not a directory" if where.startswith("afile") else "does not exist"
    assert_one_line(rc, err, PathError.exit_code, f"{out} cannot be written", f"{out.parent} {why}")
    assert not (tmp_path / "missing").exists() and (tmp_path / "afile").is_file()


def test_metrics_export_writes_where_the_parent_exists(tmp_path, capsys):
    run_dir, out = metric_run(tmp_path / "r1"), tmp_path / "m.csv"
    assert main(["metrics", "export", str(run_dir), "-o", str(out)]) == 0
    assert out.read_text().startswith("step") or "reward/mean" in out.read_text().splitlines()[0]


# ----------------------------------------------------------------------------- a damaged run.json, a runs root that is a file
DAMAGED_RECORDS = {"truncated": b'{"run_id": "x", "attempts": [{"job_', "null": b"null", "a list": b"[1, 2]",
                   "binary": bytes(range(256)) * 4}


@pytest.mark.parametrize("content", DAMAGED_RECORDS.values(), ids=DAMAGED_RECORDS.keys())
def test_follow_on_a_damaged_run_json_ends_at_once_with_one_line(content, tmp_path):
    """It printed UNREADABLE and the steps, then never ended: no final state can come from a record it cannot read."""
    from hpcppo.errors import RunRecordError
    from hpcppo.launch import jobs
    from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter

    runs = tmp_path / "runs"
    crun = jobs.compile_run(ARITH, "local", ["trainer.total_steps=3"], runs_root=str(runs), check_paths=False)
    with MetricsWriter(crun.run.path, STANDARD_COLUMNS, attempt=0, swmr=False) as w:  # a run that logged its steps
        for step in range(1, 4):
            w.log(step, {"reward/mean": step / 3})
    crun.run.add_attempt(job_id="123", scheduler="local", state="RUNNING", kind="submit")
    (crun.run.path / "run.json").write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "hpcppo.cli", "follow", crun.run.run_id, "--runs-root", str(runs),
                           "--interval", "0.1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == RunRecordError.exit_code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcppo: error: ") and "run.json" in lines[0], proc.stderr
    assert "nothing to follow" in lines[0] and "Traceback" not in proc.stderr


def test_plot_does_not_create_the_directories_of_its_output(tmp_path, capsys):
    run_dir = metric_run(tmp_path / "r1")
    out = tmp_path / "no" / "such" / "fig.png"
    rc, err, _ = run(capsys, "plot", str(run_dir), "-m", "reward/mean", "-o", str(out))
    assert_one_line(rc, err, PathError.exit_code, f"{out} cannot be written", f"{out.parent} does not exist")
    assert not (tmp_path / "no").exists()
    rc, err, _ = run(capsys, "plot", str(run_dir), "-m", "reward/mean", "-o", str(tmp_path / "fig.png"))
    assert rc == 0 and (tmp_path / "fig.png").read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("command", [("status",), ("runs",), ("status", "some-run"), ("follow", "some-run")])
def test_a_runs_root_that_is_a_file_is_one_line_and_not_no_runs(command, tmp_path):
    env = {**os.environ, "HPCPPO_RUNS_ROOT": "/etc/passwd"}
    proc = subprocess.run([sys.executable, "-m", "hpcppo.cli", *command], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert proc.returncode == PathError.exit_code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "no runs" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hpcppo: error: runs root /etc/passwd (from $HPCPPO_RUNS_ROOT): exists and is not a "
                           "directory (it must be a directory you can write"), line
