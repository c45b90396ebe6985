"""Bad input through ``hpcppo.cli.main``: one clear line on stderr, the error class's exit code, no
traceback, and no run directory left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import ConfigError, PathError, ResolveError, RunIdError, SchedulerError, SiteNotFoundError

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
    codes = [c.exit_code for c in (ConfigError, SiteNotFoundError, ResolveError, PathError, RunIdError, SchedulerError)]
    assert len(set(codes)) == len(codes) and 0 not in codes
