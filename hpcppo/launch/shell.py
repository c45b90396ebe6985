"""Shell quoting for every user value that reaches a rendered script.

Two forms:
- :func:`quote` — a single-quoted shell word: nothing inside is ever expanded or executed.
- :func:`quote_env` — a double-quoted word in which only ``${NAME}`` references expand (so a site can
  write ``HF_HOME=/scratch/${USER}/hf``); every other ``$``, backtick, backslash and quote is escaped,
  so ``$(...)``, backticks, ``;`` and newlines stay inert text.
Setup lines are one command each: :func:`quote_command` splits them into words (``shlex``) and quotes
every word (``${NAME}`` references stay live, as in :func:`quote_env`), so a line cannot chain, pipe,
substitute or redirect.
"""

from __future__ import annotations

import re
import shlex

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def quote(value: object) -> str:
    """Quote ``value`` as one inert shell word."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def _escape_dq(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")


def quote_env(value: object) -> str:
    """Double-quote ``value`` keeping ``${NAME}`` references live and everything else inert."""
    text = str(value)
    out, pos = [], 0
    for m in _VAR_REF_RE.finditer(text):
        out.append(_escape_dq(text[pos : m.start()]))
        out.append("${" + m.group(1) + "}")
        pos = m.end()
    out.append(_escape_dq(text[pos:]))
    return '"' + "".join(out) + '"'


def quote_word(value: object) -> str:
    """One inert shell word in which ``${NAME}`` references expand (plain :func:`quote` when it has none)."""
    text = str(value)
    return quote_env(text) if _VAR_REF_RE.search(text) else quote(text)


def quote_command(line: str) -> str:
    """Render a setup line as one command whose words are all quoted (no chaining, no substitution).

    ``${NAME}`` references inside a word still expand (``source ${HOME}/venvs/rl/bin/activate``), as in
    environment variable values; ``$(...)``, backticks, ``;``, ``|``, ``&&``, redirections, globs and
    ``~`` stay literal text.
    """
    try:
        words = shlex.split(line, comments=False, posix=True)
    except ValueError:
        # Unbalanced quotes: keep the text as one inert word rather than guess.
        words = [line]
    return " ".join(quote_word(w) for w in words)


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME_RE.match(name))


RUN_DIR_VARIABLE = "HPCPPO_RUN_DIR"
"""The variable the job scripts set to their run directory (``HPCPPO_RUN_DIR=<quoted path>``, templates/)."""


def script_run_dir(text: str) -> str | None:
    """The run directory a rendered job script runs in (its ``HPCPPO_RUN_DIR=`` line, unquoted); None when the
    script has no such line, or it is not one plain assignment (a site's own template)."""
    prefix = f"{RUN_DIR_VARIABLE}="
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                words = shlex.split(line[len(prefix):])
            except ValueError:
                return None
            return words[0] if len(words) == 1 else None
    return None
