"""Reading a verl input for ``hpcppo import-verl``: a run script or command line, a YAML config, and the YAML a
command line names with Hydra's ``--config-path``/``--config-name``.

A script is read with :mod:`hpcppo.verl.shell` (bash's expansions, nothing run). A YAML is read as OmegaConf
reads it (verl loads its configs with OmegaConf): ``lr: 3e-7`` is the float 3e-7, which plain YAML 1.1 (PyYAML's
SafeLoader) would read as the string "3e-7". No torch here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcppo.verl import names as verl
from hpcppo.verl.shell import read_script, resolve
from hpcppo.errors import ConfigError

__all__ = ["Setting", "Read", "read_input_text", "read_command_line", "read_yaml", "locate_config", "show",
           "YAML_MAX_VALUES", "YAML_MAX_DEPTH"]


@dataclass(frozen=True)
class Setting:
    """One verl setting as read: dotted key (``+`` dropped), parsed value, and how it was written.

    ``value`` has the environment's values in place of variables the script does not set; ``portable`` has
    ``${NAME}`` there instead (a path keeps it for compile to expand on the cluster). ``unknown`` lists the parts
    whose value cannot be known here (``$(date)``, a variable set nowhere): (as written, why)."""

    key: str
    value: Any
    text: str
    default: bool = False  # not in the input: verl's default, written because hpcppo's differs
    portable: Any = None
    unknown: tuple[tuple[str, str], ...] = ()
    environ_names: tuple[str, ...] = ()
    from_yaml: bool = False  # a YAML holds verl's whole config, defaults included (data.image_key: images)


@dataclass
class Read:
    """What an input holds: its settings in order, notes on what was skipped, and reports (kind, text, why) of
    what cannot be imported at all (a Megatron trainer config, a YAML not found)."""

    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reports: list[tuple[str, str, str]] = field(default_factory=list)
    config_path: str | None = None
    config_name: str | None = None
    config_unknown: bool = False
    recipe: str = ""  # "one_step_off" or "fully_async": the command runs verl's recipe of that name (RECIPES)


def show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{show(v)}" for k, v in value.items()) + "}"
    return str(value)


# ------------------------------------------------------------------------------------------------ scripts

_SHELL_OPS = {"|", "||", "&&", ";", "&", "|&"}
_HYDRA_OPTS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name",
               "--config-dir": "dir", "-cd": "dir"}


def _names_in(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\ue002(\w+)\ue003", text))


def _setting(word: str, environ: Mapping[str, str]) -> Setting | str:
    """A ``key=value`` word as a Setting, or the note saying why it is not one."""
    value_text, portable_text, unknowns = resolve(word, environ)
    if value_text.startswith("~"):
        return f"{portable_text}: deleting a key (Hydra's ~) has no counterpart; the key keeps hpcppo's default"
    key, eq, raw = value_text.partition("=")
    if not eq:
        return f"{portable_text}: not key=value, skipped"
    portable_raw = portable_text.partition("=")[2]
    return Setting(key.lstrip("+"), verl.parse_value(raw), portable_text, portable=verl.parse_value(portable_raw),
                   unknown=tuple(unknowns), environ_names=_names_in(word))


# verl's asynchronous recipes (verl/experimental/<name>_policy at b178a3c), by a word of their entry module
RECIPES = {"one_step_off": "one_step_off_policy", "fully_async": "fully_async_policy"}


def recipe_of(module: str) -> str:
    """The recipe a verl entry module runs ("" for verl's trainer)."""
    return next((name for name, word in RECIPES.items() if word in module), "")


def read_input_text(text: str, environ: Mapping[str, str] | None = None) -> Read:
    """Settings of a verl command line (or a script that runs one), with the Hydra config it names."""
    environ = os.environ if environ is None else environ
    script = read_script(text, environ)
    out = Read(notes=list(script.notes), recipe=recipe_of(script.module))
    words = script.command
    if words is None:
        for lineno, tokens in script.loose:  # a bare list of overrides
            for tok in tokens:
                s = _setting(tok, environ)
                out.settings.append(s) if isinstance(s, Setting) else out.notes.append(s)
        return out
    for lineno, tokens in script.loose:  # a line cut off from the command (a missing backslash)
        if lineno > script.command_line:
            shown = " ".join(resolve(t, environ)[1] for t in tokens)
            out.notes.append(f"line {lineno}: {shown[:80]} is outside the verl command (a missing \\ at the end of "
                             f"the line before?), not imported")
    it = iter(words)
    for word in it:
        if word in _SHELL_OPS:
            break
        shown = resolve(word, environ)[1]
        if word.startswith("-"):
            name, eq, val = word.partition("=")
            if name in _HYDRA_OPTS:
                if not eq:
                    val = next(it, "")
                value, portable, unknowns = resolve(val, environ)
                what = _HYDRA_OPTS[name]
                if what == "name":
                    out.config_name = value
                elif what == "path":
                    out.config_path = value
                    out.config_unknown = bool(unknowns)
                else:
                    out.notes.append(f"{name}={portable}: Hydra's extra config directory is not searched")
                continue
            out.notes.append(f"{shown}: a command-line option of verl's, not a setting; skipped")
            continue
        value, _, unknowns = resolve(word, environ)
        if unknowns and "=" not in value.partition(unknowns[0][0])[0]:  # settings whose words are not known
            out.reports.append(("unresolved", shown, f"{unknowns[0][1]}: the settings it holds are not known here; "
                                                     f"add them to the input"))
            continue
        s = _setting(word, environ)
        out.settings.append(s) if isinstance(s, Setting) else out.notes.append(s)
    return out


def read_command_line(text: str, environ: Mapping[str, str] | None = None) -> tuple[list[Setting], list[str]]:
    """Settings of a verl command line (or a script that runs one), and notes on what was skipped."""
    read = read_input_text(text, environ)
    notes = list(read.notes)
    if read.config_name is not None or read.config_path is not None:
        notes.append(f"--config-path={read.config_path} --config-name={read.config_name}: Hydra's config, read by "
                     f"hpcppo import-verl FILE (not by this reader alone)")
    return read.settings, notes


# ------------------------------------------------------------------------------------------------ YAML

# A verl config is a few hundred values, a few levels deep; anchors that expand past these bounds (a "billion
# laughs" document, an alias to itself) are refused before anything walks the expanded tree.
YAML_MAX_VALUES = 100_000
YAML_MAX_DEPTH = 64

# OmegaConf reads YAML with one change to PyYAML's SafeLoader (omegaconf/_utils.py, get_yaml_loader): a float needs
# no dot, so "3e-7", "1E5" and "-2e+3" are floats. YAML 1.1's own float pattern requires the dot.
_OMEGACONF_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$|^[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+]?[0-9]+)?$"
                              r"|^[-+]?\.[0-9_]+([eE][-+]?[0-9]+)?$")


def _loader_class() -> type:
    import yaml

    class OmegaConfLoader(yaml.SafeLoader):
        """PyYAML's SafeLoader with OmegaConf's float rule."""

    OmegaConfLoader.add_implicit_resolver("tag:yaml.org,2002:float", _OMEGACONF_FLOAT, list("-+0123456789."))
    return OmegaConfLoader


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
            _refuse_duplicate_keys(current, label)
            for key, value in current.value:
                stack.extend(((key, depth + 1), (value, depth + 1)))


def _refuse_duplicate_keys(mapping: Any, label: str) -> None:
    """PyYAML keeps the last of two equal keys (two ``data:`` blocks: the first one's settings vanish); OmegaConf
    refuses them, and so does this."""
    import yaml

    seen: dict[str, int] = {}
    for key, _ in mapping.value:
        if not isinstance(key, yaml.ScalarNode) or key.value == "<<":  # merge keys may repeat
            continue
        line = key.start_mark.line + 1
        if key.value in seen:
            raise ConfigError(f"line {line}: key {key.value!r} appears twice in the same mapping (first on line "
                              f"{seen[key.value]}); YAML keeps only the last one: merge them", file=label)
        seen[key.value] = line


def load_yaml(text: str, label: str) -> Any:
    import yaml

    loader = _loader_class()(text)
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


def _flatten(data: Mapping[str, Any], prefix: str, out: list[Setting]) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, dotted + ".", out)
        else:
            out.append(Setting(dotted, value, f"{dotted}={show(value)}", portable=value, from_yaml=True))


# verl's own trainer configs that a --config-name or a defaults list can name (verl/trainer/config/*.yaml at
# verl.VERL_COMMIT): ppo_trainer is the base every import starts from; the others are other trainers.
VERL_BASE_CONFIGS = {"ppo_trainer", "_generated_ppo_trainer"}
VERL_OTHER_CONFIGS = {"ppo_megatron_trainer": "verl's Megatron trainer: hpcppo trains with FSDP2 only",
                      "_generated_ppo_megatron_trainer": "verl's Megatron trainer: hpcppo trains with FSDP2 only"}


def read_yaml(text: str, label: str) -> tuple[list[Setting], list[str]]:
    """Settings of a verl YAML config (nested mappings flattened to dotted keys)."""
    read = read_yaml_config(text, label)
    return read.settings, read.notes + [f"{t}: {why}" for _, t, why in read.reports]


def read_yaml_config(text: str, label: str) -> Read:
    """A verl YAML's settings, with its Hydra ``defaults`` list checked: verl's base config is what an import starts
    from; a Megatron base is reported; other entries (files of the user's) are reported as not followed."""
    data = load_yaml(text, label)
    if not isinstance(data, dict):
        raise ConfigError("a verl YAML config is a mapping of sections (data:, actor_rollout_ref:, ...)", file=label)
    out = Read()
    defaults = data.get("defaults")
    if defaults is not None:
        for entry in defaults if isinstance(defaults, list) else [defaults]:
            name = entry if isinstance(entry, str) else None
            if name in VERL_BASE_CONFIGS or name == "_self_":
                continue
            if name in VERL_OTHER_CONFIGS:
                out.reports.append(("unsupported", f"{label}: defaults: {name}", VERL_OTHER_CONFIGS[name]))
            else:
                out.reports.append(("unsupported", f"{label}: defaults: {show(entry)}",
                                    "Hydra's composition is not followed for this entry; import the composed "
                                    "config (verl prints it with `python3 -m verl.trainer.main_ppo --cfg job`)"))
        data = {k: v for k, v in data.items() if k != "defaults"}
    _flatten(data, "", out.settings)
    return out


def locate_config(read: Read, script_dir: Path, cwd: Path) -> tuple[Path | None, list[Path]]:
    """The YAML a command line's ``--config-path``/``--config-name`` names, and the places looked in.

    Hydra resolves a relative config path against the primary module's directory (verl/trainer/ for main_ppo), so
    ``--config-path=config`` is verl's own config directory; verl's scripts otherwise build it from
    ``$(pwd)/examples/...`` (run from verl's checkout), which is looked for beside the script's parent folders."""
    name = read.config_name or ""
    file = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    path = read.config_path or ""
    tried: list[Path] = []
    candidates: list[Path] = []
    if path and not read.config_unknown:
        p = Path(path)
        candidates += [p] if p.is_absolute() else [script_dir / p, cwd / p]
    if read.config_unknown:  # "$(pwd)/config", "$PROJECT_DIR/examples/...": the part after the unknown prefix
        rest = re.sub(r"^(\$\([^)]*\)|\$\{?\w+\}?)/*", "", path)
        if rest and "$" not in rest:
            candidates += [script_dir / rest, cwd / rest]
    tail = re.sub(r"^.*?(?=examples/|recipe/)", "", path) if read.config_unknown or not os.path.isabs(path) else ""
    if tail and tail != path:
        for parent in [script_dir, *script_dir.parents][:6]:
            candidates.append(parent / tail)
    for c in candidates:
        tried.append(c / file)
        if (c / file).is_file():
            return c / file, tried
    return None, tried
