"""The part of bash that verl's run scripts use, read without running anything: ``hpcppo import-verl``'s reader.

verl's example scripts (``examples/*/run_*.sh`` at verl b178a3c) build the ``main_ppo`` command from variables:
``B=${B:-"${HOME}/b"}`` (a default that itself expands), ``$((1024 * 8))``, arrays spliced in with
``"${DATA[@]}"``, multi-line strings word-split by an unquoted ``$ACTOR_CONFIG``, ``export``, ``if``/``fi``. This
module expands what bash would expand, in the script's order, and marks what it cannot know:

- a variable the script sets: its value (arrays too);
- a variable the script does not set but the environment does: the environment's value, marked so that a path can
  keep ``${NAME}`` for compile to resolve on the cluster (see :func:`resolve`);
- ``${NAME:-default}`` (``-``, ``:=``, ``=``, ``:+``, ``+``) with NAME unset in the script and the environment: what
  bash gives, the default;
- anything else (``$NAME`` set nowhere, ``$(date)``, a variable assigned inside ``if``/``case``/``for``, ``${x%y}``
  string surgery): marked unknown, with the text as written and why, never replaced by a guess.

Nothing here executes a command. No torch.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcppo.verl.lex import Command, arith, scan, skip_dollar, skip_quoted

__all__ = ["Script", "read_script", "resolve", "UNKNOWN_OPEN", "ENV_OPEN"]

# Marks inside expanded text (private-use code points: they do not occur in scripts). An unknown span holds the text
# as written and why it is unknown, split by US; an environment span holds the variable's name.
UNKNOWN_OPEN, UNKNOWN_CLOSE, ENV_OPEN, ENV_CLOSE, US = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004"
_SPAN = re.compile(f"{UNKNOWN_OPEN}([^{UNKNOWN_CLOSE}]*){UNKNOWN_CLOSE}|{ENV_OPEN}(\\w+){ENV_CLOSE}")
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_OPEN_BLOCK = {"if": "if/fi", "while": "while/done", "until": "until/done", "for": "for/done", "case": "case/esac",
               "select": "select/done"}
_CLOSE_BLOCK = {"fi", "done", "esac"}
_LEADING = {"then", "do", "{", "}", "!", "time"}
_DECLARE = {"export", "declare", "typeset", "local", "readonly"}


def _unknown(text: str, why: str) -> str:
    return f"{UNKNOWN_OPEN}{text}{US}{why}{UNKNOWN_CLOSE}"


def resolve(text: str, environ: Mapping[str, str]) -> tuple[str, str, list[tuple[str, str]]]:
    """``(value, portable, unknowns)`` of expanded text: environment variables as their values, and as ``${NAME}``
    in ``portable``; each unknown span as written, listed with why."""
    unknowns: list[tuple[str, str]] = []

    def value(mo: re.Match[str]) -> str:
        if mo.group(2) is not None:
            return environ.get(mo.group(2), "")
        written, _, why = mo.group(1).partition(US)
        unknowns.append((written, why))
        return written

    def portable(mo: re.Match[str]) -> str:
        return "${" + mo.group(2) + "}" if mo.group(2) is not None else mo.group(1).partition(US)[0]

    return _SPAN.sub(value, text), _SPAN.sub(portable, text), unknowns


@dataclass
class _Block:
    kind: str  # "if/fi", "for/done" ...
    mode: str  # "run": bash runs this branch; "skip": it does not; "uncertain": not known here
    taken: bool | None  # an if: a branch has run (True), none yet (False), not known (None)


@dataclass
class Script:
    """What reading a script found: the verl command's words (expanded, with marks), the notes, the variables."""

    environ: Mapping[str, str]
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    uncertain: dict[str, str] = field(default_factory=dict)  # name -> why its value is not known
    notes: list[str] = field(default_factory=list)
    command: list[str] | None = None  # the words after main_ppo
    module: str = ""  # the verl entry point the command runs (verl.trainer.main_ppo, a recipe's ...)
    command_line: int = 0
    loose: list[tuple[int, list[str]]] = field(default_factory=list)  # key=value lines outside a verl command
    _depth: list[_Block] = field(default_factory=list)
    _noted: set[str] = field(default_factory=set)

    # -- one word -> fields
    def expand(self, raw: str, split: bool = True) -> list[str]:
        fields: list[str] = []
        cur: list[str] | None = None  # None: no field started yet

        def add(text: str, quoted: bool) -> None:
            nonlocal cur
            if quoted or not split:
                cur = (cur or []) + [text]
                return
            for k, piece in enumerate(_split_fields(text)):
                if k > 0 or piece is None:
                    if cur is not None:
                        fields.append("".join(cur))
                    cur = None
                if piece:
                    cur = (cur or []) + [piece]

        i, n = 0, len(raw)
        while i < n:
            ch = raw[i]
            if ch == "'":
                j = skip_quoted(raw, i, "'")
                add(raw[i + 1:j - 1], True)
                i = j
            elif ch == '"':
                j = skip_quoted(raw, i, '"')
                inner = raw[i + 1:j - 1]
                many = re.fullmatch(r"\$\{(\w+)\[[@]\]\}", inner)
                if inner in ("$@", "${@}", "$*", "${*}"):  # "$@": one field per argument, and there are none
                    self._special(inner.strip("${}"), inner)
                elif many and split:  # "${ARR[@]}": one field per element
                    if cur is not None:
                        fields.append("".join(cur))
                        cur = None
                    fields.extend(self._array(many.group(1), raw))
                else:
                    add(self._dquote(inner), True)
                i = j
            elif ch == "\\":
                add(raw[i + 1:i + 2], True)
                i += 2
            elif ch == "$":
                text, i = self._dollar(raw, i)
                add(text, False)
            elif ch == "`":
                j = skip_quoted(raw, i, "`")
                add(_unknown(raw[i:j], "a command's output is not known here"), False)
                i = j
            else:
                j = i
                while j < n and raw[j] not in "'\"\\$`":
                    j += 1
                add(raw[i:j], True)
                i = j
        if cur is not None:
            fields.append("".join(cur))
        return fields

    def scalar(self, raw: str) -> str:
        return "".join(self.expand(raw, split=False))

    def _dquote(self, inner: str) -> str:
        out, i = [], 0
        while i < len(inner):
            ch = inner[i]
            if ch == "\\" and inner[i + 1:i + 2] in ('"', "\\", "$", "`", "\n"):
                out.append(inner[i + 1])
                i += 2
            elif ch == "$":
                text, i = self._dollar(inner, i)
                out.append(text)
            elif ch == "`":
                j = skip_quoted(inner, i, "`")
                out.append(_unknown(inner[i:j], "a command's output is not known here"))
                i = j
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def _dollar(self, raw: str, i: int) -> tuple[str, int]:
        nxt = raw[i + 1:i + 2]
        if raw.startswith("$((", i):
            j = skip_dollar(raw, i)
            return self._arithmetic(raw[i:j], raw[i + 3:j - 2]), j
        if nxt == "(":
            j = skip_dollar(raw, i)
            return _unknown(raw[i:j], "a command's output is not known here"), j
        if nxt == "{":
            j = skip_dollar(raw, i)
            return self._braced(raw[i:j], raw[i + 2:j - 1]), j
        mo = _NAME.match(raw, i + 1)
        if mo:
            return self._lookup(mo.group(0), raw[i:mo.end()]), mo.end()
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            return self._special(nxt, raw[i:i + 2]), i + 2
        return "$", i + 1

    def _special(self, name: str, written: str) -> str:
        if name in "@*":
            self._note(written, f"{written}: the script's own arguments are not known here; add them to the input")
            return ""
        if name == "#":
            return "0"
        if name.isdigit() and name != "0":
            self._note(written, f"{written}: the script is read as run without arguments ({written} unset)")
            return _unknown(written, f"{written} is the script's argument {name}, not known here")
        return _unknown(written, f"{written} is known only when the script runs")

    def _lookup(self, name: str, written: str) -> str:
        """``$NAME``: the script's value, the environment's (marked), or unknown."""
        if name in self.uncertain:
            return _unknown(written, self.uncertain[name])
        if name in self.variables:
            value = self.variables[name]
            return value[0] if isinstance(value, list) and value else value if isinstance(value, str) else ""
        if name in self.environ:
            return f"{ENV_OPEN}{name}{ENV_CLOSE}"
        return _unknown(written, f"${name} is set neither by the script nor in this environment")

    def _is_set(self, name: str, colon: bool) -> bool | None:
        """Whether bash would see NAME as set (``:`` ops: set and not empty); None when not known."""
        if name in self.uncertain:
            return None
        if name in self.variables:
            value = self.variables[name]
            return bool(value) or not colon
        if name in self.environ:
            return bool(self.environ[name]) or not colon
        return False

    def _braced(self, written: str, body: str) -> str:
        if body[:1] in ("@", "*"):  # ${@:2} and the like: the script's arguments again
            return self._special(body[0], written)
        mo = re.fullmatch(r"(\w+)(?:\[(@|\*|\d+)\])?(?:(:?[-=+?])(.*))?", body, re.S)
        if mo is None:  # ${#x}, ${x%y}, ${x/a/b}, ${x:0:3} ...
            return _unknown(written, f"{written}: bash's string operations are not evaluated here")
        name, index, op, word = mo.groups()
        if name.isdigit() or name in "@*#":
            if op is None:
                return self._special(name, written)
            if name == "@" or name == "*":
                return self._special(name, written)
            if op[-1] in "-=":
                self._note(written, f"{written}: the script is read as run without arguments, so the default")
                return self.scalar(word)
            return "" if op[-1] == "+" else _unknown(written, f"{written}: the script's argument is not known here")
        if index is not None and index not in "@*":
            value = self.variables.get(name)
            if name in self.uncertain:
                return _unknown(written, self.uncertain[name])
            if isinstance(value, list):
                k = int(index)
                return value[k] if k < len(value) else ""
            if isinstance(value, str) and index == "0":
                return value
            return _unknown(written, f"{written}: not an array the script sets")
        if index is not None:  # unquoted ${ARR[@]}: the elements, joined (split again by the caller)
            return " ".join(self._array(name, written))
        if op is None:
            return self._lookup(name, written)
        is_set = self._is_set(name, op.startswith(":"))
        if is_set is None:
            return _unknown(written, self.uncertain[name])
        kind = op[-1]
        if kind == "+":
            return self.scalar(word) if is_set else ""
        if is_set:
            return self._lookup(name, "$" + name)
        if kind == "?":
            return _unknown(written, f"{written}: bash stops here when {name} is unset")
        value = self.scalar(word)
        if kind == "=":
            self.variables[name] = value
        return value

    def _array(self, name: str, written: str) -> list[str]:
        if name in self.uncertain:
            return [_unknown(written, self.uncertain[name])]
        value = self.variables.get(name)
        if isinstance(value, list):
            return list(value)
        if isinstance(value, str):
            return [value]
        return [_unknown(written, f"{written}: {name} is not an array the script sets")]

    def _arithmetic(self, written: str, expr: str) -> str:
        def var(mo: re.Match[str]) -> str:
            return self._lookup(mo.group(1) or mo.group(2), mo.group(0))

        text = self._dquote(expr)  # $x and ${x} inside
        text = re.sub(r"(?<![\w\ue002])([A-Za-z_]\w*)(?![\w\ue003])|\$(\w+)", var, text)
        value, _, unknowns = resolve(text, self.environ)
        if unknowns:
            return _unknown(written, f"{written}: {unknowns[0][1]}")
        try:
            return str(arith(ast.parse(value.strip() or "0", mode="eval")))
        except (ValueError, SyntaxError, TypeError, OverflowError) as exc:
            return _unknown(written, f"{written}: not evaluated ({exc})")

    def _note(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    # -- commands
    def assign(self, word: str, line: int) -> None:
        mo = _ASSIGN.match(word)
        assert mo is not None
        name, append, raw = mo.groups()
        if raw.startswith("(") and raw.endswith(")"):
            value: str | list[str] = [f for c in scan(raw[1:-1]) for w in c.words for f in self.expand(w)]
        else:
            value = self.scalar(raw)
        if self._uncertain_block():
            self.uncertain[name] = (f"${name} is assigned inside {self._uncertain_block()} (line {line}): which "
                                    f"branch runs is not known here")
            self.variables.pop(name, None)
            return
        self.uncertain.pop(name, None)
        if append and name in self.variables:
            old = self.variables[name]
            if isinstance(old, list) and isinstance(value, list):
                value = old + value
            else:
                value = _joined(old) + _joined(value)
        self.variables[name] = value

    # -- blocks: an if whose condition is known runs only its taken branch, as bash would
    def _skipping(self) -> bool:
        return any(b.mode == "skip" for b in self._depth)

    def _uncertain_block(self) -> str | None:
        return next((b.kind for b in reversed(self._depth) if b.mode == "uncertain"), None)

    def condition(self, words: list[str]) -> bool | None:
        """``[ a = b ]``, ``[[ a == b ]]``, ``!=``, ``-n``, ``-z`` on known values; None for anything else."""
        if len(words) < 2 or (words[0], words[-1]) not in (("[", "]"), ("[[", "]]")):
            return None
        inner = words[1:-1]
        values = []
        for w in inner:
            value, _, unknowns = resolve(self.scalar(w), self.environ)
            if unknowns:
                return None
            values.append(value)
        if len(values) == 3 and values[1] in ("=", "==", "!="):
            pattern = inner[2]
            equal = fnmatch.fnmatchcase(values[0], values[2]) if words[0] == "[[" and not pattern.startswith(("'", '"')) \
                else values[0] == values[2]
            return equal if values[1] != "!=" else not equal
        if len(values) == 2 and values[0] in ("-n", "-z"):
            return bool(values[1]) == (values[0] == "-n")
        if len(values) == 1:
            return bool(values[0])
        return None

    def _branch(self, head: str, rest: list[str]) -> None:
        """if / elif / else / fi and the other blocks: which branch runs, when it can be known."""
        if head in _CLOSE_BLOCK:
            if self._depth:
                self._depth.pop()
            return
        if head in _OPEN_BLOCK:
            if self._skipping():
                self._depth.append(_Block(_OPEN_BLOCK[head], "skip", True))
            elif head == "if":
                known = self.condition(rest)
                self._depth.append(_Block("if/fi", {True: "run", False: "skip", None: "uncertain"}[known], known))
            else:  # loops and case: which body runs, and how often, is not known here
                self._depth.append(_Block(_OPEN_BLOCK[head], "uncertain", None))
            return
        if not self._depth:
            return
        block = self._depth[-1]
        if block.taken is True:
            block.mode = "skip"
        elif head == "elif" and block.taken is False:
            known = self.condition(rest)
            block.mode, block.taken = {True: "run", False: "skip", None: "uncertain"}[known], known
        else:  # else after branches not taken, or anything after an unknown condition
            block.mode = "run" if block.taken is False else "uncertain"

    def run(self, cmd: Command) -> None:
        words = list(cmd.words)
        while words and words[0] in _LEADING:
            words.pop(0)
        if words and words[0] in ("elif", "else"):
            self._branch(words[0], words[1:] if words[0] == "elif" else [])
            words = words[1:] if words[0] == "else" else []
        if words and words[0].endswith(")") and self._depth and self._depth[-1].kind == "case/esac" \
                and "=" not in words[0]:
            words.pop(0)  # a case pattern
        if not words:
            return
        head = words[0]
        if head in _OPEN_BLOCK or head in _CLOSE_BLOCK:
            self._branch(head, words[1:])
            return
        if self._skipping():
            return
        if head == "function" or re.fullmatch(r"[A-Za-z_][\w-]*\(\)", head):
            return
        if head in _DECLARE:
            for w in words[1:]:
                if _ASSIGN.match(w):
                    self.assign(w, cmd.line)
            return
        if head == "unset":
            for w in words[1:]:
                self.variables.pop(w, None)
                self.uncertain.pop(w, None)
            return
        k = 0
        while k < len(words) and _ASSIGN.match(words[k]):
            k += 1
        if k == len(words):  # only assignments
            for w in words:
                self.assign(w, cmd.line)
            return
        # verl's trainer, and the one-step-off and fully async recipes' (verl/experimental/*_policy at b178a3c)
        module = next((j for j, w in enumerate(words) if "main_ppo" in w or "fully_async_main" in w), None)
        if module is not None:
            if self.command is not None:
                self.notes.append(f"line {cmd.line}: a second verl command; only the first is imported")
                return
            for w in words[:k]:
                self.notes.append(f"environment variable {self.scalar(w).split(US)[0]} for the verl command: not a "
                                  f"setting (the site's [env.vars] sets job variables)")
            self.command = [f for w in words[module + 1:] for f in self.expand(w)]
            self.module = words[module]
            self.command_line = cmd.line
            return
        if head in ("source", "."):
            self.notes.append(f"line {cmd.line}: {' '.join(words)[:80]}: the sourced file is not read; variables it "
                              f"sets are not known here")
            return
        expanded = [f for w in words for f in self.expand(w)]
        if expanded and all("=" in t and "." in t.partition("=")[0] for t in expanded):
            self.loose.append((cmd.line, expanded))


def _joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else " ".join(value)


def _split_fields(text: str) -> list[str | None]:
    """Word splitting of an unquoted expansion: pieces between whitespace, marks kept whole. A leading or trailing
    ``None`` says the text began or ended with whitespace (it ends the current field)."""
    pieces: list[str | None] = []
    cur, i = "", 0
    started_blank = bool(text) and text[0] in " \t\n"
    while i < len(text):
        ch = text[i]
        if ch in (UNKNOWN_OPEN, ENV_OPEN):
            close = UNKNOWN_CLOSE if ch == UNKNOWN_OPEN else ENV_CLOSE
            j = text.find(close, i)
            j = len(text) if j < 0 else j + 1
            cur += text[i:j]
            i = j
        elif ch in " \t\n":
            if cur:
                pieces.append(cur)
                cur = ""
            i += 1
        else:
            cur += ch
            i += 1
    ended_blank = bool(text) and text[-1] in " \t\n"
    out: list[str | None] = [None] if started_blank else []
    out += pieces + ([cur] if cur else [])
    if ended_blank:
        out.append(None)
    return out


def read_script(text: str, environ: Mapping[str, str]) -> Script:
    """Read a script (or a pasted command line) in order: variables, then the verl command's words."""
    script = Script(environ=environ)
    for cmd in scan(text.replace("\r\n", "\n")):  # a pipe or redirection ends a command (`2>&1 | tee log`)
        script.run(cmd)
    return script
