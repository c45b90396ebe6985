"""Load site profiles and experiment specs: layers, overrides, provenance, relative paths.

Precedence (lowest first), each layer recorded per dotted key in the provenance:

``default``   the schema's defaults;
``site``      the site's ``[defaults]`` table (experiment keys) and, for ``site.*`` keys, the site file;
``spec``      the experiment spec file;
``override``  ``-o key=value`` on the command line; ``-o site.slurm.partition=debug`` targets the site.

Sections merge key by key; any other value (a list, a table such as ``env.vars``, the watchdog rules)
is replaced as a whole by a higher layer. Relative file-system paths (``model.path``,
``data.train_files`` ...) are made absolute against the directory of the file that set them (the
spec's or the site's directory; the current directory for ``-o``), after expanding ``~`` and ``$VAR``
(:func:`expand_path_text`: a variable that is not set is an error naming it, not a literal ``$VAR`` directory).
"""

from __future__ import annotations

import getpass
import os
import unicodedata
import re
import tomllib
import types
import typing
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo.verl import names as verl
from hpcppo.config.convert import is_section, read_toml, section_class, section_fields, structure, type_text
from hpcppo.config.experiment import Experiment
from hpcppo.config.fields import FieldValueError, did_you_mean, fmt_value
from hpcppo.config.site import Site
from hpcppo.errors import ConfigError, SiteNotFoundError
from hpcppo.resources import sites_dir

__all__ = ["Layer", "load_site", "load_site_with_provenance", "load_experiment", "load_experiment_with_provenance",
           "parse_overrides", "site_search_dirs", "experiment_from_data", "available_sites", "lookup_field", "OVERRIDE_LABEL",
           "leaf_keys", "expand_path_text"]

OVERRIDE_LABEL = "command line (-o)"
SITE_PREFIX = "site."


@attrs.frozen
class Layer:
    """One source of values: a nested dict, where it came from, and the directory relative paths use."""

    data: dict[str, Any]
    source: str  # default | site | spec | override
    label: str  # file name (or OVERRIDE_LABEL) used in error messages
    base_dir: Path | None  # for relative paths; None = leave them as given


def _resolve_all(cls: type, seen: set[type] | None = None) -> None:
    seen = set() if seen is None else seen
    if cls in seen:
        return
    seen.add(cls)
    for attribute in section_fields(cls).values():
        if is_section(attribute):
            _resolve_all(section_class(attribute), seen)


_resolve_all(Experiment)
_resolve_all(Site)


def _experiment_sections(cls: type = Experiment) -> set[type]:
    out = {cls}
    for attribute in section_fields(cls).values():
        if is_section(attribute):
            out |= _experiment_sections(section_class(attribute))
    return out


_EXPERIMENT_SECTIONS = _experiment_sections()


def _unknown(key: str, dotted: str, fields: dict[str, attrs.Attribute[Any]], cls: type) -> str:
    """The message for an unknown key: a verl name's hpcppo key first (the mapping knows what was meant), else the
    closest key by spelling."""
    pointer = verl.hint(dotted) if cls in _EXPERIMENT_SECTIONS else None
    suggestion = f" ({pointer})" if pointer else did_you_mean(key, fields)
    return f"unknown key{suggestion}; known keys here: {', '.join(fields)}"


def lookup_field(cls: type, dotted: str, *, label: str | None = None, shown_prefix: str = "") -> attrs.Attribute[Any]:
    """The field a dotted key names, or ConfigError with did-you-mean among that section's keys."""
    parts = dotted.split(".")
    current = cls
    for i, part in enumerate(parts):
        fields = section_fields(current)
        if part not in fields:
            where = shown_prefix + ".".join(parts[: i + 1])
            raise ConfigError(_unknown(part, dotted if cls is Experiment else "", fields, cls), file=label, key=where)
        attribute = fields[part]
        if i < len(parts) - 1:
            if not is_section(attribute):
                where = shown_prefix + ".".join(parts[: i + 1])
                raise ConfigError(f"is a {type_text(attribute.type)}, not a section with keys", file=label, key=where)
            current = section_class(attribute)
    return attribute


_VAR_RE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)  # what os.path.expandvars expands


def _account_name() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return None


def expand_path_text(value: str, *, key: str, label: str | None = None) -> str:
    """``~`` and ``$VAR``/``${VAR}`` expanded; ``ConfigError`` naming the variable (and ``key``, ``label``) when one
    is not set. ``$USER``/``$LOGNAME`` and ``$HOME``, which batch jobs, cron and containers sometimes lack, fall
    back to the account's name and home directory."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)[1:-1] if m.group(1).startswith("{") else m.group(1)
        if name in os.environ:
            return os.environ[name]
        fallback = _account_name() if name in ("USER", "LOGNAME") else str(Path.home()) if name == "HOME" else None
        if fallback:
            return fallback
        raise ConfigError(f"${{{name}}} is not set in the environment (in {value!r}); set it, or write the path "
                          f"without it", file=label, key=key)

    return os.path.expanduser(_VAR_RE.sub(one, value))


def _expand_path(value: str, base_dir: Path | None, *, key: str, label: str | None) -> str:
    if not value:
        return value
    expanded = expand_path_text(value, key=key, label=label)
    if base_dir is not None and not os.path.isabs(expanded):
        expanded = os.path.normpath(str(base_dir / expanded))
    return expanded


def _check_leaf(attribute: attrs.Attribute[Any], value: Any, *, key: str, label: str) -> Any:
    """Type-check and range-check one value now, so the error names the layer it came from."""
    checked = structure(value, attribute.type, file=label, path=key)
    if attribute.validator is not None and not is_section(attribute):
        try:
            attribute.validator(None, attribute, checked)
        except FieldValueError as exc:
            raise ConfigError(exc.message, file=label, key=key) from None
    return checked


def _merge(cls: type, base: dict[str, Any], layer: Layer, data: dict[str, Any], prov: dict[str, str],
           prefix: str, shown_prefix: str) -> None:
    """Merge ``data`` (part of ``layer``) into ``base`` for section ``cls``; record provenance."""
    fields = section_fields(cls)
    for key, value in data.items():
        dotted = prefix + key
        shown = shown_prefix + dotted
        if key not in fields:
            raise ConfigError(_unknown(key, dotted, fields, cls), file=layer.label, key=shown)
        attribute = fields[key]
        if is_section(attribute):
            if not isinstance(value, dict):
                raise ConfigError(f"expected a table (section), got {fmt_value(value)}", file=layer.label, key=shown)
            sub = base.setdefault(key, {})
            _merge(section_class(attribute), sub, layer, value, prov, dotted + ".", shown_prefix)
            continue
        _check_leaf(attribute, value, key=shown, label=layer.label)
        if attribute.metadata.get("path"):
            if isinstance(value, list):
                value = [_expand_path(v, layer.base_dir, key=f"{shown}[{i}]", label=layer.label)
                         for i, v in enumerate(value)]
            else:
                value = _expand_path(value, layer.base_dir, key=shown, label=layer.label)
        base[key] = value
        prov[dotted] = layer.source


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """All dotted leaf keys of a section class, in declaration order."""
    out: list[str] = []
    for name, attribute in section_fields(cls).items():
        if is_section(attribute):
            out.extend(leaf_keys(section_class(attribute), f"{prefix}{name}."))
        else:
            out.append(prefix + name)
    return out


def _build(cls: type, layers: Sequence[Layer], *, shown_prefix: str = "") -> tuple[Any, dict[str, str]]:
    merged: dict[str, Any] = {}
    prov: dict[str, str] = {}
    for layer in layers:
        _merge(cls, merged, layer, layer.data, prov, "", shown_prefix)
    labels = {layer.source: layer.label for layer in layers}
    # Errors no single layer explains (a missing required key, a cross-field check) name the main file.
    main_label = next((layer.label for layer in layers if layer.source == "spec"), layers[0].label)

    def file_for(key: str) -> str | None:
        bare = key[len(shown_prefix):] if key.startswith(shown_prefix) else key
        bare = bare.split("[")[0]
        while bare:
            if bare in prov:
                return labels.get(prov[bare], main_label)
            bare = bare.rpartition(".")[0]
        return main_label

    obj = structure(merged, cls, file=main_label, path=shown_prefix.rstrip("."), file_for=file_for)
    full = {k: prov.get(k, "default") for k in leaf_keys(cls)}
    return obj, full


# ------------------------------------------------------------------------------------------------ overrides

def _shown(raw: str, limit: int = 60) -> str:
    """A command-line value as an error message quotes it: whole when short, else its start and its length."""
    return repr(raw) if len(raw) <= limit else f"{raw[:40]!r}... ({len(raw)} characters)"


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _convert_override(attribute: attrs.Attribute[Any], key: str, raw: str) -> Any:
    tp = attribute.type
    text = raw.strip()
    if tp is str and not (text[:1] in ('"', "'")):
        return raw  # plain strings need no quotes on the command line
    if text.lower() in ("none", "null", "unset") and "None" in repr(tp):
        return None
    str_union = _is_union(tp) and str in typing.get_args(tp)  # rollout_rs: str | None, rollout_rs_threshold: ...
    if str_union and text[:1] not in ('"', "'") and ("_" in text or "," in text):
        return raw  # "0.6_1.6,2.5", and "1_2" is not TOML's 12 here
    if tp is bool and text.lower() in ("true", "false"):
        text = text.lower()
    hint = f"expected {type_text(tp)}, got {_shown(raw)}"
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        if str_union and text[:1] not in ('"', "'"):
            return raw  # a string-or-unset key (rollout_rs = "token_k1,seq_max_k2"): no quotes needed either
        raise ConfigError(f"{hint} (write TOML: 1e-6, true, \"text\", [1, 2], {{a = 1}})", file=OVERRIDE_LABEL,
                          key=key) from None
    except ValueError:  # Python's limit on the digits of an integer (4300)
        raise ConfigError(f"{hint}: a number of more than 4300 digits is not a setting", file=OVERRIDE_LABEL,
                          key=key) from None
    except RecursionError:
        raise ConfigError(f"{hint}: nested too deeply to read", file=OVERRIDE_LABEL, key=key) from None
    return parsed["v"]


def _set_nested(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def _refuse_invisible(item: str, key: str, raw: str) -> None:
    """A key is ASCII letters, digits, ``_``, ``-`` and dots; a value has no other whitespace at its ends than spaces
    and tabs. A non-breaking or zero-width space (pasted from a web page) would otherwise vanish in a ``strip()``
    and the override would silently mean something the user cannot see."""
    bad = next((c for c in key if not (c.isascii() and (c.isalnum() or c in "_-."))), None)
    if bad is None:
        edges = raw[:1] + raw[-1:]
        bad = next((c for c in edges if c.isspace() and c not in " \t" or unicodedata.category(c) == "Cf"), None)
    if bad is not None:
        raise ConfigError(f"{_shown(item)} contains {bad!r} ({unicodedata.name(bad, 'U+%04X' % ord(bad))}); keys are "
                          f"ASCII letters, digits, '_' and dots (e.g. -o actor.lr=1e-6): retype it",
                          file=OVERRIDE_LABEL)


def parse_overrides(overrides: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``key=value`` overrides into (experiment layer data, site layer data), values typed by the schema."""
    exp: dict[str, Any] = {}
    site: dict[str, Any] = {}
    for item in overrides:
        bad = next((c for c in item if c in "\n\r\x00"), None)
        if bad is not None:
            # TOML would read what follows a newline as more keys, and the shell gives no sign of it.
            raise ConfigError(f"{_shown(item)} contains {bad!r}; an override is one key=value on one line: give each "
                              f"key=value its own -o", file=OVERRIDE_LABEL)
        key, sep, raw = item.partition("=")
        key = key.strip(" \t")
        if not sep or not key:
            raise ConfigError(f"{_shown(item)} is not key=value (e.g. -o actor.lr=1e-6)", file=OVERRIDE_LABEL)
        if any(not part.strip() for part in key.split(".")):
            raise ConfigError(f"{key!r} is not a dotted key: a key name is empty (keys look like actor.lr or "
                              f"site.slurm.partition)", file=OVERRIDE_LABEL)
        _refuse_invisible(item, key, raw)
        if key.startswith(SITE_PREFIX):
            bare = key[len(SITE_PREFIX):]
            attribute = lookup_field(Site, bare, label=OVERRIDE_LABEL, shown_prefix=SITE_PREFIX)
            _set_nested(site, bare, _convert_override(attribute, key, raw))
        else:
            try:
                attribute = lookup_field(Experiment, key, label=OVERRIDE_LABEL)
            except ConfigError:
                # A verl key that means one hpcppo key with a value of its own (actor_rollout_ref.actor.clip_ratio)
                # is applied under the hpcppo name with a warning: the spec and resolved.toml stay in hpcppo's
                # terms. Any other verl key is refused with the pointer lookup_field put in the message.
                translated = verl.translate_override(key, raw)
                if translated is None:
                    raise
                target, value, message = translated
                warnings.warn(message, verl.VerlNameWarning, stacklevel=2)
                _set_nested(exp, target, value)
                continue
            _set_nested(exp, key, _convert_override(attribute, key, raw))
    return exp, site


# ------------------------------------------------------------------------------------------------ sites

def site_search_dirs() -> list[Path]:
    """Where site names are looked up, in order: $HPCPPO_SITES_DIR, ~/.config/hpcppo/sites, packaged sites/."""
    dirs = [Path(d) for d in os.environ.get("HPCPPO_SITES_DIR", "").split(os.pathsep) if d]
    for d in dirs:
        _usable(d, "directory", "$HPCPPO_SITES_DIR", "directories separated by ':'")
    dirs.append(Path.home() / ".config" / "hpcppo" / "sites")
    try:
        dirs.append(sites_dir())
    except FileNotFoundError:
        pass
    return dirs


def _usable(path: Path, kind: str, where: str, allowed: str) -> bool:
    """Whether ``path`` is a ``kind`` ("directory" or "file"); ``ConfigError`` naming ``where`` when the file
    system refuses to even look (a name too long, a component that is not a directory we may search)."""
    try:
        return (path.is_dir() if kind == "directory" else path.is_file())
    except OSError as exc:
        text = str(path)
        shown = text if len(text) <= 80 else f"{text[:60]}...{text[-12:]} ({len(text)} characters)"
        raise ConfigError(f"{shown!r} cannot be used: {exc.strerror}; allowed: {allowed}", key=where) from None


def available_sites() -> dict[str, Path]:
    """Site name -> file, the first found along :func:`site_search_dirs` winning."""
    found: dict[str, Path] = {}
    for d in site_search_dirs():
        if d.is_dir():
            for f in sorted(d.glob("*.toml")):
                found.setdefault(f.stem, f)
    return found


def _site_file(name_or_path: str | os.PathLike[str]) -> Path:
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text or (os.altsep and os.altsep in text):
        path = Path(text).expanduser()
        # Something that is there but not a file (a directory, a FIFO, a device) is named by read_toml.
        if not _usable(path, "file", "--site", "a site name or the path of a site .toml file") and not path.exists():
            raise SiteNotFoundError("site file not found", file=str(path))
        return path
    sites = available_sites()
    if text in sites:
        return sites[text]
    names = ", ".join(sorted(sites)) or "none"
    raise SiteNotFoundError(f"unknown site {text!r}{did_you_mean(text, sites)}; available sites: {names} "
                            f"(searched {os.pathsep.join(str(d) for d in site_search_dirs())})")


def load_site_with_provenance(name_or_path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
                              ) -> tuple[Site, dict[str, str], Path]:
    """Load a site (name or .toml path); ``overrides`` is parsed site layer data. Returns site, provenance, file."""
    path = _site_file(name_or_path)
    data = read_toml(path)
    layers = [Layer(data, "site", str(path), None)]
    if overrides:
        layers.append(Layer(overrides, "override", OVERRIDE_LABEL, None))
    # templates.dir is relative to the site file: a site directory may ship its own templates.
    tdir = data.get("templates", {}).get("dir") if isinstance(data.get("templates"), dict) else None
    if isinstance(tdir, str) and tdir:
        data["templates"]["dir"] = _expand_path(tdir, path.parent, key="templates.dir", label=str(path))
    site, prov = _build(Site, layers, shown_prefix="")
    _refuse_unused_scheduler_keys(site, overrides or {})
    if site.defaults:
        # Check the [defaults] table against the experiment schema now (keys, types, ranges), and make
        # its relative paths absolute against the site file's directory.
        checked: dict[str, Any] = {}
        _merge(Experiment, checked, Layer(site.defaults, "site", str(path), path.parent), site.defaults, {}, "",
               "defaults.")
        site = attrs.evolve(site, defaults=checked)
    return site, prov, path


def _refuse_unused_scheduler_keys(site: Site, overrides: dict[str, Any]) -> None:
    """A ``-o site.slurm.*`` on a site whose jobs do not go through Slurm (or ``site.local.*`` on a Slurm site)
    would be accepted and do nothing: refused, naming the scheduler that is used."""
    unused = "local" if site.scheduler == "slurm" else "slurm"
    section = overrides.get(unused)
    if isinstance(section, dict) and section:
        key = f"{SITE_PREFIX}{unused}.{next(iter(section))}"
        raise ConfigError(f"site {site.name!r} runs jobs with scheduler {site.scheduler!r}: {unused} keys do nothing "
                          f"there; allowed: {SITE_PREFIX}{site.scheduler}.* (or another --site)",
                          file=OVERRIDE_LABEL, key=key)


def load_site(name_or_path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> Site:
    """Load a site by name (searched in :func:`site_search_dirs`) or by path to a .toml file.

    ``overrides`` are ``key=value`` strings for site keys, with or without the ``site.`` prefix.
    """
    items = [o if o.startswith(SITE_PREFIX) else SITE_PREFIX + o for o in overrides]
    _, site_data = parse_overrides(items)
    return load_site_with_provenance(name_or_path, site_data)[0]


# ------------------------------------------------------------------------------------------------ experiments

def load_experiment_with_provenance(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None, *,
                                    site: Site | None = None, site_file: str | None = None,
                                    cwd: Path | None = None) -> tuple[Experiment, dict[str, str]]:
    """Build the experiment from site defaults < spec < overrides (parsed layer data)."""
    spec = Path(path)
    return experiment_from_data(read_toml(spec), str(spec), spec.resolve().parent, overrides, site=site,
                                site_file=site_file, cwd=cwd)


def experiment_from_data(data: dict[str, Any], label: str, base_dir: Path | None,
                         overrides: dict[str, Any] | None = None, *, site: Site | None = None,
                         site_file: str | None = None, cwd: Path | None = None) -> tuple[Experiment, dict[str, str]]:
    """Like :func:`load_experiment_with_provenance` for spec data already parsed (``label`` names it)."""
    layers = []
    if site is not None and site.defaults:
        # Paths in site.defaults were made absolute when the site was loaded.
        layers.append(Layer(site.defaults, "site", f"{site_file or site.name} [defaults]", None))
    layers.append(Layer(data, "spec", label, base_dir))
    if overrides:
        layers.append(Layer(overrides, "override", OVERRIDE_LABEL, cwd or Path.cwd()))
    return _build(Experiment, layers)


def load_experiment(path: str | os.PathLike[str], overrides: Iterable[str] = (), *, site: Site | None = None
                    ) -> Experiment:
    """Load an experiment spec with ``key=value`` overrides (experiment keys only) and optional site defaults."""
    exp_data, site_data = parse_overrides(overrides)
    if site_data:
        raise ConfigError("site.* overrides need a site: use compile_config", file=OVERRIDE_LABEL)
    return load_experiment_with_provenance(path, exp_data, site=site)[0]
