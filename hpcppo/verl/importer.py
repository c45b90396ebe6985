"""``hpcppo import-verl``: a verl command line or YAML in, an ``exp.toml`` out, every key accounted for.

Input: a shell script or pasted command line (``python3 -m verl.trainer.main_ppo \\`` continuations, ``key=value``,
``+key=value``, quotes, variables the script assigns itself substituted, others such as ``$HOME`` left as written),
or a verl YAML (Hydra-style nesting). Each key goes through :mod:`hpcppo.verl.names`; each translated value is
checked against the experiment schema before it is written, with a comment naming the verl setting it came from.
Whatever is not translated is listed with the reason, on stderr and at the end of the file. Where verl's default
differs from hpcppo's and the input leaves it unset, verl's default is written (verl would have run with it).
No torch here.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from hpcppo.verl import names as verl
from hpcppo.verl.names.async_policy import ASYNC, RECIPE_DEFAULTS, VERL_DOC as ASYNC_DOC, is_split, split_layout
from hpcppo.verl.names.convert import REF, dynamic_on
from hpcppo.config.convert import MAX_INPUT_BYTES, read_input
from hpcppo.config.experiment import Experiment
from hpcppo.config.rollout_corr import VERL_DOC as ROLLOUT_CORRECTION_DOC
from hpcppo.config.load import _check_leaf, experiment_from_data, leaf_keys, lookup_field
from hpcppo.verl.lex import UnterminatedQuoteError
from hpcppo.verl.read import (VERL_BASE_CONFIGS, VERL_OTHER_CONFIGS, YAML_MAX_DEPTH, YAML_MAX_VALUES, Read,
                                     Setting, locate_config, read_command_line, read_input_text, read_yaml,
                                     read_yaml_config, show)
from hpcppo.config.watchdog import default_rules
from hpcppo.errors import ConfigError, HpcppoError, PathError
from hpcppo.fsutil import atomic_write_text, require_parent_dir

__all__ = ["Setting", "Imported", "read_command_line", "read_yaml", "translate", "import_verl", "render_doc",
           "MAX_SETTINGS", "YAML_MAX_DEPTH", "YAML_MAX_VALUES", "WATCHDOG_MODES"]


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


MAX_SETTINGS = 5_000


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
_SMALLEST_WINS = {"rollout.micro_batch_size_per_gpu", "rollout.max_tokens_per_micro_batch"}
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
    if target in ("model.path", "model.critic_path", "reward_model.path") and isinstance(value, str) \
            and _HUB_ID.match(value) \
            and not (cwd / value).exists():
        imp.notes.append(f"{s.key}: {value} looks like a Hugging Face hub id; hpcppo loads a model directory: "
                         f"download it (huggingface-cli download {value} --local-dir DIR) and set {target} = DIR; as "
                         f"written it names the directory {value} next to the spec")
        return value
    rebased = [_rebase(v, cwd, out_dir) if isinstance(v, str) else v for v in items]
    return rebased if isinstance(value, list) else rebased[0]


# OmegaConf interpolations as verl writes them: ${other.key}, and ${oc.select:other.key,default} (the default when
# the other key is unset).
_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?(\.?[A-Za-z_][\w.]*)(?:,(.*))?\}$", re.S)


def _unresolved(value: Any) -> bool:
    return isinstance(value, str) and ("${" in value and value.strip().startswith("${") or value == "???")


def _interpolate(imp: Imported, s: Setting, e: verl.Entry | None, ctx: Mapping[str, Any]) -> Setting | None:
    """An OmegaConf interpolation takes the other key's value when the input sets it, else its ``oc.select``
    default, as OmegaConf resolves it; otherwise the setting is reported (unresolved where the key matters here)
    and None returned."""
    ref = _INTERPOLATION.match(s.value.strip()) if isinstance(s.value, str) else None
    other = (s.key.rpartition(".")[0] + ref.group(1) if ref.group(1).startswith(".") else ref.group(1)) if ref else None
    if ref and other is not None and (other in ctx or ref.group(2) is not None):  # ${.key}: a key beside this one
        value = ctx[other] if other in ctx else verl.parse_value(ref.group(2))
        return Setting(s.key, value, s.text, s.default, portable=value)
    if not s.default:
        what = f"a Hydra interpolation of {other}, which the input does not set" if ref else \
            "a Hydra interpolation or a missing value (???)"
        if e is None or e.kind == verl.IGNORED:
            imp.skip("ignored", s, f"{what}: verl fills it from verl's default there; {e.note if e else 'not a key'}")
        else:
            imp.skip("unresolved", s, f"{what}: its value is verl's default for that key, not known here; set "
                                      f"{e.hpcppo or 'it'} in the spec by hand")
    return None


def _apply(imp: Imported, s: Setting, ctx: dict[str, Any], cwd: Path, out_dir: Path) -> None:
    e = verl.lookup(s.key)
    if s.unknown and e is not None and e.kind in (verl.MAP, verl.UNSUPPORTED):  # never a guess
        written, why = s.unknown[0]
        imp.skip("unresolved", s, f"{written} cannot be known here ({why}); set the value in the spec by hand, or "
                                  f"set the variable and import again")
        return
    if _unresolved(s.value):
        resolved = _interpolate(imp, s, e, ctx)
        if resolved is None:
            return
        s = resolved
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
            imp.skip("ignored", s, f"{show(s.value)} is what hpcppo does ({e.note})")
        else:
            accepted = ", ".join(show(v) for v in e.ok)
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
    if s.environ_names and target in _PATH_KEYS and s.portable is not None:
        value = verl.translate(e, s.portable, ctx)  # ${NAME} kept: compile expands it where it runs
    elif s.environ_names:
        shown = ", ".join(f"${n}={os.environ.get(n, '')}" for n in s.environ_names)
        imp.notes.append(f"{s.key}: {shown} taken from this environment (the script does not set it)")
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
            imp.skip("conflict", first, f"{target} takes the smaller {show(value)} of {s.text}: hpcppo has one "
                                        f"setting for both, and the smaller fits wherever verl's larger one did")
            imp.values[target], imp.comments[target], imp.sources[target] = value, [origin], s
        else:
            why = ("the smaller is kept: it fits wherever verl's larger one did" if target in _SMALLEST_WINS
                   else "the first is kept")
            imp.skip("conflict", s, f"{target} is already {show(imp.values[target])} from {first.text}; hpcppo has "
                                    f"one setting for both ({why})")
        return
    imp.values[target] = value
    imp.comments[target] = [origin]
    imp.sources[target] = s


def _gather_reward_kwargs(settings: list[Setting]) -> list[Setting]:
    """``custom_reward_function.reward_kwargs.NAME=V`` settings (and a whole mapping) as one setting of the mapping,
    in place of the first: hpcppo has one key for them (data.reward_kwargs)."""
    key = verl.REWARD_KWARGS
    parts = [s for s in settings if s.key == key or s.key.startswith(key + ".")]
    if not parts:
        return settings
    merged: dict[str, Any] = {}
    for s in parts:
        if s.key == key:
            merged = dict(s.value) if isinstance(s.value, dict) else {"": s.value}
        else:
            target = merged
            *path, leaf = s.key[len(key) + 1:].split(".")
            for p in path:
                target = target.setdefault(p, {})
            target[leaf] = s.value
    if "" in merged:  # not a mapping: keep it as written for the entry to refuse
        whole = parts[-1]
    else:
        whole = Setting(key, merged, f"{key}={show(merged)}", portable=merged,
                        unknown=tuple(u for s in parts for u in s.unknown))
    first = settings.index(parts[0])
    rest = [s for s in settings if s not in parts]
    return rest[:first] + [whole] + rest[first:]


WATCHDOG_MODES = ("off", "defaults")


def _watchdog(imp: Imported, mode: str) -> None:
    """verl applies no watchdog rules; hpcppo's built-in ones change a run (a rollback halves the lr, KL raises the
    KL coefficient). ``off`` (the import's default): the run is the script's, and the hang monitor, which changes
    nothing in the training, stays on; ``defaults``: the built-in rules, listed in the file."""
    if mode not in WATCHDOG_MODES:
        raise ConfigError(f"--watchdog {mode!r}: allowed: {', '.join(WATCHDOG_MODES)}")
    rules = "; ".join(f"{r.name}: {r.metric} {r.condition} {r.threshold:g} -> {r.action}" for r in default_rules())
    imp.values["watchdog.enable"] = True
    if mode == "off":
        imp.values["watchdog.defaults"] = False
        imp.comments["watchdog.enable"] = ["import-verl --watchdog off: the hang monitor stays on (it cancels and "
                                           "requeues a job whose steps stop; the training itself is unchanged)"]
        imp.comments["watchdog.defaults"] = [f"import-verl --watchdog off: none of hpcppo's built-in rules, as in verl "
                                             f"(--watchdog defaults turns on {rules})"]
        imp.notes.append("watchdog: hpcppo's built-in rules are off, as verl has none (`import-verl --watchdog "
                         "defaults` or [watchdog] defaults = true turns them on); the hang monitor stays on")
    else:
        imp.values["watchdog.defaults"] = True
        imp.comments["watchdog.enable"] = ["import-verl --watchdog defaults: the hang monitor and the rules below"]
        imp.comments["watchdog.defaults"] = [f"import-verl --watchdog defaults: hpcppo's built-in rules, which verl "
                                             f"does not apply: {rules}"]
        imp.notes.append(f"watchdog: hpcppo's built-in rules are on (--watchdog defaults), which verl does not "
                         f"apply and which change the run when they fire: {rules}")


def translate(settings: list[Setting], *, name: str | None = None, default_name: str = "verl-import",
              cwd: Path | None = None, out_dir: Path | None = None, watchdog: str = "off",
              recipe: str = "") -> Imported:
    """Translate verl settings (later ones win, as in Hydra) into hpcppo values and a report. ``recipe``: the verl
    recipe the command runs (``one_step_off``, ``fully_async``; hpcppo.verl.read.RECIPES), "" for verl's trainer
    (a YAML: told by its keys)."""
    cwd = cwd or Path.cwd()
    out_dir = out_dir or cwd
    imp = Imported()
    last: dict[str, Setting] = {}
    for s in _gather_reward_kwargs(settings):
        if s.key in last:
            imp.notes.append(f"{s.key} is given twice; the later {s.text} wins, as in verl")
        last[s.key] = s
    recipe = _recipe_defaults(imp, last, recipe)
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
        _apply(imp, Setting(key, value, f"{key}={show(value)}", default=True), {**ctx, key: value}, cwd, out_dir)
    _derived_defaults(imp, ctx, cwd, out_dir)
    _split_placement(imp, ctx, recipe)
    _watchdog(imp, watchdog)
    imp.notes.append("resources.time is hpcppo's default (01:00:00) unless the site sets one; verl has no wall-time "
                     "limit: set resources.time for your partition (the job checkpoints and requeues at the limit)")
    if name:
        imp.values["name"], imp.comments["name"] = name, ["--name"]
    elif "name" not in imp.values:
        imp.values["name"] = verl.run_name(default_name)
        imp.comments["name"] = ["no trainer.experiment_name in the input: from the input's name"]
    return imp


def _recipe_defaults(imp: Imported, last: dict[str, Setting], recipe: str) -> str:
    """The recipe's own defaults for the keys the input leaves unset, added to ``last`` (hpcppo.verl.names.
    async_policy.RECIPE_DEFAULTS); the recipe, told by the input's keys when the entry module did not say it. The
    fully async recipe's step is its update (``require_batches x ppo_mini_batch_size`` prompts): verl's
    data.train_batch_size is then not one."""
    if not recipe:
        recipe = ("fully_async" if any(k.startswith(ASYNC) for k in last)
                  else "one_step_off" if is_split({k: s.value for k, s in last.items()}) else "")
    if not recipe:
        return ""
    staleness = last[ASYNC + "staleness_threshold"].value if ASYNC + "staleness_threshold" in last else None
    for key, value in RECIPE_DEFAULTS[recipe]:
        # verl: partial_rollout "only actually takes effect when staleness_threshold>0" (the recipe's README)
        if key in last or (key == ASYNC + "partial_rollout" and staleness == 0):
            continue
        last[key] = Setting(key, value, f"{key}={show(value)}", default=True)
    if recipe == "fully_async" and "data.train_batch_size" in last:
        s = last.pop("data.train_batch_size")
        imp.skip("ignored", s, "the fully async recipe's trainer updates on require_batches x ppo_mini_batch_size "
                               "prompts (its required_samples), hpcppo's step (async_training.require_batches)")
    return recipe


def _split_placement(imp: Imported, ctx: Mapping[str, Any], recipe: str) -> None:
    """verl's two resource pools as one allocation of trainer and rollout ranks (resources.nodes and gpus_per_node
    overwritten), and the one-step-off recipe's staleness."""
    if not is_split(ctx):
        return
    try:
        how, nodes, gpus, _ = split_layout(ctx)
    except verl.Untranslatable:
        return  # rollout.nnodes / n_gpus_per_node are reported with the reason
    pools = (f"verl's trainer pool (trainer.nnodes x n_gpus_per_node) and rollout pool (rollout.nnodes x "
             f"n_gpus_per_node) as one allocation")
    imp.values["resources.nodes"], imp.values["resources.gpus_per_node"] = nodes, gpus
    if how == "per-node":
        imp.comments["resources.gpus_per_node"] = [f"{pools}: each node holds both pools' GPUs"]
    else:
        imp.comments["resources.nodes"] = [f"{pools}: the rollout's nodes after the trainer's"]
    if recipe == "one_step_off" and "rollout.max_staleness" not in imp.values:
        imp.values["rollout.max_staleness"] = 1
        imp.comments["rollout.max_staleness"] = ["verl's one-step-off recipe: step k + 1 is generated while step k "
                                                 "trains, one policy version behind (OneStepOffRayTrainer)"]


def _derived_defaults(imp: Imported, ctx: Mapping[str, Any], cwd: Path, out_dir: Path) -> None:
    """verl's defaults that follow another key: critic.loss_agg_mode is
    ``${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}`` in _generated_ppo_trainer.yaml (the critic
    aggregates as the actor does), where hpcppo's critic keeps token-mean."""
    _dynamic_bsz_defaults(imp, ctx, cwd, out_dir)
    actor_mode = ctx.get(verl.A + "loss_agg_mode")
    if "critic.loss_agg_mode" not in ctx and actor_mode is not None and "critic.loss_agg_mode" not in imp.values:
        key = "critic.loss_agg_mode"
        _apply(imp, Setting(key, actor_mode, f"{key}=${{{verl.A}loss_agg_mode}} = {show(actor_mode)}", default=True),
               {**ctx, key: actor_mode}, cwd, out_dir)


def _dynamic_bsz_defaults(imp: Imported, ctx: Mapping[str, Any], cwd: Path, out_dir: Path) -> None:
    """verl's dynamic micro-batch defaults that follow another key (_generated_ppo_trainer.yaml): the rollout's,
    the reference's (``log_prob_use_dynamic_bsz``) and the critic's (``use_dynamic_bsz``) flags are
    ``${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}``, and the critic's forward budget is
    ``${.ppo_max_token_len_per_gpu}`` (32768 unless given)."""
    actor = verl.A + "use_dynamic_bsz"
    if ctx.get(actor) is True:
        for key in (verl.R + "log_prob_use_dynamic_bsz", REF + "log_prob_use_dynamic_bsz",
                    "critic.use_dynamic_bsz"):
            if key not in ctx:
                _apply(imp, Setting(key, True, f"{key}=${{{actor}}} = true", default=True), {**ctx, key: True}, cwd,
                       out_dir)
    forward = "critic.forward_max_token_len_per_gpu"
    if forward not in ctx and dynamic_on("critic.use_dynamic_bsz", ctx):
        value = ctx.get("critic.ppo_max_token_len_per_gpu", 32768)
        _apply(imp, Setting(forward, value, f"{forward}=${{critic.ppo_max_token_len_per_gpu}} = {show(value)}",
                            default=True), {**ctx, forward: value}, cwd, out_dir)


# ------------------------------------------------------------------------------------------------ writing

def _toml_value(value: Any) -> str:
    if isinstance(value, list):  # on one line, so that the line's comment follows it
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, on one line too
        keys = [k if re.fullmatch(r"[A-Za-z0-9_-]+", str(k)) else _toml_value(str(k)) for k in value]
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in zip(keys, value.values())) + "}"
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
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # never write a file that cannot be read back
        raise ConfigError(f"the translation is not TOML that reads back ({exc}); nothing written", file=label) from None
    try:
        experiment_from_data(data, label, base_dir)
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


def _follow_config(read: Read, label: str, script_dir: Path, cwd: Path) -> None:
    """The YAML named by ``--config-name``: its settings go first (the command line overrides them, as in Hydra);
    verl's own trainer configs are the base (ppo_trainer) or reported (the Megatron one); a YAML not found is
    reported, never skipped quietly."""
    name = (read.config_name or "").removesuffix(".yaml")
    shown = f"--config-name={read.config_name}"
    path_is_verls = read.config_path in (None, "config", "./config", "verl/trainer/config")
    if path_is_verls and name in VERL_BASE_CONFIGS:
        return
    if path_is_verls and name in VERL_OTHER_CONFIGS:
        read.reports.append(("unsupported", shown, VERL_OTHER_CONFIGS[name]))
        return
    if "$" in name:
        read.reports.append(("unresolved", shown, "the config's name cannot be known here (set in an if/fi, or from "
                                                   "the environment); its settings are not imported: import the YAML "
                                                   "as well (hpcppo import-verl FILE.yaml)"))
        return
    found, tried = locate_config(read, script_dir, cwd)
    if found is None:
        looked = ", ".join(str(t) for t in tried[:4]) or "nowhere (--config-path is not known here)"
        read.reports.append(("unsupported", f"--config-path={read.config_path} {shown}",
                             f"the YAML was not found (looked in {looked}); its settings are not imported: import "
                             f"it as well (hpcppo import-verl FILE.yaml) or run from verl's checkout"))
        return
    try:
        text = read_input(found).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PathError(f"{found} (named by {shown} in {label}) cannot be read: {exc}") from None
    sub = read_yaml_config(text, str(found))
    read.settings[:0] = sub.settings
    read.reports[:0] = sub.reports
    read.notes.append(f"{shown}: read {found} ({len(sub.settings)} settings; the command line overrides them)")


# A vision-language run: hpcppo trains text models only (its dataset reads text prompts, its models are causal LMs),
# and a VL run imported as text-only would train something else. Cues, each named in the refusal.
_VL_KEYS = ("data.image_key", "data.video_key", "actor_rollout_ref.actor.freeze_vision_tower",
            "data.return_multi_modal_inputs")
_VL_MODEL = re.compile(r"(?i)(?:^|[-_/])(?:[\w.]*-vl\b|glm-?4\.?1v|minicpm-?o|llava|internvl)")
_VL_DATA = re.compile(r"(?i)geo3k|geometry3k")


def refuse_vision_language(settings: list[Setting], label: str) -> None:
    """``ConfigError`` in one line when the input is a vision-language run, naming the setting that says so."""
    for s in settings:
        key = s.key
        if key in _VL_KEYS and s.value not in (None, False, "", "null") and not s.from_yaml:
            cue = f"{s.text} (images or videos in the prompts)"
        elif key.endswith("model.path") and isinstance(s.value, str) and _VL_MODEL.search(s.value):
            cue = f"{s.text} (a vision-language model)"
        elif key in ("data.train_files", "data.val_files") and _VL_DATA.search(str(s.value)):
            cue = f"{s.text} (verl's geometry3k data: prompts with images)"
        else:
            continue
        raise ConfigError(f"a vision-language run ({cue}); hpcppo trains text-only models on text prompts, so it "
                          f"is not imported", file=label)


def import_verl(source: str, out: Path, *, force: bool = False, name: str | None = None, stdin_text: str | None = None,
                cwd: Path | None = None, watchdog: str = "off",
                environ: Mapping[str, str] | None = None) -> tuple[Imported, str | None]:
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
    refuse_nul(text, label)
    cwd = cwd or Path.cwd()
    script_dir = Path(source).resolve().parent if source != "-" else cwd
    if _looks_like_yaml(text, source):
        read = read_yaml_config(text, label)
    else:
        try:
            read = read_input_text(text, environ)
        except UnterminatedQuoteError as exc:
            raise ConfigError(f"line {exc.line}: {exc} (bash -n refuses the script the same way)", file=label) from None
        if read.config_name is not None:
            _follow_config(read, label, script_dir, cwd)
    settings, notes = read.settings, read.notes
    if len(settings) > MAX_SETTINGS:  # each unknown key costs a did-you-mean over the whole table
        raise ConfigError(f"has {len(settings):,} settings; allowed: at most {MAX_SETTINGS:,} (a verl run sets a few "
                          f"hundred)", file=label)
    if not settings and not read.reports:
        raise ConfigError("no verl settings found (expected `python3 -m verl.trainer.main_ppo key=value ...` or a "
                          "verl YAML config)", file=label)
    refuse_vision_language(settings, label)
    out_dir = out.resolve().parent
    imp = translate(settings, name=name, default_name=stem, cwd=cwd, out_dir=out_dir, watchdog=watchdog,
                    recipe=read.recipe)
    imp.report[:0] = read.reports
    imp.notes[:0] = notes
    text_out = to_toml(imp, label)
    problem = _check(text_out, str(out), out_dir)
    try:
        atomic_write_text(out, text_out)
    except OSError as exc:
        raise PathError(f"{out} cannot be written: {exc.strerror or exc}") from None
    return imp, problem


def refuse_nul(text: str, label: str) -> None:
    """A NUL byte is no character of a script or a YAML file (bash drops it, YAML refuses it), and TOML cannot hold
    it: refused, with its line."""
    at = text.find("\x00")
    if at >= 0:
        raise ConfigError(f"line {text.count(chr(10), 0, at) + 1}: holds a NUL byte; a script or YAML file cannot",
                          file=label)


def format_report(imp: Imported) -> list[str]:
    """The stderr report: every setting not translated and why, then what to check by hand ($VAR left as written,
    a hub id instead of a directory, Hydra options not followed ...)."""
    lines = [f"not translated [{kind}] {text}: {why}" for kind, text, why in imp.report]
    return lines + [f"warning: {n}" for n in imp.notes]


# ------------------------------------------------------------------------------------------------ docs/verl.md

DOC_HEAD = """# verl keys in hpcppo

Generated by `hpcppo import-verl --table` from `hpcppo/verl/names/table.py` (tests/unit/test_verl_doc.py checks that
this file matches); verl keys as of verl commit {commit}.

`hpcppo import-verl run_ppo.sh -o exp.toml` translates a verl command line (or `FILE.yaml`) with this table and
reports every key it does not translate. The same table answers `-o` with a verl key (applied under its hpcppo name,
with a warning), `hpcppo config explain VERL_KEY`, and the did-you-mean of an unknown key.

Batch sizes use verl's vocabulary: `ppo_mini_batch_size` counts prompts, the `*_per_gpu` micro-batches count samples
per GPU. Kinds: a key of hpcppo; *not a verl key* (people type it; the right key is named); *ignored* (hpcppo gives
the same result without it); *not supported* (hpcppo cannot honour it; the values it accepts are listed). The
report adds *unresolved*: a value the script computes in a way that cannot be known here (`$(date)`, a variable set
nowhere or inside `if`/`fi`); it is never replaced by a guess.

**Reading a script** (`hpcppo/verl/shell.py`): what bash would expand, nothing run: the script's variables,
`${{B:-"${{HOME}}/b"}}` defaults (the environment's value when it sets B, else the default), `$((1024 * 8))`, arrays
spliced with `"${{DATA[@]}}"`, multi-line strings split by an unquoted `$ACTOR_CONFIG`. A variable the script does not
set but the environment does keeps its name in paths (`${{HOME}}/data/...`: compile expands it where it runs) and its
value elsewhere (noted on stderr). `--config-path`/`--config-name` YAMLs are read first and the command line
overrides them; verl's `ppo_megatron_trainer` is reported. YAML values are read as OmegaConf reads them (`3e-7` is a
float). A vision-language run (`data.image_key`, a `-VL` model, verl's geometry3k data) is refused in one line.

**Semantics that differ by default**: warm-up counts training steps in both (verl steps its lr scheduler once per
training step; hpcppo ramps the lr over every optimizer step within them); at this commit verl's `clip_ratio_low`
and `clip_ratio_high` default to 0.2, so `clip_ratio` alone changes nothing and is reported; `critic.loss_agg_mode`
follows the actor's. verl has no watchdog: the import writes `[watchdog] defaults = false` (`--watchdog off`, the
default; the hang monitor stays on) or hpcppo's built-in rules with `--watchdog defaults`, and says which.
ReMax's baseline (`adv_estimator=remax`) is the score of a greedy response per prompt in hpcppo, as verl's trainer
asks (`do_sample=False`) and its synchronous rollouts do; verl's default agent loop (`rollout.mode=async`) does not
read `do_sample` and samples that response at the rollout's temperature. `clip_cov` draws its tokens from a generator
seeded per step and rank (verl: `torch.randperm` on the global generator): as many tokens, among the same candidates.

**A reward model** (`reward_model.enable`): at this commit verl's default is its reward loop (`use_reward_loop=True`,
dp_reward_loop.yaml: the model served by vLLM's classify endpoint, `RewardLoopWorker.compute_score_disrm`);
`use_reward_loop=False` runs the FSDP `RewardModelWorker`. Both decode the response with the actor's tokenizer, append
it to the prompt's messages, render them with the reward model's chat template and take the one-label head's logit at
the last token. hpcppo runs the model with FSDP2 like its reference and reads it as the worker does (input cut to
`reward_model.max_length` from the right, special tokens from the template only); it always re-templates, so
`model.input_tokenizer=null` with the legacy worker (the actor's tokens fed as they are) is refused. The score
replaces the rule-based one in training (verl's `rm_scores` skip the reward manager): a reward model with the DAPO
manager is refused rather than half applied. Validation stays rule-based, and is skipped for data whose
`reward_model.style` is `model`, as in verl. **DAPO's overlong buffer** (`reward_manager=dapo`) adds verl's
`min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)` to the score of a response of `L` tokens, in training and
validation (verl builds both reward functions with the same kwargs); with `log` the batch's mean penalty and overlong
fraction are metrics (verl keeps them as extra info). Validation then logs `val/score/<source>` (verl's `reward`, in
its `val-aux`) and `val/acc/<source>`, the score before the penalty: verl's `acc`, its `val-core` metric with DAPO.

**LoRA** (`model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules` -> `[actor.lora]`, `[critic.lora]`):
peft's adapters as verl's FSDP workers build them (`r`, `lora_alpha`, `bias="none"`, no dropout, `lora_B = 0`), and the
reference is the actor with its adapters disabled, as verl's. The rollout engine differs in form, not in math: verl
loads the base into vLLM once and then sends only the adapters (vLLM's LoRA support, `enable_lora`); hpcppo sends
merged weights `W + (alpha / r) B A` under the base model's names (equal, bit for bit, to peft's `merge_and_unload`),
so vLLM and the HF engine run plain weights: the same matmuls as a full fine-tune, no LoRA kernels, no adapter dtype
of vLLM's own, no `max_lora_rank`. The actor's `lora_adapter_path` (a trained adapter to continue) becomes
`actor.lora.adapter_path`; verl reads r, alpha and the target modules from the adapter, hpcppo checks at compile that
`[actor.lora]` has the adapter's.

{asynchronous}
{rollout_correction}
When the input leaves one of these unset, the import writes verl's default, because hpcppo's differs: {defaults}
(`trainer.val_before_train` only when `data.val_files` is given, `fsdp_size` only on more than one node).
"""
_TABLE_HEAD = "| verl key | hpcppo | note |\n|---|---|---|\n"


def _group(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] in ("actor_rollout_ref", "critic") and len(parts) > 2 else parts[0]


def render_doc() -> str:
    """docs/verl.md: the mapping table, one section per verl config group, from the entries the importer uses."""
    defaults = ", ".join(f"`{k}={show(v)}`" for k, v in VERL_DEFAULTS)
    out = [DOC_HEAD.format(commit=verl.VERL_COMMIT, defaults=defaults, rollout_correction=ROLLOUT_CORRECTION_DOC,
                           asynchronous=ASYNC_DOC)]
    groups: dict[str, list[verl.Entry]] = {}
    for e in verl.ENTRIES:
        group = "keys verl does not have" if e.kind == verl.NOT_VERL else _group(e.verl)
        groups.setdefault(group, []).append(e)
    for group, entries in groups.items():
        rows = [f"| {a} | {b} | {c.replace('|', '/')} |" for a, b, c in verl.table_rows(entries)]
        out.append(f"\n## {group}\n\n" + _TABLE_HEAD + "\n".join(rows) + "\n")
    return "".join(out)
