"""Reward functions with verl's signature, the built-in scorers, and loading of user functions.

Every reward function is called exactly as verl calls them, with keyword arguments::

    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs) -> float

so a ``compute_score`` written for verl works here unchanged (a dict with a ``"score"`` key is accepted too, as
verl does). :func:`build_reward_fn` turns a spec into such a function:

- ``"auto"``: dispatch on ``data_source`` exactly as verl's ``default_compute_score`` does
  (verl/utils/reward_score/__init__.py, volcengine/verl b178a3c): ``openai/gsm8k`` -> ``gsm8k`` (verl's strict
  rule), ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` -> ``math`` (verl's
  string-normalising math_reward), ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*`` -> ``math_dapo``
  (verl's Minerva-normalising math_dapo; both in :mod:`hpcppo.data.math_verl`), ``hpcppo/arith`` ->
  ``hpcppo.data.synthetic:score_with_pred``, ``hpcppo/arith-tool`` -> ``hpcppo.data.arith_tool:score_with_pred``; each is imported on first use. The sources verl scores with code
  hpcppo does not have (prime_math, sandboxed code, geometry3k, Search-R1) are refused, naming verl's scorer, as is
  an unknown data_source (verl raises NotImplementedError); both name ``data.reward_fn``.
- a built-in by name for every row: ``"gsm8k"``, ``"math"``, ``"math_verify"`` (verl's math_verify scorer, math-verify
  equivalence), ``"math_dapo"``, ``"arith"``, ``"arith_tool"``; options (``data.reward_kwargs``) as keyword arguments.
- ``"package.module:function"`` or ``"path/to/file.py:function"``: user code, options as keyword arguments. It is
  loaded and its signature checked at build time, so a typo fails before the job spends GPU time.

No torch here: config validation on the login node builds reward functions.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from hpcppo.errors import ConfigError, HpcppoError, PathError


#: What :func:`score_batch` records for a row whose reward function reported no ``pred``.
NO_PRED: Any = type("NoPred", (), {"__repr__": lambda self: "NO_PRED", "__reduce__": lambda self: "NO_PRED"})()


class RewardFunctionError(HpcppoError):
    """A reward function raised, or returned something that is not a finite number, while scoring a row."""


# ---------------------------------------------------------------------------------------------------------------
# GSM8K

GSM8K_CLIP_CHARS = 300  # verl looks only at the tail: the final answer is at the end, and regexes stay cheap
GSM8K_METHODS = ("strict", "flexible")

# strict is verl's rule to the letter (verl/utils/reward_score/gsm8k.py, volcengine/verl b178a3c): "####", exactly
# one space, then a run of digits, dots and commas with an optional leading minus; the last such run wins, its
# commas are dropped, and it must then equal the ground truth *as a string*. So "####18" (no space) and "#### $18"
# find no answer (0.0); "#### 18.00" and "#### 18." find one that is not "18" (format_score). Reward curves are
# then comparable with verl's.
_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")

# flexible reads numbers as people write them: an optional minus that is not glued to a preceding word or number
# (so "3-4" reads as 3 and 4, not 3 and -4), an optional currency sign, thousands separators only in groups of
# three (so "1,2,3" is three numbers, not 123), an optional decimal part. A trailing period ("18.") is not part of
# the number. ASCII digits only: re's \d also matches other scripts' digits, which Decimal would then accept.
_NUMBER = (
    r"(?P<neg>(?<![0-9A-Za-z])-)?(?:\$(?P<neg2>-)?)?"
    r"(?P<digits>(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
)
_NUMBER_RE = re.compile(_NUMBER)
_PLAIN_NUMBER_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def _match_to_text(match: re.Match[str]) -> str:
    negative = bool(match.group("neg") or match.group("neg2"))
    return ("-" if negative else "") + match.group("digits").replace(",", "")


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer a completion gives, or None if it gives none. Only the last :data:`GSM8K_CLIP_CHARS` characters
    are read.

    ``strict`` (verl's): the text after the last ``"#### "`` made of ``-``, digits, ``.`` and ``,``, commas removed
    and otherwise as written (``"18.00"``, ``"1.2.3"``). ``flexible``: the last number anywhere, normalised (no
    commas, no ``$``, no trailing period).
    """
    if method not in GSM8K_METHODS:
        raise ConfigError(f"unknown method {method!r}; allowed: {', '.join(GSM8K_METHODS)}", key="method")
    tail = solution_str[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT_RE.findall(tail)
        return found[-1].replace(",", "") if found else None
    last = None
    for last in _NUMBER_RE.finditer(tail):
        pass
    return None if last is None else _match_to_text(last)


def _as_decimal(text: str) -> Decimal | None:
    # Normalise what a ground truth or an answer may carry: spaces, thousands commas, currency, a final period.
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not _PLAIN_NUMBER_RE.fullmatch(cleaned):
        return None  # also keeps Decimal's own extras ("NaN", "1e5", "1_000") out
    return Decimal(cleaned)


def answers_match(answer: str, ground_truth: str) -> bool:
    """flexible's comparison: numeric equality ("18.00" == "18", "1,000" == "1000"), else equality of the stripped
    strings."""
    a, g = _as_decimal(answer), _as_decimal(str(ground_truth))
    if a is not None and g is not None:
        return a == g
    return answer.strip() == str(ground_truth).strip()


def gsm8k_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl's GSM8K rule: ``score`` if the extracted answer equals the ground truth, ``format_score`` if an answer
    was found but is wrong, 0.0 if none was found.

    ``strict`` compares strings, as verl does (``"18.00"`` is not ``"18"``); ``flexible`` compares numbers.
    """
    answer = extract_gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    correct = answer == ground_truth if method == "strict" else answers_match(answer, ground_truth)
    return float(score) if correct else float(format_score)


# ---------------------------------------------------------------------------------------------------------------
# Registry, loading, validation

#: built-in name -> "module:function" (imported lazily: the synthetic task lives in its own module)
BUILTINS: dict[str, str] = {
    "gsm8k": "hpcppo.data.rewards:gsm8k_compute_score",
    "arith": "hpcppo.data.synthetic:score_with_pred",  # compute_score plus the answer (validation's maj@k)
    "arith_tool": "hpcppo.data.arith_tool:score_with_pred",  # the final turn's answer (multi-turn tool use)
    "math": "hpcppo.data.math_verl:hendrycks_score",
    "math_verify": "hpcppo.data.math_reward:math_verify_compute_score",
    "math_dapo": "hpcppo.data.math_verl:minerva_score",
}
# default_compute_score's branches (distinct names: their order does not matter).
MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
MATH_DAPO_DATA_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
MATH_DAPO_PREFIX = "aime"  # verl: data_source.startswith("aime")
#: data_source -> built-in name, used by "auto"
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "hpcppo/arith": "arith",
    "hpcppo/arith-tool": "arith_tool",
    **dict.fromkeys(MATH_DATA_SOURCES, "math"),
    **dict.fromkeys(MATH_DAPO_DATA_SOURCES, "math_dapo"),
}
#: data_source prefix -> built-in name (verl: every data_source starting with "aime" is scored as math_dapo)
DATA_SOURCE_PREFIXES: dict[str, str] = {MATH_DAPO_PREFIX: "math_dapo"}
#: data sources default_compute_score scores with a module hpcppo does not have: data_source -> verl's scorer
VERL_ONLY_SOURCES: dict[str, str] = {
    **dict.fromkeys(("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                     "numina_cn_k12", "numina_olympiads"), "prime_math (sympy-based grading)"),
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco"), "sandbox_fusion or prime_code (runs the code)"),
    "hiyouga/geometry3k": "geo3k (a vision-language task)",
    **dict.fromkeys(("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                     "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"),
                    "search_r1_like_qa_em (exact match for Search-R1)"),
}


def builtin_for(data_source: str) -> str | None:
    """The built-in that "auto" scores ``data_source`` with, or None."""
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    return next((b for p, b in DATA_SOURCE_PREFIXES.items() if str(data_source).startswith(p)), None)


def known_data_sources() -> str:
    """The data sources "auto" knows, as error messages list them."""
    return ", ".join([*DATA_SOURCES, *(f"{p}* (any name starting with {p!r})" for p in DATA_SOURCE_PREFIXES)])
_CALL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
# The spec keys these errors are about (a test checks that every key an error names exists).
REWARD_KEY = "data.reward_fn"
GSM8K_METHOD_KEY = "data.gsm8k_method"


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``package.module:function`` or ``path/to/file.py:function`` and return the callable."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(
            f"reward function {spec!r} is not a built-in ({', '.join(['auto', *BUILTINS])}) and not of the form "
            "'package.module:function' or 'path/to/file.py:function'", key=REWARD_KEY)
    if module_part.endswith(".py") or "/" in module_part:
        module = _import_file(Path(module_part), spec)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"reward function {spec!r}: no module named {exc.name!r}", key=REWARD_KEY,
                              hint="is it on PYTHONPATH? or give a file: path/to/file.py:function") from exc
        except Exception as exc:  # the user's module failed while importing: show why, keep the chain
            raise ConfigError(f"reward function {spec!r}: importing {module_part} failed: "
                              f"{type(exc).__name__}: {exc}", key=REWARD_KEY) from exc
    if not hasattr(module, attr):
        candidates = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        close = difflib.get_close_matches(attr, candidates, n=1)
        raise ConfigError(
            f"reward function {spec!r}: {module_part} has no attribute {attr!r}; its functions: "
            f"{', '.join(candidates) or '(none)'}", key=REWARD_KEY, hint=f"did you mean {close[0]!r}?" if close else None)
    fn = getattr(module, attr)
    if not callable(fn):
        raise ConfigError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not callable", key=REWARD_KEY)
    return fn


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise PathError(f"reward function {spec!r}: file {path} does not exist")
    resolved = path.resolve()
    # One module per file path, named after its hash so two files called reward.py do not collide.
    name = "hpcppo_user_reward_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"reward function {spec!r}: {path} cannot be imported as a Python module", key=REWARD_KEY)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up there
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"reward function {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}",
                          key=REWARD_KEY) from exc
    return module


def check_signature(fn: Callable[..., Any], kwargs: Mapping[str, Any], name: str) -> None:
    """Raise a ConfigError unless ``fn`` accepts verl's four keyword arguments plus ``kwargs``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without introspectable signatures: let the call decide
    try:
        sig.bind(**dict.fromkeys(_CALL_ARGS), **kwargs)
    except TypeError as exc:
        extra = f" plus {', '.join(f'{k}=' for k in kwargs)}" if kwargs else ""
        raise ConfigError(
            f"reward function {name!r} has signature {sig}, which cannot be called as "
            f"fn(data_source=, solution_str=, ground_truth=, extra_info={extra}): {exc}", key=REWARD_KEY) from exc


def _as_score(value: Any, name: str, data_source: str, row: int | None = None) -> float:
    raw = value
    if row is not None:
        data_source = f"{data_source!r} on row {row}"
    else:
        data_source = repr(data_source)
    if isinstance(value, Mapping):
        if "score" not in value:
            raise RewardFunctionError(f"reward function {name!r} returned a dict without 'score' (keys: "
                                      f"{', '.join(map(str, value))}) for data_source {data_source}")
        value = value["score"]
    if isinstance(value, str | bytes) or not hasattr(type(value), "__float__"):
        raise RewardFunctionError(f"reward function {name!r} returned {raw!r} ({type(raw).__name__}) for "
                                  f"data_source {data_source}; expected a number or a dict with 'score'")
    score = float(value)
    if not math.isfinite(score):
        raise RewardFunctionError(f"reward function {name!r} returned {score} for data_source {data_source}")
    return score


class RewardFn:
    """A loaded reward function with bound options: ``fn(data_source, solution_str, ground_truth, extra_info)``."""

    def __init__(self, name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.kwargs = dict(kwargs or {})
        check_signature(fn, self.kwargs, name)
        self._fn = fn

    def raw(self, data_source: str, solution_str: str, ground_truth: Any,
            extra_info: Mapping[str, Any] | None = None) -> Any:
        """The function's return value, unchecked (``score_batch`` checks it, naming the row)."""
        return self._fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                        extra_info=extra_info, **self.kwargs)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: Mapping[str, Any] | None = None) -> float:
        return _as_score(self.raw(data_source, solution_str, ground_truth, extra_info), self.name, data_source)

    def __repr__(self) -> str:
        return f"RewardFn({self.name!r}, kwargs={self.kwargs!r})"


def _builtin(name: str, kwargs: Mapping[str, Any]) -> RewardFn:
    if name == "gsm8k" and kwargs.get("method", "strict") not in GSM8K_METHODS:
        raise ConfigError(f"unknown method {kwargs['method']!r}; allowed: {', '.join(GSM8K_METHODS)}",
                          key=GSM8K_METHOD_KEY)
    return RewardFn(name, load_function(BUILTINS[name]), kwargs)


def unknown_data_source(data_source: str, file: str | None = None) -> ConfigError:
    """The error for a data_source "auto" has no scorer for: names the key that fixes it and the known sources (or,
    for a source verl scores with a module hpcppo lacks, that module)."""
    own = f"set {REWARD_KEY} = \"module:function\" (or \"path/to/file.py:function\") to score it yourself"
    if data_source in VERL_ONLY_SOURCES:
        return ConfigError(f"data_source {data_source!r}: verl's default_compute_score scores it with "
                           f"{VERL_ONLY_SOURCES[data_source]}, which hpcppo does not have ({REWARD_KEY} = \"auto\")",
                           key=REWARD_KEY, file=file, hint=own)
    close = difflib.get_close_matches(str(data_source), list(DATA_SOURCES), n=1)
    own = "or " + own
    return ConfigError(
        f"no built-in reward for data_source {data_source!r} ({REWARD_KEY} = \"auto\"); known data sources: "
        f"{known_data_sources()}", key=REWARD_KEY, file=file,
        hint=f"did you mean {close[0]!r}? {own}" if close else own)


class AutoRewardFn:
    """Dispatch on ``data_source`` to the built-ins (:data:`DATA_SOURCES`); each is loaded on first use."""

    name = "auto"

    def __init__(self, options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        unknown = sorted(set(self.options) - set(BUILTINS))
        if unknown:
            raise ConfigError(f"options for unknown built-in reward(s) {', '.join(unknown)}; known: "
                              f"{', '.join(BUILTINS)}")
        self._fns: dict[str, RewardFn] = {}
        if "gsm8k" in self.options:  # validate now; the synthetic task stays unimported until a row needs it
            self._fns["gsm8k"] = _builtin("gsm8k", self.options["gsm8k"])

    def resolve(self, data_source: str) -> RewardFn:
        """The built-in that scores ``data_source`` (loading it on first use)."""
        builtin = builtin_for(data_source)
        if builtin is None:
            raise unknown_data_source(data_source)
        if builtin not in self._fns:
            self._fns[builtin] = _builtin(builtin, self.options.get(builtin, {}))
        return self._fns[builtin]

    def raw(self, data_source: str, solution_str: str, ground_truth: Any,
            extra_info: Mapping[str, Any] | None = None) -> Any:
        """The dispatched function's return value, unchecked."""
        return self.resolve(data_source).raw(data_source, solution_str, ground_truth, extra_info)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: Mapping[str, Any] | None = None) -> float:
        return self.resolve(data_source)(data_source, solution_str, ground_truth, extra_info)

    def __repr__(self) -> str:
        return f"AutoRewardFn(options={self.options!r})"


def build_reward_fn(spec: str = "auto", **kwargs: Any) -> Callable[[str, str, Any, Mapping[str, Any] | None], float]:
    """A reward function from a spec (see the module docstring); ``kwargs`` are bound options."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"reward function spec must be a non-empty string, got {spec!r}", key=REWARD_KEY)
    spec = spec.strip()
    if spec == "auto":
        return AutoRewardFn(kwargs)
    if spec in BUILTINS:
        return _builtin(spec, kwargs)
    return RewardFn(spec, load_function(spec), kwargs)


def score_batch(
    fn: Callable[..., float],
    data_sources: Sequence[str],
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    preds: list[Any] | None = None,
) -> list[float]:
    """Score each row; a failing row raises :class:`RewardFunctionError` naming the row and its data_source.

    ``preds``, when given, receives each row's ``pred`` (the answer a function returning a dict reports, as verl's
    ``math_dapo`` does; verl keeps it in the reward's extra info), or :data:`NO_PRED` where there is none."""
    n = len(data_sources)
    extra = list(extra_infos) if extra_infos is not None else [None] * n
    if not (len(solutions) == len(ground_truths) == len(extra) == n):
        raise ValueError(f"score_batch: lengths differ (data_sources {n}, solutions {len(solutions)}, "
                         f"ground_truths {len(ground_truths)}, extra_infos {len(extra)})")
    name = getattr(fn, "name", getattr(fn, "__name__", repr(fn)))
    call = getattr(fn, "raw", fn)  # our wrappers: take the raw value so the check below can name the row
    scores = []
    for i in range(n):
        try:
            value = call(data_sources[i], solutions[i], ground_truths[i], extra[i])
        except HpcppoError as exc:
            exc.add_note(f"while scoring row {i} (data_source={data_sources[i]!r})")
            raise
        except Exception as exc:
            raise RewardFunctionError(f"reward function {name!r} raised on row {i} (data_source="
                                      f"{data_sources[i]!r}): {type(exc).__name__}: {exc}") from exc
        scores.append(_as_score(value, name, data_sources[i], row=i))
        if preds is not None:
            preds.append(value["pred"] if isinstance(value, Mapping) and "pred" in value else NO_PRED)
    return scores
