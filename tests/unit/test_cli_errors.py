"""Bad input through ``hpcppo.cli.main``: one clear line on stderr, the error class's exit code, no
traceback, and no run directory left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import (ConfigError, PathError, ResolveError, RunIdError, RunStateError, SchedulerError,
                           SiteNotFoundError)

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def cli(capsys, runs: Path, *argv: str) -> tuple[int, str]:
    rc = main([*argv, "--runs-root", str(runs)])
    return rc, capsys.readouterr().err


def assert_one_clean_line(rc: int, err: str, runs: Path, code: int, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hpcppo: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert rc == code, (rc, err)
    # nothing visible or hidden (no half-made .tmp directory) under the runs root
    assert not runs.exists() or sorted(runs.iterdir()) == [], sorted(runs.iterdir())


def spec_file(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- config errors (exit 2)
def test_malformed_toml_names_file_line_and_column(tmp_path, runs, capsys):
    spec = spec_file(tmp_path, 'name = "x"\n[model\npath = "m"\n')
    rc, err = cli(capsys, runs, "compile", str(spec))
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, str(spec), "line 2, column 7")


def test_malformed_override_value(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", "actor.lr=[1,")
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, "actor.lr")


def test_unknown_key_in_spec_suggests_the_right_one(tmp_path, runs, capsys):
    spec = spec_file(tmp_path, ARITH.read_text().replace("[actor]\nlr = 1e-4", "[actor]\nlearning_rat = 1e-4\nlr = 1e-4"))
    rc, err = cli(capsys, runs, "compile", str(spec), "--no-check-paths")
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, str(spec), "actor.learning_rat", "unknown key")


def test_unknown_key_in_override_suggests_the_right_one(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", "actor.clip_ratio_cc=3")
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, "actor.clip_ratio_cc", "did you mean 'clip_ratio_c'?")


def test_unknown_key_in_a_site_file(tmp_path, runs, capsys):
    site = spec_file(tmp_path, 'name = "mine"\nscheduler = "slurm"\n[slurm]\npartion = "gpu"\n', "mine.toml")
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "--site", str(site))
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, str(site), "slurm.partion", "did you mean 'partition'?")


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("actor.lr=\"fast\"", ("actor.lr", "expected a float", "\"fast\"")),
        ("resources.nodes=\"two\"", ("resources.nodes", "int")),
        ("rollout.n=1.5", ("rollout.n", "int")),
        ("algorithm.adv_estimator=\"gea\"", ("algorithm.adv_estimator", "gae")),
    ],
)  # fmt: skip
def test_wrong_type_or_choice(override, needles, runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", override)
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, *needles)


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("actor.clip_ratio_c=1.0", ("actor.clip_ratio_c", "1.0", "must be > 1.0")),
        ("algorithm.gamma=1.01", ("algorithm.gamma", "1.01", "<= 1.0")),
        ("actor.lr=-1e-6", ("actor.lr", "-1e-06", "must be > 0.0")),
        ("resources.nodes=0", ("resources.nodes", "must be >= 1")),
    ],
)  # fmt: skip
def test_out_of_range_values(override, needles, runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", override)
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, *needles)


def test_out_of_range_value_in_the_spec_file_names_the_file(tmp_path, runs, capsys):
    spec = spec_file(tmp_path, ARITH.read_text().replace("gamma = 1.0", "gamma = 1.5"))
    rc, err = cli(capsys, runs, "compile", str(spec), "--no-check-paths")
    assert_one_clean_line(rc, err, runs, ConfigError.exit_code, str(spec), "algorithm.gamma", "1.5")


def test_unknown_site_lists_the_available_ones(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "--site", "a100")
    assert_one_clean_line(rc, err, runs, SiteNotFoundError.exit_code, "'a100'",
                          "a100-cluster, h100-cluster, local, local-slurm")  # fmt: skip


def test_unknown_site_for_preflight(runs, capsys):
    rc, err = cli(capsys, runs, "preflight", "--site", "nosuch", "--dry-run")
    assert_one_clean_line(rc, err, runs, SiteNotFoundError.exit_code, "nosuch", "local-slurm")


# ----------------------------------------------------------------------------- paths (exit 5)
def test_missing_model_path(tmp_path, runs, capsys):
    spec = spec_file(tmp_path, ARITH.read_text())  # relative paths now point into tmp_path/..
    rc, err = cli(capsys, runs, "compile", str(spec))
    assert_one_clean_line(rc, err, runs, PathError.exit_code, "model.path", "does not exist")


def test_missing_data_path(tmp_path, runs, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 64}')  # a model, as far as compile looks
    spec = spec_file(tmp_path, ARITH.read_text().replace('path = "../artifacts/tiny-arith/model"', 'path = "model"'))
    rc, err = cli(capsys, runs, "compile", str(spec))
    assert_one_clean_line(rc, err, runs, PathError.exit_code, "data.train_files[0]", "train.parquet", "does not exist")


# ----------------------------------------------------------------------------- resolution (exit 4)
def test_batch_that_does_not_divide_suggests_values(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", "trainer.train_batch_size=33")
    assert_one_clean_line(rc, err, runs, ResolveError.exit_code, "trainer.train_batch_size=33", "32 or 34")


def test_micro_batch_that_does_not_divide_lists_valid_sizes(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(ARITH), "--no-check-paths", "-o", "actor.ppo_micro_batch_size_per_gpu=7")
    assert_one_clean_line(rc, err, runs, ResolveError.exit_code, "actor.ppo_micro_batch_size_per_gpu=7",
                          "valid micro-batch sizes: 1, 2, 4, 8, 16, 32")  # fmt: skip


def test_more_gpus_per_node_than_the_site_has(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(GSM8K), "--site", "a100-cluster", "--no-check-paths",
                  "-o", "resources.gpus_per_node=16")  # fmt: skip
    assert_one_clean_line(rc, err, runs, ResolveError.exit_code, "resources.gpus_per_node=16", "(8)")


def test_time_limit_over_the_site_maximum(runs, capsys):
    rc, err = cli(capsys, runs, "compile", str(GSM8K), "--site", "a100-cluster", "--no-check-paths",
                  "-o", "resources.time=\"3-00:00:00\"")  # fmt: skip
    assert_one_clean_line(rc, err, runs, ResolveError.exit_code, "resources.time", "max_time='2-00:00:00'")


def test_more_nodes_than_the_site_allows_for_preflight(runs, capsys):
    rc, err = cli(capsys, runs, "preflight", "--site", "local-slurm", "--nodes", "3", "--dry-run")
    assert_one_clean_line(rc, err, runs, ResolveError.exit_code, "resources.nodes=3", "at most 2")


# ----------------------------------------------------------------------------- run ids (exit 6)
@pytest.mark.parametrize("command", ["status", "cancel"])
@pytest.mark.parametrize("run_id", ["../etc", "a/b", "..", "/abs/run", "run/../../x"])
def test_run_id_with_slash_or_dotdot(command, run_id, runs, capsys):
    rc, err = cli(capsys, runs, command, run_id)
    assert_one_clean_line(rc, err, runs, RunIdError.exit_code, "invalid run id", "no '/' or '..'")


def test_unknown_run_id(runs, capsys):
    rc, err = cli(capsys, runs, "status", "exp-20260101-000000-abcd")
    assert_one_clean_line(rc, err, runs, RunIdError.exit_code, "no run 'exp-20260101-000000-abcd'")


# ----------------------------------------------------------------------------- scheduler (exit 7)
def test_sbatch_missing_on_path(tmp_path, runs, capsys, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc, err = cli(capsys, runs, "submit", str(ARITH), "--site", "local-slurm", "--no-check-paths", "-q")
    assert_one_clean_line(rc, err, runs, SchedulerError.exit_code, "sbatch not found on PATH")


def test_preflight_with_sbatch_missing(tmp_path, runs, capsys, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc, err = cli(capsys, runs, "preflight", "--site", "local-slurm", "-q")
    assert_one_clean_line(rc, err, runs, SchedulerError.exit_code, "sbatch not found on PATH")


def test_sbatch_rejecting_the_job_shows_its_stderr(tmp_path, runs, capsys, monkeypatch):
    """A stand-in sbatch that fails like Slurm does for a bad partition (the real one: tests/slurm)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/sh\n"
        "echo 'sbatch: error: invalid partition specified: nosuchpartition' >&2\n"
        "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rc, err = cli(capsys, runs, "submit", str(ARITH), "--site", "local-slurm", "--no-check-paths", "-q",
                  "-o", "site.slurm.partition=\"nosuchpartition\"")  # fmt: skip
    assert_one_clean_line(rc, err, runs, SchedulerError.exit_code, "sbatch rejected the job",
                          "invalid partition specified: nosuchpartition", "Invalid partition name specified")  # fmt: skip


def test_sbatch_answer_without_job_id_keeps_the_run_directory(tmp_path, runs, capsys, monkeypatch):
    """sbatch exited 0 but printed no job id: a job may be queued and needs its run directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/sh\necho 'sbatch: queued somewhere'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rc, err = cli(capsys, runs, "submit", str(ARITH), "--site", "local-slurm", "--no-check-paths", "-q")
    kept = [p for p in runs.iterdir()]
    assert len(kept) == 1 and (kept[0] / "job.sbatch").is_file()
    assert rc == SchedulerError.exit_code and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "'sbatch: queued somewhere'" in err and "check squeue" in err and f"run directory kept: {kept[0]}" in err


# ----------------------------------------------------------------------------- config command
def test_config_explain_unknown_key(capsys):
    rc = main(["config", "explain", "actor.lrr"])
    err = capsys.readouterr().err
    assert rc == ConfigError.exit_code
    assert err.strip().splitlines() == [err.strip()] and "did you mean 'lr'?" in err and "Traceback" not in err


def test_config_show_bad_override(capsys):
    rc = main(["config", "show", str(ARITH), "-o", "algorithm.gamma=2"])
    err = capsys.readouterr().err
    assert rc == ConfigError.exit_code and "algorithm.gamma" in err and len(err.strip().splitlines()) == 1


def test_error_classes_have_distinct_exit_codes():
    from hpcppo.errors import RunBusyError

    codes = [c.exit_code for c in (ConfigError, SiteNotFoundError, ResolveError, PathError, RunIdError, SchedulerError,
                                   RunStateError, RunBusyError)]
    assert len(set(codes)) == len(codes) and 0 not in codes


# ----------------------------------------------------------------------------- the bad-input corpus (issue 13 item 5)
# Each case sets up its input under tmp_path and returns the command line; the test checks the exit code, one
# "hpcppo: error:" line naming the file/key, no traceback, and that nothing under tmp_path changed (no half-made
# run directory, no data directory of a refused model build, the pre-existing files untouched).
LONG = "/x" * 3000  # 6000 characters: longer than PATH_MAX


def _binary_spec(tmp_path, monkeypatch):
    spec = tmp_path / "b.toml"
    spec.write_bytes(bytes(range(256)) * 8)  # like `head -c 2000 /dev/urandom`: not UTF-8
    return ["compile", str(spec)]


def _runs_root_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "runs").write_text("not a directory\n")
    return ["compile", str(ARITH), "--no-check-paths"]


def _runs_root_under_a_file(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    return ["compile", str(ARITH), "--no-check-paths", "--runs-root", str(tmp_path / "file" / "runs")]


def _runs_root_from_env_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("HPCPPO_RUNS_ROOT", str(tmp_path / "file"))
    return ["submit", str(ARITH), "--no-check-paths", "-q", "--dry-run", "--runs-root", ""]


def _run_json_not_json(tmp_path, monkeypatch):
    assert main(["compile", str(ARITH), "--no-check-paths", "-q", "--runs-root", str(tmp_path / "runs")]) == 0
    [run] = (tmp_path / "runs").iterdir()
    (run / "run.json").write_bytes(b"\x00{garbage")
    return ["status", run.name]


def _long_sites_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCPPO_SITES_DIR", LONG)
    return ["compile", str(ARITH), "--no-check-paths"]


def _long_site_path(tmp_path, monkeypatch):
    return ["compile", str(ARITH), "--no-check-paths", "--site", LONG + ".toml"]


def _make_model_out_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "model").write_text("x")
    return ["tools", "make-model", "--out", str(tmp_path / "model"), "--data-out", str(tmp_path / "data")]


def _make_model_data_under_a_file(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    return ["tools", "make-model", "--out", str(tmp_path / "model"), "--data-out", str(tmp_path / "file" / "data")]


def _every_run_id_taken(tmp_path, monkeypatch):
    from hpcppo.launch import jobs

    assert main(["compile", str(ARITH), "--no-check-paths", "-q", "--runs-root", str(tmp_path / "runs")]) == 0
    [taken] = (tmp_path / "runs").iterdir()
    monkeypatch.setattr(jobs, "new_run_id", lambda name: taken.name)
    return ["compile", str(ARITH), "--no-check-paths"]


def _spec_with(text_from: str, text_to: str):
    def setup(tmp_path, monkeypatch):
        spec = tmp_path / "exp.toml"
        text = ARITH.read_text()
        assert text_from in text
        spec.write_text(text.replace(text_from, text_to))
        return ["compile", str(spec), "--no-check-paths"]

    return setup


def _override(*items: str, env: dict[str, str] | None = None):
    def setup(tmp_path, monkeypatch):
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        argv = ["compile", str(ARITH), "--no-check-paths"]
        for item in items:
            argv += ["-o", item]
        if any(item.startswith("site.paths.runs_root") for item in items):
            argv += ["--runs-root", ""]  # the runs root from the site, as overridden
        return argv

    return setup


def _site_file_with_unset_var(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCPPO_NO_SUCH_VAR", raising=False)
    site = tmp_path / "mysite.toml"
    site.write_text((REPO / "sites" / "local.toml").read_text().replace('runs_root = "runs"',
                                                                        'runs_root = "${HPCPPO_NO_SUCH_VAR}/runs"'))
    return ["compile", str(ARITH), "--no-check-paths", "--site", str(site), "--runs-root", ""]


CORPUS = [
    pytest.param(_binary_spec, ConfigError, ("b.toml: not UTF-8 text", "a TOML file must be UTF-8"), id="binary-spec"),
    pytest.param(_runs_root_is_a_file, PathError, ("runs root", "(from --runs-root): exists and is not a directory",
                                                   "must be a directory you can write"), id="runs-root-is-a-file"),
    pytest.param(_runs_root_under_a_file, PathError, ("runs root", "cannot create it (Not a directory)"),
                 id="runs-root-under-a-file"),
    pytest.param(_runs_root_from_env_is_a_file, PathError, ("(from $HPCPPO_RUNS_ROOT): exists and is not a directory",),
                 id="runs-root-from-env-is-a-file"),
    pytest.param(_run_json_not_json, RunStateError, ("run.json: not valid JSON", "restore it"), id="run-json-not-json"),
    pytest.param(_long_sites_dir, ConfigError, ("$HPCPPO_SITES_DIR:", "6000 characters", "File name too long",
                                                "allowed: directories separated by ':'"), id="long-sites-dir"),
    pytest.param(_long_site_path, ConfigError, ("--site:", "File name too long", "a site name or the path"),
                 id="long-site-path"),
    pytest.param(_make_model_out_is_a_file, PathError, ("--out", "is a file; --out must be a directory"),
                 id="make-model-out-is-a-file"),
    pytest.param(_make_model_data_under_a_file, PathError, ("--data-out", "is a file; --data-out must be a directory"),
                 id="make-model-data-under-a-file"),
    pytest.param(_every_run_id_taken, RunIdError, ("could not find a free run id", "in 8 tries"),
                 id="every-run-id-taken"),
    pytest.param(_override("actor.lr=inf"), ConfigError, ("actor.lr: inf is not allowed; a finite number",),
                 id="lr-inf"),
    pytest.param(_override("critic.lr=-inf"), ConfigError, ("critic.lr: -inf is not allowed",), id="critic-lr-minus-inf"),
    pytest.param(_override("actor.grad_clip=nan"), ConfigError, ("actor.grad_clip: nan is not allowed",),
                 id="grad-clip-nan"),
    pytest.param(_override("algorithm.kl_ctrl.kl_coef=inf"), ConfigError, ("algorithm.kl_ctrl.kl_coef: inf",),
                 id="kl-coef-inf"),
    pytest.param(_override("watchdog.min_heartbeat_s=inf"), ConfigError, ("watchdog.min_heartbeat_s: inf",),
                 id="heartbeat-inf"),
    pytest.param(_spec_with("lr = 1e-4", "lr = inf"), ConfigError, ("exp.toml: actor.lr: inf is not allowed",),
                 id="lr-inf-in-spec"),
    pytest.param(_spec_with('name = "arith-tiny"', 'name = "a..b"'), ConfigError,
                 ("exp.toml: name: 'a..b' contains '..'", "allowed: 1-64 letters"), id="name-with-dotdot-in-spec"),
    pytest.param(_override('name="x..y"'), ConfigError, ("command line (-o): name: 'x..y' contains '..'",),
                 id="name-with-dotdot-override"),
    pytest.param(_site_file_with_unset_var, ConfigError,
                 ("site.paths.runs_root (site 'local'): ${HPCPPO_NO_SUCH_VAR} is not set in the environment",),
                 id="unset-var-in-site-runs-root"),
    pytest.param(_override('site.paths.runs_root="$HPCPPO_NO_SUCH_VAR/r"'), ConfigError,
                 ("${HPCPPO_NO_SUCH_VAR} is not set",), id="unset-var-in-runs-root-override"),
    pytest.param(_override('model.path="${HPCPPO_NO_SUCH_VAR}/m"'), ConfigError,
                 ("command line (-o): model.path: ${HPCPPO_NO_SUCH_VAR} is not set",), id="unset-var-in-model-path"),
    pytest.param(_spec_with('"../artifacts/tiny-arith/data/val.parquet"', '"$HPCPPO_NO_SUCH_VAR/v.parquet"'),
                 ConfigError, ("exp.toml: data.val_files[0]: ${HPCPPO_NO_SUCH_VAR} is not set",),
                 id="unset-var-in-a-data-file"),
    pytest.param(_override("..=1"), ConfigError, ("command line (-o): '..' is not a dotted key",), id="override-dotdot"),
    pytest.param(_override("actor..lr=1"), ConfigError, ("'actor..lr' is not a dotted key",), id="override-empty-part"),
    pytest.param(_override(".=1"), ConfigError, ("'.' is not a dotted key",), id="override-dot"),
    pytest.param(_spec_with('metric = "kl/actor_ref"\ncondition = "gt"\nthreshold = 2.0',
                            'metric = "kl/actorref"\ncondition = "gt"\nthreshold = 2.0'), ConfigError,
                 ("exp.toml: watchdog.rules: rule 'kl_pause': metric 'kl/actorref' is not logged by the trainer "
                  "(did you mean 'kl/actor_ref'?)",), id="rule-watching-a-metric-never-logged"),
]


def _tree(root: Path) -> dict[str, bytes | None]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.name.startswith("pytest-") or p.name == "__pycache__":
            continue
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() else None
    return out


@pytest.mark.parametrize(("setup", "error", "needles"), CORPUS)
def test_bad_input_corpus(setup, error, needles, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = setup(tmp_path, monkeypatch)
    if "--runs-root" not in argv and argv[0] in ("compile", "submit", "status"):
        argv += ["--runs-root", str(tmp_path / "runs")]
    if "--runs-root" in argv and argv[argv.index("--runs-root") + 1] == "":
        del argv[argv.index("--runs-root"):argv.index("--runs-root") + 2]  # from the environment or the site
    before = _tree(tmp_path)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcppo: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert rc == error.exit_code, (rc, err)
    assert _tree(tmp_path) == before  # nothing left behind, nothing changed


@pytest.fixture()
def read_only_dir(tmp_path):
    """A read-only file system (a tmpfs mounted ro; root ignores permission bits), or a mode-0555 directory."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs as root here: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_read_only_runs_root(read_only_dir, capsys):
    for root in (read_only_dir, read_only_dir / "runs"):
        rc = main(["compile", str(ARITH), "--no-check-paths", "-q", "--runs-root", str(root)])
        err = capsys.readouterr().err
        assert rc == PathError.exit_code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"runs root {root} (from --runs-root): " in err
        assert ("is not writable" in err) if root == read_only_dir else ("cannot create it" in err)
    assert list(read_only_dir.iterdir()) == []


def test_a_run_id_collision_draws_another_id(tmp_path, monkeypatch, capsys):
    from hpcppo.launch import jobs

    runs = tmp_path / "runs"
    assert main(["compile", str(ARITH), "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    [taken] = runs.iterdir()
    ids = iter([taken.name, taken.name, "arith-tiny-20260101-000000-beef"])
    monkeypatch.setattr(jobs, "new_run_id", lambda name: next(ids))
    capsys.readouterr()
    assert main(["compile", str(ARITH), "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    assert sorted(p.name for p in runs.iterdir()) == sorted([taken.name, "arith-tiny-20260101-000000-beef"])
    made = runs / "arith-tiny-20260101-000000-beef"
    assert str(made) in (made / "job.sbatch").read_text()  # the script names the id it got, not the taken one


def test_a_collision_at_the_rename_is_retried(tmp_path, monkeypatch):
    """Another process makes the same run directory between the existence check and the rename."""
    from hpcppo.launch import jobs
    from hpcppo.rundir import record

    runs = tmp_path / "runs"
    ids = iter(["arith-tiny-20260101-000000-aaaa", "arith-tiny-20260101-000000-bbbb"])
    monkeypatch.setattr(jobs, "new_run_id", lambda name: next(ids))
    real_rename = os.rename

    def racing_rename(src, dst):
        if Path(dst).name.endswith("aaaa") and not Path(dst).exists():
            (Path(dst) / "spec.toml").parent.mkdir()
            (Path(dst) / "spec.toml").write_text("theirs")
        return real_rename(src, dst)

    monkeypatch.setattr(record.os, "rename", racing_rename)
    crun = jobs.compile_run(ARITH, "local", [], runs_root=str(runs), check_paths=False)
    assert crun.run.run_id.endswith("bbbb")
    assert (runs / "arith-tiny-20260101-000000-aaaa" / "spec.toml").read_text() == "theirs"
    assert sorted(p.name for p in runs.iterdir()) == ["arith-tiny-20260101-000000-aaaa",
                                                      "arith-tiny-20260101-000000-bbbb"]


# The corpus above calls hpcppo.cli.main in-process; these go through the installed console script, as a user
# does, so an error escaping main (or printed twice, or a warning on stderr) would show here too.
@pytest.mark.parametrize("setup", [_binary_spec, _override("..=1"), _override("actor.lr=inf"), _run_json_not_json],
                         ids=["binary-spec", "override-dotdot", "lr-inf", "run-json-not-json"])
def test_the_console_script_prints_one_line(setup, tmp_path, monkeypatch):
    argv = setup(tmp_path, monkeypatch)
    argv += ["--runs-root", str(tmp_path / "runs")]
    before = _tree(tmp_path)
    script = Path(sys.executable).with_name("hpcppo")
    proc = subprocess.run([str(script), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode not in (0, 1) and len(lines) == 1 and lines[0].startswith("hpcppo: error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert _tree(tmp_path) == before


def readme_exit_codes() -> dict[int, tuple[str, set[str]]]:
    """The README's exit-code table: code -> (meaning, the error classes named in its last column)."""
    import re

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("<!-- exit codes: the table below is read by tests/unit/test_cli_errors.py -->", 1)[1]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        if not line.startswith("|"):
            break
        code, meaning, classes = (cell.strip() for cell in line.strip("|").split("|"))
        rows[int(code)] = (meaning, set(re.findall(r"`(\w+)`", classes)))
    return rows


def test_the_readme_lists_every_exit_code_as_the_code_has_it():
    """One table of every exit code (issue 25: the README said 9 where `resume` of a running job exits 8)."""
    import inspect

    from hpcppo import errors
    from hpcppo.rundir import exitcodes

    table = readme_exit_codes()
    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, errors.HpcppoError)}
    named = {name: code for code, (_, names) in table.items() for name in names}
    for name, cls in classes.items():  # every error class is in the table, under its code
        assert named.get(name) == cls.exit_code, (name, cls.exit_code, named.get(name))
    assert set(named) <= set(classes)  # and the table names no class that is not there
    assert {0, 130} <= set(table) and set(table) == {0, 130} | {cls.exit_code for cls in classes.values()}
    assert "is RUNNING" in table[errors.RunStateError.exit_code][0]
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    job = text.split("The job itself (`python -m hpcppo.train.main`", 1)[1].split("\n\n", 1)[0]
    for code in (exitcodes.DONE, exitcodes.FAILED, exitcodes.REQUEUE, exitcodes.PAUSED):
        assert f" {code} when" in job.replace("\n", " "), code


def test_resume_of_a_running_job_exits_with_the_code_the_readme_gives(tmp_path, capsys):
    """A local job kept RUNNING by a live controller stand-in: `resume` refuses it with the table's code 8."""
    from hpcppo.errors import RunStateError
    from hpcppo.launch import jobs

    runs = tmp_path / "runs"
    crun = jobs.compile_run(ARITH, "local", [], runs_root=str(runs), check_paths=False)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "submitit",
                                   str(crun.run.submitit)])
    try:
        crun.run.add_attempt(job_id=str(controller.pid), scheduler="local", state="RUNNING", kind="submit")
        rc = main(["resume", crun.run.run_id, "--runs-root", str(runs)])
        err = capsys.readouterr().err
        assert rc == RunStateError.exit_code == 8 and "is RUNNING" in err and len(err.strip().splitlines()) == 1
        assert "is RUNNING" in readme_exit_codes()[rc][0]
    finally:
        controller.kill()
        controller.wait()
