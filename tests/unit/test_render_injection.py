"""Shell syntax in user values renders inert: the rendered script's preamble is run by bash for real.

Values with ``$(...)``, backticks, ``;``, ``&&``, redirections and newlines go into env vars, NCCL
variables, setup lines and module names (through ``-o`` overrides, as a user would). The preamble of
the rendered script (everything before the rendezvous block) runs under bash with a ``module`` stub;
no marker file may appear, and every value must arrive as the literal text it was.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError
from hpcppo.launch import render

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"

PAYLOADS = [
    "$(touch {m})",
    "`touch {m}`",
    "a; touch {m}",
    "a\ntouch {m}",
    "a && touch {m}",
    "x > {m}",
    "'; touch {m}; '",
    '"; touch {m}; "',
    "${{IFS}}$(touch {m})",
]


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string (\n, \" escapes)


def _overrides(marker: Path) -> tuple[list[str], dict[str, str], list[str], list[str]]:
    values = [p.format(m=marker) for p in PAYLOADS]
    env_vars = {f"HPCPPO_T{i}": v for i, v in enumerate(values)}
    modules = [f"mod/{v}" for v in values]
    # setup lines: one command each; a user's payload is an argument of printf
    setup = ["printf '%s\\0' " + _shell_arg(v) for v in values]
    overrides = [
        "site.env.vars={" + ", ".join(f"{k} = {_toml_str(v)}" for k, v in env_vars.items()) + "}",
        "site.env.nccl={NCCL_T0 = " + _toml_str(values[0]) + "}",
        "site.env.modules=[" + ", ".join(_toml_str(m) for m in modules) + "]",
        "site.env.module_purge=true",
        "site.env.setup=[" + ", ".join(_toml_str(line) for line in setup) + "]",
    ]
    return overrides, env_vars, modules, values


def _shell_arg(value: str) -> str:
    """How a site author would write the payload as an argument in a setup line (shlex-quoted text)."""
    return shlex.quote(value)


def _preamble(site: str, overrides: list[str], run_dir: Path, monkeypatch) -> str:
    monkeypatch.setattr(render, "watchdog_available", lambda: True)
    c = compile_config(ARITH, site, overrides, check_paths=False)
    text = render.render(c.site, c.experiment, c.plan, run_dir, python="/usr/bin/false")
    cut = "# ---- rendezvous" if site != "local" else "\nexec "
    assert cut in text
    return text[: text.index(cut)]


@pytest.mark.parametrize("site", ["local-slurm", "local"])
def test_preamble_runs_and_every_value_stays_literal(site, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    overrides, env_vars, modules, values = _overrides(marker)
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # the local script starts in it (cd), as a Slurm job does (--chdir)
    preamble = _preamble(site, overrides, run_dir, monkeypatch)
    modlog, envdump, setuplog = tmp_path / "modules.log", tmp_path / "env.dump", tmp_path / "setup.log"
    # A `module` stub that records its arguments NUL-separated; setup output goes to setup.log.
    stub = f'module() {{ printf "%s\\0" "$@" >> {modlog}; }}\n'
    dump = "".join(f'printf "%s\\0" "${name}" >> {envdump}\n' for name in sorted(env_vars))
    script = stub + preamble + dump + 'printf "%s\\0" "$NCCL_T0" >> ' + str(envdump) + "\n"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1"}
    with open(setuplog, "wb") as out:
        proc = subprocess.run(["bash", "-c", script], stdout=out, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                              timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert not marker.exists(), "a value was executed"
    # every env value arrived literally; only ${NAME} references expand (documented: HF_HOME=/scratch/${USER}/hf)
    expanded = {k: v.replace("${IFS}", " \t\n") for k, v in env_vars.items()}
    assert envdump.read_bytes().split(b"\0")[:-1] == [expanded[k].encode() for k in sorted(env_vars)] + [values[0].encode()]
    # module purge, then one `module load NAME` per module with the name as one literal argument
    words = modlog.read_bytes().split(b"\0")[:-1]
    assert words == [b"purge"] + [w for m in modules for w in (b"load", m.encode())]
    # each setup line ran as one command (printf) with the payload as one literal argument
    out = re.sub(rb"^hpcppo: [^\n]*\n", b"", setuplog.read_bytes(), flags=re.M).split(b"\0")[:-1]
    assert out == [v.replace("${IFS}", " \t\n").encode() for v in values]


def test_setup_line_failure_stops_the_job(tmp_path, monkeypatch):
    """A failing environment step ends the preamble with exit 1 and says which step failed."""
    after = tmp_path / "reached"
    preamble = _preamble("local-slurm", ['site.env.setup=["false", "touch ' + str(after) + '"]'],
                         tmp_path / "run", monkeypatch)  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1"}
    proc = subprocess.run(["bash", "-c", preamble + f"touch {after}\n"], capture_output=True, text=True, env=env,
                          timeout=30)  # fmt: skip
    assert proc.returncode == 1
    assert "hpcppo: site environment step failed: false" in proc.stderr
    assert not after.exists()


def test_setup_line_expands_braced_variables_only(tmp_path, monkeypatch):
    out = tmp_path / "out"
    line = "printf '%s|' ${HOME}/venv $HOME ~ '*' $(id)"
    preamble = _preamble("local-slurm", [f"site.env.setup=[{_toml_str(line)}]"], tmp_path / "run", monkeypatch)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/alice", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1"}
    with open(out, "wb") as fh:
        subprocess.run(["bash", "-c", preamble], stdout=fh, env=env, cwd=tmp_path, timeout=30, check=True)
    printed = [line for line in out.read_text().splitlines() if not line.startswith("hpcppo:")]
    assert printed == ["/home/alice/venv|$HOME|~|*|$(id)|"]


@pytest.mark.parametrize("name", ["a$(touch /tmp/pwned)", "a`id`", "a;b", "a\nb", "a b", "../x"])
def test_experiment_name_with_shell_syntax_is_a_clean_config_error(name, tmp_path, capsys):
    with pytest.raises(ConfigError, match="name"):
        compile_config(ARITH, "local-slurm", [f"name={_toml_str(name)}"], check_paths=False)
    rc = main(["compile", str(ARITH), "--site", "local-slurm", "--no-check-paths", "--runs-root", str(tmp_path / "runs"),
               "-o", f"name={_toml_str(name)}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == ConfigError.exit_code
    assert err.startswith("hpcppo: error:") and "name" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("key", ["site.slurm.partition", "site.slurm.account", "site.slurm.extra_directives"])
def test_line_break_in_a_directive_value_is_refused_with_its_key(key, tmp_path, capsys):
    value = "debug\n#SBATCH --uid=0"
    override = f"{key}={{begin = {_toml_str(value)}}}" if key.endswith("directives") else f"{key}={_toml_str(value)}"
    rc = main(["compile", str(ARITH), "--site", "local-slurm", "--no-check-paths", "--runs-root", str(tmp_path / "r"),
               "-o", override])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == ConfigError.exit_code, err
    assert key in err and "line break" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_values_with_spaces_and_quotes_in_directives_are_quoted(monkeypatch, tmp_path):
    c = compile_config(ARITH, "local-slurm", ["site.slurm.extra_directives={comment = \"it's a $(test)\"}"],
                       check_paths=False)  # fmt: skip
    text = render.render(c.site, c.experiment, c.plan, tmp_path / "run dir", python="python3")
    assert "#SBATCH --comment='it'\"'\"'s a $(test)'" in text
    assert f"#SBATCH --chdir='{tmp_path}/run dir'" in text
