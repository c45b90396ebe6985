"""``hpcppo import-verl``: a verl command line or YAML in, an ``exp.toml`` out, every key accounted for.

Input: a shell script or pasted command line (``python3 -m verl.trainer.main_ppo \\`` continuations, ``key=value``,
``+key=value``, quotes, variables the script assigns itself substituted, others such as ``$HOME`` left as written),
or a verl YAML (Hydra-style nesting). Each key goes through :mod:`hpcppo.config.verl`; each translated value is
checked against the experiment schema before it is written, with a comment naming the verl setting it came from.
Whatever is not translated is listed with the reason, on stderr and at the end of the file. Where verl's default
differs from hpcppo's and the input leaves it unset, verl's default is written (verl would have run with it).
No torch here.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from hpcppo.config import verl
from hpcppo.config.convert import MAX_INPUT_BYTES, read_input
from hpcppo.config.experiment import Experiment
from hpcppo.config.load import _check_leaf, experiment_from_data, leaf_keys, lookup_field
from hpcppo.errors import ConfigError, HpcppoError, PathError
from hpcppo.fsutil import atomic_write_text, require_parent_dir

__all__ = ["Setting", "Imported", "read_command_line", "read_yaml", "translate", "import_verl", "render_doc"]


@dataclass(frozen=True)
class Setting:
    """One verl setting as read: dotted key (``+`` dropped), parsed value, and how it was written."""

    key: str
    value: Any
    text: str
    default: bool = False  # not in the input: verl's default, written because hpcppo's differs


@dataclass
class Imported:
    """The translation: hpcppo key -> (value, comments), the report lines, and notes about the input."""

    values: dict[str, Any] = field(default_factory=dict)
    comments: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, Setting] = field(default_factory=dict)
    report: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, "key=value", why)
    notes: list[str] = field(default_factory=list)

    def skip(self, kind: str, s: Setting, why: str) -> None:
        self.report.append((kind, s.text, why))


# ------------------------------------------------------------------------------------------------ reading

_SHELL_OPS = {"|", "||", "&&", ";", "&", "|&"}
_REDIRECT = re.compile(r"^\d*[<>]")
_VAR = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)


def _substitute(text: str, variables: dict[str, str]) -> str:
    """The script's own variables substituted (``${NAME:-default}`` takes the default when the script does not set
    NAME); anything else, ``$HOME`` say, stays as written."""
    def one(mo: re.Match[str]) -> str:
        name = mo.group(1) or mo.group(3)
        if name in variables:
            return variables[name]
        return mo.group(2) if mo.group(2) is not None else mo.group(0)

    return _VAR.sub(one, text)


def read_command_line(text: str) -> tuple[list[Setting], list[str]]:
    """Settings of a verl command line (or a script that runs one), and notes on what was skipped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    variables: dict[str, str] = {}
    settings: list[Setting] = []
    notes: list[str] = []
    found_command = False
    loose: list[tuple[int, list[str]]] = []  # key=value lines outside a main_ppo command
    for lineno, line in enumerate(joined.splitlines(), 1):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            notes.append(f"line {lineno}: not read ({exc}): {line.strip()[:80]}")
            continue
        if not tokens:
            continue
        module = next((i for i, t in enumerate(tokens) if "main_ppo" in t), None)
        if module is None:
            if tokens[0] == "export":
                tokens = tokens[1:]
            if len(tokens) == 1 and (a := _ASSIGN.match(tokens[0])) and not found_command:
                variables[a.group(1)] = _substitute(a.group(2), variables)
            elif all("=" in t and "." in t.partition("=")[0] for t in tokens):
                loose.append((lineno, tokens))
            elif not found_command and tokens[0] not in ("set", "cd", "ulimit", "source", "."):
                notes.append(f"line {lineno}: not a verl setting, skipped: {line.strip()[:80]}")
            continue
        if found_command:
            notes.append(f"line {lineno}: a second verl command; only the first is imported")
            continue
        found_command = True
        for tok in tokens[:module]:
            if _ASSIGN.match(tok):
                notes.append(f"environment variable {tok} for the verl command: not a setting (the site's "
                             f"[env.vars] sets job variables)")
        args = tokens[module + 1:]
        settings += _settings_from(args, variables, notes)
    for lineno, tokens in loose:
        if found_command:  # a line cut off from the command (a missing backslash): verl would not see it either
            notes.append(f"line {lineno}: {' '.join(tokens)[:80]} is outside the verl command (a missing \\ at the "
                         f"end of the line before?), not imported")
        else:  # a bare list of overrides
            settings += _settings_from(tokens, variables, notes)
    return settings, notes


def _settings_from(args: list[str], variables: dict[str, str], notes: list[str]) -> list[Setting]:
    out = []
    it = iter(args)
    for tok in it:
        if tok in _SHELL_OPS or _REDIRECT.match(tok):
            break  # a pipe or redirection ends the command (`2>&1 | tee log`)
        if tok in ("$@", "$*", "${@}"):
            notes.append(f"{tok}: the script's own arguments are not known here; add them to the input")
            continue
        if tok.startswith("-"):
            name, eq, _ = tok.partition("=")
            if name in ("--config-path", "--config-name", "-cp", "-cn", "--config-dir", "-cd") and not eq:
                tok += "=" + next(it, "")
            notes.append(f"{tok}: Hydra's option is not followed; import the YAML it names as well "
                         f"(hpcppo import-verl FILE.yaml)")
            continue
        if tok.startswith("~"):
            notes.append(f"{tok}: deleting a key (Hydra's ~) has no counterpart; the key keeps hpcppo's default")
            continue
        key, eq, raw = tok.partition("=")
        if not eq:
            notes.append(f"{tok}: not key=value, skipped")
            continue
        value = verl.parse_value(_substitute(raw, variables))
        out.append(Setting(key.lstrip("+"), value, tok))
    return out


def _flatten(data: Any, prefix: str, out: list[Setting], notes: list[str]) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, dotted + ".", out, notes)
        else:
            out.append(Setting(dotted, value, f"{dotted}={_show(value)}"))


# A verl config is a few hundred values, a few levels deep; anchors that expand past these bounds (a "billion
# laughs" document, an alias to itself) are refused before anything walks the expanded tree.
YAML_MAX_VALUES = 100_000
MAX_SETTINGS = 5_000
YAML_MAX_DEPTH = 64


def _check_yaml_size(node: Any, label: str) -> None:
    """Count the values ``node`` expands to (aliases counted each time they are used), without expanding them;
    ``ConfigError`` when past :data:`YAML_MAX_VALUES` or :data:`YAML_MAX_DEPTH` (a cycle is past both)."""
    import yaml

    count = 0
    stack = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        count += 1
        if count > YAML_MAX_VALUES:
            raise ConfigError(f"expands to more than {YAML_MAX_VALUES:,} values (anchors and aliases used over and "
                              f"over, or an alias to itself); a verl config has a few hundred", file=label)
        if depth > YAML_MAX_DEPTH:
            raise ConfigError(f"nested more than {YAML_MAX_DEPTH} levels deep (or an alias to itself); a verl config "
                              f"nests a few levels", file=label)
        if isinstance(current, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in current.value)
        elif isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                stack.extend(((key, depth + 1), (value, depth + 1)))


def _load_yaml(text: str, label: str) -> Any:
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_size(node, label)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", file=label) from None
    except RecursionError:  # the composer recurses once per level
        raise ConfigError(f"nested more than {YAML_MAX_DEPTH} levels deep; a verl config nests a few levels",
                          file=label) from None
    finally:
        loader.dispose()


def read_yaml(text: str, label: str) -> tuple[list[Setting], list[str]]:
    """Settings of a verl YAML config (nested mappings flattened to dotted keys)."""
    data = _load_yaml(text, label)
    if not isinstance(data, dict):
        raise ConfigError("a verl YAML config is a mapping of sections (data:, actor_rollout_ref:, ...)", file=label)
    notes = []
    if "defaults" in data:
        notes.append("defaults: Hydra's composition list is not followed; import the composed config (verl prints "
                     "it with `python3 -m verl.trainer.main_ppo --cfg job`)")
        data = {k: v for k, v in data.items() if k != "defaults"}
    settings: list[Setting] = []
    _flatten(data, "", settings, notes)
    return settings, notes


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_show(v)}" for k, v in value.items()) + "}"
    return str(value)


# ------------------------------------------------------------------------------------------------ translating

# verl's defaults (verl/trainer/config/_generated_ppo_trainer.yaml at verl.VERL_COMMIT) where hpcppo's differ: an
# input that leaves them unset ran with these under verl.
VERL_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("data.train_files", "~/data/rlhf/gsm8k/train.parquet"),
    ("data.train_batch_size", 1024),
    ("actor_rollout_ref.model.path", "~/models/deepseek-llm-7b-chat"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
    ("trainer.total_epochs", 30),
    ("trainer.n_gpus_per_node", 8),
    ("trainer.save_freq", -1),
    ("trainer.max_actor_ckpt_to_keep", None),
    ("trainer.val_before_train", True),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", -1),
)
_PATH_KEYS = {k for k in leaf_keys(Experiment) if lookup_field(Experiment, k).metadata.get("path")}
# One micro-batch here for what verl sizes per role (actor/ref log-probs, critic values).
_SMALLEST_WINS = {"rollout.micro_batch_size_per_gpu"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
LABEL = "verl input"


def _rebase(path: str, cwd: Path, out_dir: Path) -> str:
    """A path verl reads relative to its working directory, relative to the exp.toml's directory instead."""
    if not path or os.path.isabs(path) or path.startswith(("~", "$")) or cwd.resolve() == out_dir.resolve():
        return path
    return os.path.relpath(cwd / path, out_dir)


def _paths(target: str, value: Any, s: Setting, cwd: Path, out_dir: Path, imp: Imported) -> Any:
    if target == "data.reward_fn":
        path, _, name = str(value).rpartition(":")
        if "$" in path or path.startswith("~"):
            imp.notes.append(f"{s.key}: {path} is used as written; hpcppo does not expand $VAR or ~ in data.reward_fn")
        elif not os.path.isabs(path):
            value = f"{(cwd / path).resolve()}:{name}"
        return value
    if target not in _PATH_KEYS:
        if isinstance(value, str) and "$" in value:
            imp.notes.append(f"{s.text}: $VAR left as written; {target} is not a path, so nothing expands it")
        return value
    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, str) and "$" in v:
            imp.notes.append(f"{s.key}: {v} left as written; compile expands $VAR in paths from the environment")
    if target in ("model.path", "model.critic_path") and isinstance(value, str) and _HUB_ID.match(value) \
            and not (cwd / value).exists():
        imp.notes.append(f"{s.key}: {value} looks like a Hugging Face hub id; hpcppo loads a model directory: "
                         f"download it (huggingface-cli download {value} --local-dir DIR) and set {target} = DIR; as "
                         f"written it names the directory {value} next to the spec")
        return value
    rebased = [_rebase(v, cwd, out_dir) if isinstance(v, str) else v for v in items]
    return rebased if isinstance(value, list) else rebased[0]


def _unresolved(value: Any) -> bool:
    return isinstance(value, str) and ("${" in value and value.strip().startswith("${") or value == "???")


def _apply(imp: Imported, s: Setting, ctx: dict[str, Any], cwd: Path, out_dir: Path) -> None:
    e = verl.lookup(s.key)
    if _unresolved(s.value):
        if not s.default:
            imp.skip("ignored", s, "a Hydra interpolation or a missing value: verl fills it from another key")
        return
    if e is None:
        close = difflib.get_close_matches(s.key, [x.verl for x in verl.ENTRIES], n=1, cutoff=0.8)
        imp.skip("unknown", s, "not in hpcppo's verl table" + (f" (did you mean {close[0]}?)" if close else
                                                                "; verl may not have it either"))
        return
    if e.kind == verl.NOT_VERL:
        imp.skip("not-verl", s, f"verl has no such key and would refuse it: {e.note}; in hpcppo: {e.hpcppo}")
        return
    if e.kind == verl.IGNORED:
        imp.skip("ignored", s, e.note)
        return
    if e.kind == verl.UNSUPPORTED:
        if e.accepts(s.value):
            imp.skip("ignored", s, f"{_show(s.value)} is what hpcppo does ({e.note})")
        else:
            accepted = ", ".join(_show(v) for v in e.ok)
            imp.skip("unsupported", s, e.note + (f" (accepted: {accepted})" if accepted else ""))
        return
    try:
        value = verl.translate(e, s.value, ctx)
    except verl.Ignored as exc:
        imp.skip("ignored", s, str(exc))
        return
    except verl.Untranslatable as exc:
        imp.skip("unsupported", s, str(exc))
        return
    target = e.hpcppo
    try:
        _check_leaf(lookup_field(Experiment, target), value, key=target, label=LABEL)
    except ConfigError as exc:
        imp.skip("unsupported", s, f"{target}: {exc.message.removeprefix(f'{LABEL}: {target}: ')}")
        return
    value = _paths(target, value, s, cwd, out_dir, imp)
    origin = f"verl's default {s.text} (not in the input)" if s.default else f"from verl {s.text}"
    if target in imp.values:
        first = imp.sources[target]
        if imp.values[target] == value:
            imp.comments[target].append(origin)
        elif target in _SMALLEST_WINS and value < imp.values[target]:
            imp.skip("conflict", first, f"{target} takes the smaller {_show(value)} of {s.text}: hpcppo has one "
                                        f"setting for both, and the smaller fits wherever verl's larger one did")
            imp.values[target], imp.comments[target], imp.sources[target] = value, [origin], s
        else:
            why = ("the smaller is kept: it fits wherever verl's larger one did" if target in _SMALLEST_WINS
                   else "the first is kept")
            imp.skip("conflict", s, f"{target} is already {_show(imp.values[target])} from {first.text}; hpcppo has "
                                    f"one setting for both ({why})")
        return
    imp.values[target] = value
    imp.comments[target] = [origin]
    imp.sources[target] = s


def translate(settings: list[Setting], *, name: str | None = None, default_name: str = "verl-import",
              cwd: Path | None = None, out_dir: Path | None = None) -> Imported:
    """Translate verl settings (later ones win, as in Hydra) into hpcppo values and a report."""
    cwd = cwd or Path.cwd()
    out_dir = out_dir or cwd
    imp = Imported()
    last: dict[str, Setting] = {}
    for s in settings:
        if s.key in last:
            imp.notes.append(f"{s.key} is given twice; the later {s.text} wins, as in verl")
        last[s.key] = s
    # An interpolation or Hydra's ??? is not a value: for the translation the key is unset.
    ctx = {k: s.value for k, s in last.items() if not _unresolved(s.value)}
    for s in last.values():
        _apply(imp, s, ctx, cwd, out_dir)
    if verl.R + "name" not in ctx:
        imp.notes.append("actor_rollout_ref.rollout.name is not given (verl requires it); hpcppo's default engine "
                         "is hf: add actor_rollout_ref.rollout.name=vllm for GPU runs")
    nodes = verl.whole_number(ctx.get("trainer.nnodes"), 1)
    for key, value in VERL_DEFAULTS:
        e = verl.lookup(key)
        if key in ctx or (e is not None and e.hpcppo in imp.values):
            continue
        if key == "trainer.val_before_train" and not imp.values.get("data.val_files"):
            continue  # verl's default val_files are its own GSM8K test set; hpcppo validates only when told
        if key.endswith("fsdp_size") and nodes == 1:
            continue  # hsdp = auto is off on one node already
        _apply(imp, Setting(key, value, f"{key}={_show(value)}", default=True), {**ctx, key: value}, cwd, out_dir)
    imp.notes.append("resources.time is hpcppo's default (01:00:00) unless the site sets one; verl has no wall-time "
                     "limit: set resources.time for your partition (the job checkpoints and requeues at the limit)")
    if name:
        imp.values["name"], imp.comments["name"] = name, ["--name"]
    elif "name" not in imp.values:
        imp.values["name"] = verl.run_name(default_name)
        imp.comments["name"] = ["no trainer.experiment_name in the input: from the input's name"]
    return imp


# ------------------------------------------------------------------------------------------------ writing

def _toml_value(value: Any) -> str:
    if isinstance(value, list):  # on one line, so that the line's comment follows it
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).strip()[len("v = "):]


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def to_toml(imp: Imported, source: str) -> str:
    """The exp.toml text: sections in the schema's order, a comment on every line, the report at the end."""
    order = {k: i for i, k in enumerate(leaf_keys(Experiment))}
    keys = sorted(imp.values, key=lambda k: order.get(k, len(order)))
    lines = [f"# Imported from verl ({_one_line(source)}) by `hpcppo import-verl`; keys read against verl "
             f"{verl.VERL_COMMIT[:8]}.", "# Each line names the verl setting it came from; docs/verl.md has the "
             "whole mapping.", ""]
    current = None
    for key in keys:
        section, _, leaf = key.rpartition(".")
        if section != current:
            if section:
                lines += ["", f"[{section}]"]
            current = section
        comment = _one_line("; ".join(imp.comments.get(key, [])))
        lines.append(f"{leaf} = {_toml_value(imp.values[key])}" + (f"  # {comment}" if comment else ""))
    if imp.report:
        lines += ["", "# Not translated (also reported on stderr when imported):"]
        lines += [_one_line(f"#   [{kind}] {text}: {why}") for kind, text, why in imp.report]
    return "\n".join(lines) + "\n"


def _check(text: str, label: str, base_dir: Path) -> str | None:
    """None when the written spec loads (types, ranges, cross-field checks), else the one-line error."""
    try:
        experiment_from_data(tomllib.loads(text), label, base_dir)
    except HpcppoError as exc:
        return str(exc)
    return None


def _looks_like_yaml(text: str, path: str) -> bool:
    if path.endswith((".yaml", ".yml")):
        return True
    if path.endswith((".sh", ".bash", ".txt")) or "main_ppo" in text:
        return False
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return bool(re.match(r"^[A-Za-z_][\w-]*:\s*($|#|\S)", first)) and "=" not in first


def import_verl(source: str, out: Path, *, force: bool = False, name: str | None = None, stdin_text: str | None = None,
                cwd: Path | None = None) -> tuple[Imported, str | None]:
    """Read ``source`` (a file, or ``-`` with ``stdin_text``), write ``out`` atomically; returns the translation and
    the compile check's error (None when the written spec loads). Raises on unreadable input or an existing ``out``
    without ``force``."""
    if source == "-":
        text, label, stem = stdin_text or "", "<stdin>", "verl-import"
        if len(text) > MAX_INPUT_BYTES:
            raise ConfigError(f"is larger than {MAX_INPUT_BYTES // 1024} KiB; allowed: a verl command line or YAML "
                              f"of at most {MAX_INPUT_BYTES // 1024} KiB", file=label)
    else:
        path = Path(source)
        try:
            text = read_input(path).decode("utf-8")
        except FileNotFoundError:
            raise PathError(f"{source}: no such file (give a verl command line or YAML file, or - for stdin)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise PathError(f"{source}: cannot be read as text: {getattr(exc, 'strerror', None) or exc}") from None
        label, stem = source, path.stem
    if name is not None:  # refused now rather than written into the toml for compile to refuse later
        _check_leaf(lookup_field(Experiment, "name"), name, key="name", label="--name")
    if out.is_dir():
        raise PathError(f"{out} is a directory; give the file to write, e.g. {out / 'exp.toml'}")
    require_parent_dir(out)
    if out.exists() and not force:
        raise PathError(f"{out} exists; pass --force to replace it")
    if _looks_like_yaml(text, source):
        settings, notes = read_yaml(text, label)
    else:
        settings, notes = read_command_line(text)
    if len(settings) > MAX_SETTINGS:  # each unknown key costs a did-you-mean over the whole table
        raise ConfigError(f"has {len(settings):,} settings; allowed: at most {MAX_SETTINGS:,} (a verl run sets a few "
                          f"hundred)", file=label)
    if not settings:
        raise ConfigError("no verl settings found (expected `python3 -m verl.trainer.main_ppo key=value ...` or a "
                          "verl YAML config)", file=label)
    cwd = cwd or Path.cwd()
    out_dir = out.resolve().parent
    imp = translate(settings, name=name, default_name=stem, cwd=cwd, out_dir=out_dir)
    imp.notes[:0] = notes
    text_out = to_toml(imp, label)
    problem = _check(text_out, str(out), out_dir)
    try:
        atomic_write_text(out, text_out)
    except OSError as exc:
        raise PathError(f"{out} cannot be written: {exc.strerror or exc}") from None
    return imp, problem


def format_report(imp: Imported) -> list[str]:
    """The stderr report: every setting not translated and why, then what to check by hand ($VAR left as written,
    a hub id instead of a directory, Hydra options not followed ...)."""
    lines = [f"not translated [{kind}] {text}: {why}" for kind, text, why in imp.report]
    return lines + [f"warning: {n}" for n in imp.notes]


# ------------------------------------------------------------------------------------------------ docs/verl.md

DOC_HEAD = """# verl keys in hpcppo

Generated by `hpcppo import-verl --table` from `hpcppo/config/verl.py` (tests/unit/test_verl_doc.py checks that this
file matches); verl keys as of verl commit {commit}.

`hpcppo import-verl run_ppo.sh -o exp.toml` translates a verl command line (or `FILE.yaml`) with this table and
reports every key it does not translate. The same table answers `-o` with a verl key (applied under its hpcppo name,
with a warning), `hpcppo config explain VERL_KEY`, and the did-you-mean of an unknown key.

Batch sizes use verl's vocabulary: `ppo_mini_batch_size` counts prompts, the `*_per_gpu` micro-batches count samples
per GPU. Kinds: a key of hpcppo; *not a verl key* (people type it; the right key is named); *ignored* (hpcppo gives
the same result without it); *not supported* (hpcppo cannot honour it; the values it accepts are listed).

When the input leaves one of these unset, the import writes verl's default, because hpcppo's differs: {defaults}
(`trainer.val_before_train` only when `data.val_files` is given, `fsdp_size` only on more than one node).
"""
_TABLE_HEAD = "| verl key | hpcppo | note |\n|---|---|---|\n"


def _group(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] in ("actor_rollout_ref", "critic") and len(parts) > 2 else parts[0]


def render_doc() -> str:
    """docs/verl.md: the mapping table, one section per verl config group, from the entries the importer uses."""
    defaults = ", ".join(f"`{k}={_show(v)}`" for k, v in VERL_DEFAULTS)
    out = [DOC_HEAD.format(commit=verl.VERL_COMMIT, defaults=defaults)]
    groups: dict[str, list[verl.Entry]] = {}
    for e in verl.ENTRIES:
        group = "keys verl does not have" if e.kind == verl.NOT_VERL else _group(e.verl)
        groups.setdefault(group, []).append(e)
    for group, entries in groups.items():
        rows = [f"| {a} | {b} | {c.replace('|', '/')} |" for a, b, c in verl.table_rows(entries)]
        out.append(f"\n## {group}\n\n" + _TABLE_HEAD + "\n".join(rows) + "\n")
    return "".join(out)
