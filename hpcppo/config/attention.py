"""Which ``model.attn_implementation`` a model family supports in the installed transformers, known on the login
node without importing transformers or torch: the family's ``modeling_<model_type>.py`` is read as text and its
class flags parsed (``ast``).

transformers decides it from class attributes of the model (``PreTrainedModel._check_and_adjust_attn_implementation``
-> ``_sdpa_can_dispatch`` reads ``_supports_sdpa``, ``_flash_attn_can_dispatch`` reads ``_supports_flash_attn``;
both default to False in ``modeling_utils.PreTrainedModel``; ``eager`` is always there). Families set them on their
``*PreTrainedModel`` base, and a head class may override one. At transformers 5.25 ``Gemma2PreTrainedModel`` has
``_supports_sdpa = False`` ("sdpa does not support softcapping"), so a Gemma2 job with ``sdpa`` failed at start
(issue 37); at 5.19 (vLLM's environment) it was True. Reading the source of the transformers that compiles (the
job's environment on a site whose login node shares it) tracks such changes without a table to keep.

A family whose source is not in the installed transformers (``trust_remote_code`` models, a transformers too old to
know it) is not judged here: the job's own load decides, as before.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import attrs

from hpcppo.config.experiment import Experiment
from hpcppo.errors import ConfigError

__all__ = ["AttentionSupport", "attention_support", "settle_attention"]

# The implementations model.attn_implementation allows, and the class flag that says each is supported.
_FLAG = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
         "flash_attention_3": "_supports_flash_attn"}
# When the default (sdpa) is not supported, the one chosen instead: the first of these the family supports.
_FALLBACK = ("sdpa", "eager")
KEY = "model.attn_implementation"


@dataclass(frozen=True)
class AttentionSupport:
    """One architecture's attention flags in one transformers: ``flags[flag] = (value, class that sets it)``;
    a flag no class of the file sets is transformers' default, False."""

    model_type: str
    architecture: str
    version: str
    source: str  # the modeling file, relative to the transformers package
    flags: dict[str, tuple[bool, str]]

    def supports(self, implementation: str) -> bool:
        flag = _FLAG.get(implementation)
        return True if flag is None else self.flags.get(flag, (False, ""))[0]

    def why(self, implementation: str) -> str:
        """Where the answer comes from, e.g. ``transformers 5.25.0: Gemma2PreTrainedModel._supports_sdpa = False
        (models/gemma2/modeling_gemma2.py)``."""
        flag = _FLAG.get(implementation)
        if flag is None:
            return f"transformers {self.version}: eager attention is always available"
        value, owner = self.flags.get(flag, (False, ""))
        where = f"{owner}.{flag} = {value}" if owner else f"{flag} is not set, so False (PreTrainedModel's default)"
        return f"transformers {self.version}: {where} ({self.source})"


def _transformers_dir() -> Path | None:
    spec = importlib.util.find_spec("transformers")  # finds the package without running its __init__
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _version(package: Path) -> str:
    found = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', (package / "__init__.py").read_text(), re.M)
    return found.group(1) if found else "(unknown version)"


def _class_table(tree: ast.Module) -> dict[str, tuple[list[str], dict[str, bool]]]:
    """Each class of the module: its base names and the boolean class attributes it assigns."""
    table: dict[str, tuple[list[str], dict[str, bool]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
        flags: dict[str, bool] = {}
        for stmt in node.body:
            target, value = None, None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                target, value = stmt.targets[0].id, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                target, value = stmt.target.id, stmt.value
            if target and isinstance(value, ast.Constant) and isinstance(value.value, bool):
                flags[target] = value.value
        table[node.name] = (bases, flags)
    return table


def _resolve_flags(table: dict[str, tuple[list[str], dict[str, bool]]], cls: str) -> dict[str, tuple[bool, str]]:
    """The flags ``cls`` sees: its own, then its bases' (depth first, left to right, within the file)."""
    seen: dict[str, tuple[bool, str]] = {}
    stack, visited = [cls], set()
    while stack:
        name = stack.pop(0)
        if name in visited or name not in table:
            continue
        visited.add(name)
        bases, flags = table[name]
        for flag, value in flags.items():
            seen.setdefault(flag, (value, name))
        stack = bases + stack
    return seen


def _module_name(package: Path, model_type: str) -> str:
    """The ``transformers.models`` module of ``model_type``, as ``configuration_auto.model_type_to_module_name``
    finds it: a special case from ``SPECIAL_MODEL_TYPE_TO_MODULE_NAME`` (``gemma3_text`` -> ``gemma3``; in
    ``models/auto/auto_mappings.py`` at 5.19 and 5.25), else the type with ``-`` as ``_``."""
    for name in ("auto_mappings.py", "configuration_auto.py"):
        try:
            text = (package / "models" / "auto" / name).read_text()
        except OSError:
            continue
        block = text.split("SPECIAL_MODEL_TYPE_TO_MODULE_NAME = ", 1)[-1] if "SPECIAL_MODEL_TYPE_TO_MODULE_NAME = " in text else ""
        found = re.search(r'\(\s*"' + re.escape(model_type) + r'"\s*,\s*"([A-Za-z0-9_.]+)"\s*\)', block)
        if found:
            return found.group(1)
    return model_type.replace("-", "_")


def attention_support(model_dir: str | Path) -> AttentionSupport | None:
    """The attention flags of the architecture ``model_dir/config.json`` names, from the installed transformers'
    source; None when that cannot be known here (no config, remote code, a family this transformers lacks)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    architectures = config.get("architectures") or [] if isinstance(config, dict) else []
    package = _transformers_dir()
    if not isinstance(model_type, str) or not architectures or package is None or config.get("auto_map"):
        return None
    module = _module_name(package, model_type)
    source = Path("models") / module / f"modeling_{module}.py"
    try:
        tree = ast.parse((package / source).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    table = _class_table(tree)
    if architectures[0] not in table:
        return None
    return AttentionSupport(model_type, architectures[0], _version(package), source.as_posix(),
                            _resolve_flags(table, architectures[0]))


def family_default(support: AttentionSupport) -> str:
    """The implementation a family gets when the spec leaves the key at its default: the first of sdpa and eager the
    family supports (eager always is)."""
    return next(impl for impl in _FALLBACK if support.supports(impl))


def settle_attention(experiment: Experiment, provenance: dict[str, str]) -> Experiment:
    """``model.attn_implementation`` checked against the family: kept when supported; when it is the default and
    unsupported, the first supported of sdpa and eager instead, with provenance ("default for gemma2 ..."); when
    the spec or an override set an unsupported one, ``ConfigError`` naming the value that works. ``provenance`` is
    updated in place."""
    model = experiment.model
    support = None if model.trust_remote_code else attention_support(model.path)
    if support is None or support.supports(model.attn_implementation):
        return experiment
    if provenance.get(KEY, "default") == "default":
        chosen = family_default(support)
        provenance[KEY] = (f"default for {support.model_type}: {model.attn_implementation} is not supported "
                           f"({support.why(model.attn_implementation)})")
        return attrs.evolve(experiment, model=attrs.evolve(model, attn_implementation=chosen))
    others = [impl for impl in ("flash_attention_2", "flash_attention_3") if support.supports(impl)]
    raise ConfigError(f"\"{model.attn_implementation}\" is not supported by {support.architecture} "
                      f"({support.why(model.attn_implementation)}); use \"{family_default(support)}\""
                      + (f" (or {' / '.join(others)} on GPUs)" if others else ""), key=KEY)
