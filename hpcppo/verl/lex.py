"""The words of a bash script, as :mod:`hpcppo.verl.shell` reads verl's run scripts: quoting, ``$(...)`` and
``${...}`` groups, commands split at ``;``, ``&&``, pipes and new lines (redirections dropped), and bash's integer
arithmetic for ``$((...))``. Nothing here runs or expands anything. No torch.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

__all__ = ["ARITH_OPS", "Command", "arith", "scan", "skip_dollar", "skip_group", "skip_quoted", "skip_redirect",
           "quote_end", "UnterminatedQuoteError"]

# ------------------------------------------------------------------------------------------------ scanning

@dataclass
class Command:
    line: int
    words: list[str] = field(default_factory=list)  # raw words, quotes kept
    ends_with: str = ""  # the operator after it: ";", "&&", "|", ...
    redirected: bool = False


class UnterminatedQuoteError(ValueError):
    """A quote that nothing closes: bash -n refuses the script ("unexpected EOF while looking for matching")."""

    def __init__(self, quote: str, line: int):
        super().__init__(f"the {quote} quote opened here is never closed (everything after it would be one word)")
        self.quote, self.line = quote, line


def skip_quoted(text: str, i: int, quote: str) -> int:
    """Index just past the closing ``quote`` of a quoted string opening at ``i`` (or the end of the text)."""
    end = quote_end(text, i, quote)
    return len(text) if end is None else end


def quote_end(text: str, i: int, quote: str) -> int | None:
    """Index just past the closing ``quote`` of a quoted string opening at ``i``; None when nothing closes it."""
    j = i + 1
    while j < len(text) and text[j] != quote:
        if quote == '"' and text[j] == "\\":
            j += 1
        elif quote == '"' and text[j] == "$" and j + 1 < len(text) and text[j + 1] in "({":
            j = skip_dollar(text, j) - 1
        elif quote == '"' and text[j] == "`":
            j = skip_quoted(text, j, "`") - 1
        j += 1
    return j + 1 if j < len(text) else None


def skip_group(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the ``close`` matching the ``open_`` at ``i``, quotes respected."""
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch in "'\"`" and not (ch == "'" and open_ == "{"):
            j = skip_quoted(text, j, ch)
            continue
        if ch == "'" and open_ == "{":  # ${x:-'a}'}: quotes count inside ${} too
            j = skip_quoted(text, j, ch)
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def skip_dollar(text: str, i: int) -> int:
    """Index past the ``$(...)``, ``$((...))`` or ``${...}`` starting at ``i``."""
    return skip_group(text, i + 1, text[i + 1], ")" if text[i + 1] == "(" else "}")


def scan(text: str) -> list[Command]:
    """Commands with their raw words: continuations joined, comments dropped, arrays kept as one word."""
    commands: list[Command] = []
    cur = Command(1)
    line, i, n = 1, 0, len(text)

    def finish(op: str) -> None:
        nonlocal cur
        cur.ends_with = op
        if cur.words or cur.redirected:
            commands.append(cur)
        cur = Command(line)

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
            i = skip_redirect(text, i)
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
                end = quote_end(text, i, c)
                if end is None:
                    raise UnterminatedQuoteError(c, line + text.count("\n", start, i))
                i = end
            elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
                i = skip_dollar(text, i)
            elif c == "(" and re.fullmatch(r"[A-Za-z_]\w*\+?=", text[start:i]):
                i = skip_group(text, i, "(", ")")  # NAME=( ... ): an array, newlines and comments inside
            else:
                i += 1
        word = text[start:i]
        if word.isdigit() and i < n and text[i] in "<>":  # 2>&1: the fd is part of the redirection
            continue
        line += word.count("\n")
        cur.words.append(word.replace("\\\n", ""))  # a line continuation inside a word (`'x'\` at a line's end)
    finish(";")
    return commands


def skip_redirect(text: str, i: int) -> int:
    j = i
    while j < len(text) and text[j] in "<>&":
        j += 1
    while j < len(text) and text[j] in " \t":
        j += 1
    while j < len(text) and text[j] not in " \t\r\n;&|<>":
        j = skip_quoted(text, j, text[j]) if text[j] in "'\"" else j + 1
    return j


# ------------------------------------------------------------------------------------------------ arithmetic

ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
              ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def arith(node: ast.AST) -> int:
    """bash's integer arithmetic on a parsed expression: ``/`` truncates toward zero, as C does."""
    if isinstance(node, ast.Expression):
        return arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = arith(node.left), arith(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            if b == 0:
                raise ValueError("division by zero")
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if isinstance(node.op, ast.Pow) and abs(b) > 64:
            raise ValueError("exponent too large")
        if type(node.op) in ARITH_OPS:
            result: int = ARITH_OPS[type(node.op)](a, b)
            return result
    raise ValueError("not integer arithmetic")
