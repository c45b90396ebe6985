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
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

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
_LEADING = {"then", "else", "do", "{", "}", "!", "time", "elif"}
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


# ------------------------------------------------------------------------------------------------ scanning

@dataclass
class _Command:
    line: int
    words: list[str] = field(default_factory=list)  # raw words, quotes kept
    ends_with: str = ""  # the operator after it: ";", "&&", "|", ...
    redirected: bool = False


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """Index just past the closing ``quote`` of a quoted string opening at ``i`` (or the end of the text)."""
    j = i + 1
    while j < len(text) and text[j] != quote:
        if quote == '"' and text[j] == "\\":
            j += 1
        elif quote == '"' and text[j] == "$" and j + 1 < len(text) and text[j + 1] in "({":
            j = _skip_dollar(text, j) - 1
        elif quote == '"' and text[j] == "`":
            j = _skip_quoted(text, j, "`") - 1
        j += 1
    return min(j + 1, len(text))


def _skip_group(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the ``close`` matching the ``open_`` at ``i``, quotes respected."""
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch in "'\"`" and not (ch == "'" and open_ == "{"):
            j = _skip_quoted(text, j, ch)
            continue
        if ch == "'" and open_ == "{":  # ${x:-'a}'}: quotes count inside ${} too
            j = _skip_quoted(text, j, ch)
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def _skip_dollar(text: str, i: int) -> int:
    """Index past the ``$(...)``, ``$((...))`` or ``${...}`` starting at ``i``."""
    return _skip_group(text, i + 1, text[i + 1], ")" if text[i + 1] == "(" else "}")


def _scan(text: str) -> list[_Command]:
    """Commands with their raw words: continuations joined, comments dropped, arrays kept as one word."""
    commands: list[_Command] = []
    cur = _Command(1)
    line, i, n = 1, 0, len(text)

    def finish(op: str) -> None:
        nonlocal cur
        cur.ends_with = op
        if cur.words or cur.redirected:
            commands.append(cur)
        cur = _Command(line)

    while i < n:
        ch = text[i]
        if ch == "\\" and text[i + 1:i + 2] == "\n":
            i, line = i + 2, line + 1
            continue
        if ch in " \t\r":
            i += 1
            continue
        if ch == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if ch == "\n":
            line += 1
            i += 1
            finish(";")
            continue
        if ch in ";&|":
            op = text[i:i + 2] if text[i:i + 2] in ("&&", "||", ";;", "|&") else ch
            i += len(op)
            finish(op)
            continue
        if ch in "<>":
            i = _skip_redirect(text, i)
            cur.redirected = True
            continue
        if not cur.words:
            cur.line = line
        start = i
        while i < n and text[i] not in " \t\r\n;&|<>":
            c = text[i]
            if c == "\\":
                i += 2
            elif c in "'\"`":
                i = _skip_quoted(text, i, c)
            elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
                i = _skip_dollar(text, i)
            elif c == "(" and re.fullmatch(r"[A-Za-z_]\w*\+?=", text[start:i]):
                i = _skip_group(text, i, "(", ")")  # NAME=( ... ): an array, newlines and comments inside
            else:
                i += 1
        word = text[start:i]
        if word.isdigit() and i < n and text[i] in "<>":  # 2>&1: the fd is part of the redirection
            continue
        line += word.count("\n")
        cur.words.append(word.replace("\\\n", ""))  # a line continuation inside a word (`'x'\` at a line's end)
    finish(";")
    return commands


def _skip_redirect(text: str, i: int) -> int:
    j = i
    while j < len(text) and text[j] in "<>&":
        j += 1
    while j < len(text) and text[j] in " \t":
        j += 1
    while j < len(text) and text[j] not in " \t\r\n;&|<>":
        j = _skip_quoted(text, j, text[j]) if text[j] in "'\"" else j + 1
    return j


# ------------------------------------------------------------------------------------------------ expanding

_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
              ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def _arith(node: ast.AST) -> int:
    """bash's integer arithmetic on a parsed expression: ``/`` truncates toward zero, as C does."""
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _arith(node.left), _arith(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            if b == 0:
                raise ValueError("division by zero")
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if isinstance(node.op, ast.Pow) and abs(b) > 64:
            raise ValueError("exponent too large")
        if type(node.op) in _ARITH_OPS:
            result: int = _ARITH_OPS[type(node.op)](a, b)
            return result
    raise ValueError("not integer arithmetic")


@dataclass
class Script:
    """What reading a script found: the verl command's words (expanded, with marks), the notes, the variables."""

    environ: Mapping[str, str]
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    uncertain: dict[str, str] = field(default_factory=dict)  # name -> why its value is not known
    notes: list[str] = field(default_factory=list)
    command: list[str] | None = None  # the words after main_ppo
    command_line: int = 0
    loose: list[tuple[int, list[str]]] = field(default_factory=list)  # key=value lines outside a verl command
    _depth: list[str] = field(default_factory=list)
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
                j = _skip_quoted(raw, i, "'")
                add(raw[i + 1:j - 1], True)
                i = j
            elif ch == '"':
                j = _skip_quoted(raw, i, '"')
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
                j = _skip_quoted(raw, i, "`")
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
                j = _skip_quoted(inner, i, "`")
                out.append(_unknown(inner[i:j], "a command's output is not known here"))
                i = j
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def _dollar(self, raw: str, i: int) -> tuple[str, int]:
        nxt = raw[i + 1:i + 2]
        if raw.startswith("$((", i):
            j = _skip_dollar(raw, i)
            return self._arithmetic(raw[i:j], raw[i + 3:j - 2]), j
        if nxt == "(":
            j = _skip_dollar(raw, i)
            return _unknown(raw[i:j], "a command's output is not known here"), j
        if nxt == "{":
            j = _skip_dollar(raw, i)
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
            return str(_arith(ast.parse(value.strip() or "0", mode="eval")))
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
            value: str | list[str] = [f for c in _scan(raw[1:-1]) for w in c.words for f in self.expand(w)]
        else:
            value = self.scalar(raw)
        if self._depth:
            self.uncertain[name] = (f"${name} is assigned inside {self._depth[-1]} (line {line}): which branch runs "
                                    f"is not known here")
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

    def run(self, cmd: _Command) -> None:
        words = list(cmd.words)
        while words and words[0] in _LEADING:
            words.pop(0)
        if words and words[0].endswith(")") and self._depth and self._depth[-1] == "case/esac" and "=" not in words[0]:
            words.pop(0)  # a case pattern
        if not words:
            return
        head = words[0]
        if head in _OPEN_BLOCK:
            self._depth.append(_OPEN_BLOCK[head])
            return
        if head in _CLOSE_BLOCK:
            if self._depth:
                self._depth.pop()
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
        module = next((j for j, w in enumerate(words) if "main_ppo" in w), None)
        if module is not None:
            if self.command is not None:
                self.notes.append(f"line {cmd.line}: a second verl command; only the first is imported")
                return
            for w in words[:k]:
                self.notes.append(f"environment variable {self.scalar(w).split(US)[0]} for the verl command: not a "
                                  f"setting (the site's [env.vars] sets job variables)")
            self.command = [f for w in words[module + 1:] for f in self.expand(w)]
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
    for cmd in _scan(text.replace("\r\n", "\n")):  # a pipe or redirection ends a command (`2>&1 | tee log`)
        script.run(cmd)
    return script
