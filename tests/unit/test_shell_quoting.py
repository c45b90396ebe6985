"""Every user value reaches a rendered script inert: checked by running bash on the output."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.launch.shell import quote, quote_command, quote_env

NASTY = [
    "$(touch {marker})",
    "`touch {marker}`",
    "a; touch {marker}",
    "a\ntouch {marker}",
    "a && touch {marker} || true",
    "'; touch {marker}; '",
    '"; touch {marker}; "',
    "$(echo) ${{IFS}}touch${{IFS}}{marker}",
    "\\$(touch {marker})",
    "x > {marker}",
]


def _bash(script: str) -> subprocess.CompletedProcess:
    # bytes, not text=True: universal newlines would turn a literal "\r" into "\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, timeout=10)
    out.stdout = out.stdout.decode("utf-8", "surrogateescape")
    return out


@pytest.mark.parametrize("template", NASTY)
def test_quote_is_inert_and_round_trips(tmp_path, template):
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)
    out = _bash(f"printf '%s' {quote(value)}")
    assert out.returncode == 0
    assert out.stdout == value
    assert not marker.exists()


@pytest.mark.parametrize("template", NASTY)
def test_quote_env_is_inert_and_round_trips(tmp_path, template):
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)
    out = _bash(f"X={quote_env(value)}; printf '%s' \"$X\"")
    assert out.returncode == 0
    assert not marker.exists()
    # ${NAME} references expand (IFS here); everything else is literal.
    assert out.stdout == value.replace("${IFS}", " \t\n")


def test_quote_env_expands_only_braced_references():
    out = _bash(f"USER=alice; X={quote_env('/scratch/${USER}/hf $USER $(id -u)')}; printf '%s' \"$X\"")
    assert out.stdout == "/scratch/alice/hf $USER $(id -u)"


@pytest.mark.parametrize("template", NASTY)
def test_setup_line_is_one_inert_command(tmp_path, template):
    marker = tmp_path / "pwned"
    line = "echo " + template.format(marker=marker)
    subprocess.run(["bash", "-c", quote_command(line)], capture_output=True, text=True, timeout=10)
    assert not marker.exists()


def test_setup_line_keeps_its_arguments(tmp_path):
    target = tmp_path / "made it"
    subprocess.run(["bash", "-c", quote_command(f"touch '{target}'")], check=True, timeout=10)
    assert target.exists()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40))
def test_quote_round_trips_any_text(value):
    out = _bash(f"printf '%s' {quote(value)}")
    assert out.stdout == value


def test_setup_line_words_expand_braced_references_only(tmp_path):
    line = "printf '%s|' ${HOME}/venv $HOME ~ '*' $(id) `id`"
    out = subprocess.run(["bash", "-c", quote_command(line)], capture_output=True, text=True, timeout=10,
                         env={"HOME": "/home/alice", "PATH": "/usr/bin:/bin"}, cwd=tmp_path)  # fmt: skip
    assert out.stdout == "/home/alice/venv|$HOME|~|*|$(id)|`id`|"
