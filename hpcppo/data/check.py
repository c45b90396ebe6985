"""Compile-time checks of the prompt data and the reward: what would otherwise fail inside the job, after a queue
wait and three model loads, fails at ``hpcppo compile`` with one line (``--no-check-paths`` skips it all).

For every train and val file (a directory stands for its ``*.parquet``):

- it is Parquet (a ``.jsonl``/``.csv`` name gets a one-line "Parquet is required"), with verl's columns and types
  (the footer's schema only);
- the ``data_source`` column (read alone) has no null, and each value has a built-in scorer when
  ``data.reward_fn = "auto"``; a ``module:function`` reward is imported and its signature checked instead;
- when the tokenizer is local (``tokenizer.json`` in ``model.tokenizer_path`` or ``model.path``), the prompt
  lengths in tokens against ``data.max_prompt_length``: how many rows are too long, the longest, and which setting
  fixes it (an error with ``truncation = "error"``, a warning when they will be dropped or cut);
- the training rows left (after ``filter_overlong_prompts``) fill at least one ``trainer.train_batch_size``.

:func:`extra_info_values` reads one field of ``extra_info`` from every row (the compiler checks verl's
``tools_kwargs`` with it, against the configured tools: ``hpcppo.agent.kwargs``).

No torch and no transformers here (login node): the tokenizer is the ``tokenizers`` library on
``tokenizer.json``, and the chat template is rendered with jinja2 the way transformers renders it
(transformers/utils/chat_template_utils.py, 5.x: a sandboxed environment with ``trim_blocks``, ``lstrip_blocks``,
the ``loopcontrols`` extension, a ``tojson`` filter without HTML escaping, ``raise_exception`` and
``strftime_now``; the special tokens as variables).

Speed: a prompt cannot have more tokens than its text has UTF-8 bytes (every token of a byte-level BPE, a
byte-fallback SentencePiece or a WordPiece vocabulary covers at least one byte; special tokens are several), so
only rows whose rendered text is longer than ``max_prompt_length`` bytes are tokenised; the byte counts come from
pyarrow over the prompt column, and the template's own text is measured once per sequence of roles.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hpcppo.data.dataset import (OVERLONG_FIXES, expand_paths, is_text_prompt, read_schema, render_prompt,
                                 validate_schema)
from hpcppo.data.rewards import build_reward_fn, builtin_for, unknown_data_source
from hpcppo.errors import ConfigError, PathError

log = logging.getLogger(__name__)

#: tokens a post-processor or a prefix-space scheme may add on top of the byte bound (BOS/EOS, a leading "▁")
SPECIAL_TOKENS_MARGIN = 8
#: most rows tokenised per file; beyond, a uniform sample of the rows over the byte bound, and an estimate
SAMPLE_ROWS = 5_000  # ~1-7 s of tokenisation on 2 cores; a share's estimate within ~1% (binomial)
#: rows per pyarrow batch while streaming the prompt column (memory stays at one batch plus the sample)
BATCH_ROWS = 16_384
ENCODE_ROWS = 256  # prompts per encode_batch call
NO_BOUND = 1 << 40


@dataclass
class FileCheck:
    """What the check found in one Parquet file."""

    path: str
    rows: int
    data_sources: dict[str, int]
    too_long: int = 0  # rows over max_prompt_length (0 when the lengths were not checked)
    longest: tuple[int, int] | None = None  # (row, tokens) of the longest over-long prompt found
    candidates: int = 0  # rows long enough in bytes to be over max_prompt_length in tokens
    tokenized: int = 0  # of those, how many were tokenised (all, or a sample of SAMPLE_ROWS)

    @property
    def estimated(self) -> bool:
        """Whether ``too_long`` is extrapolated from a sample rather than counted."""
        return self.tokenized < self.candidates


@dataclass
class DataReport:
    """The files checked per key and the warnings given (also logged)."""

    files: dict[str, list[FileCheck]] = field(default_factory=dict)
    lengths_checked: bool = False
    notes: list[str] = field(default_factory=list)

    def rows(self, key: str) -> int:
        return sum(f.rows for f in self.files.get(key, []))

    def too_long(self, key: str) -> int:
        return sum(f.too_long for f in self.files.get(key, []))


def check_experiment_data(experiment: Any) -> DataReport:
    """:func:`check_data` with the experiment's sections (the one call compile makes)."""
    model = experiment.model
    return check_data(experiment.data, train_batch_size=experiment.trainer.train_batch_size,
                      tokenizer_dir=model.tokenizer_path or model.path, reward_model=experiment.reward_model.enable)


def check_data(data: Any, *, train_batch_size: int, tokenizer_dir: str | None, reward_model: bool = False) -> DataReport:
    """Check ``data`` (a :class:`~hpcppo.config.experiment.DataSection`); raise the first problem as a
    :class:`ConfigError` or :class:`PathError` naming the file and the key that fixes it.

    With a ``reward_model`` the training rows are scored by it, so their data sources need no rule-based scorer
    (verl calls none: rm_scores replace it); validation stays rule-based, except for files whose first row's
    ``reward_model.style`` is ``model``, which verl does not validate (``_validate`` in
    verl/trainer/ppo/ray_trainer.py, b178a3c)."""
    report = DataReport()
    auto = data.reward_fn == "auto"
    # Imports a user's function and checks its signature (a typo fails here); "auto" checks gsm8k_method.
    if auto:
        build_reward_fn("auto", gsm8k={"method": data.gsm8k_method})
    else:
        build_reward_fn(data.reward_fn, **data.reward_kwargs)
    counter = PromptLengths.load(tokenizer_dir, data.max_prompt_length, report)
    report.lengths_checked = counter is not None
    for key, items in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        checks = report.files.setdefault(key, [])
        for path in (expand_paths(items, key=key) if items else []):  # no val_files is allowed
            schema = read_schema(path)
            validate_schema(schema, str(path), data.prompt_key)
            by_rule = auto and not (reward_model and (key == "data.train_files" or _model_style(path)))
            check = FileCheck(path=str(path), rows=pq.ParquetFile(path).metadata.num_rows,
                              data_sources=_data_sources(path, by_rule))
            if counter is not None and check.rows:
                counter.measure(path, data.prompt_key, is_text_prompt(schema, data.prompt_key), check)
            _judge_lengths(key, check, data, report)
            checks.append(check)
    train_left = report.rows("data.train_files") - (report.too_long("data.train_files")
                                                    if data.filter_overlong_prompts else 0)
    if train_left < train_batch_size:
        dropped = " after filter_overlong_prompts drops the over-long ones" if data.filter_overlong_prompts else ""
        if data.filter_overlong_prompts and any(f.estimated for f in report.files["data.train_files"]):
            dropped = " (estimated from a sample)" + dropped
        hint = f"set trainer.train_batch_size <= {train_left} or add prompts" if train_left else (
            "raise data.max_prompt_length" if data.filter_overlong_prompts else "add prompts")
        raise ConfigError(f"the training files have {train_left} prompts{dropped}, fewer than one batch of "
                          f"{train_batch_size}", key="trainer.train_batch_size", hint=hint)
    for note in report.notes:
        log.warning("%s", note)
    return report


def _model_style(path: Path) -> bool:
    """Whether the file's first row has ``reward_model.style == "model"``."""
    first = pq.ParquetFile(path).read_row_group(0, columns=["reward_model"]).slice(0, 1).to_pylist()
    return bool(first) and (first[0].get("reward_model") or {}).get("style") == "model"


def _data_sources(path: Path, auto: bool) -> dict[str, int]:
    try:
        column = pq.read_table(path, columns=["data_source"]).column("data_source")
    except (OSError, pa.ArrowException) as exc:
        raise PathError(f"{path}: not a readable Parquet file ({exc})") from exc
    empty = pc.or_kleene(pc.is_null(column), pc.equal(pc.utf8_length(column), 0)).fill_null(True)
    bad = np.flatnonzero(empty.to_numpy(zero_copy_only=False))
    if bad.size:
        raise ConfigError(f"row {bad[0]}: data_source is null or empty ({bad.size} rows)", file=str(path))
    counts = {str(v["values"]): int(v["counts"]) for v in pc.value_counts(column).to_pylist()}
    if auto:
        for source, n in counts.items():
            if builtin_for(source) is None:
                err = unknown_data_source(source, file=str(path))
                err.add_note(f"{n} of the file's rows have this data_source")
                raise err
    return counts


def _judge_lengths(key: str, check: FileCheck, data: Any, report: DataReport) -> None:
    if not check.too_long:
        if check.estimated:
            report.notes.append(f"{check.path}: none of a sample of {check.tokenized} of the {check.candidates} rows "
                                f"long enough in bytes is over max_prompt_length={data.max_prompt_length} tokens; "
                                "the job checks every row")
        return
    assert check.longest is not None
    row, tokens = check.longest
    if check.estimated:
        what = (f"about {check.too_long} of {check.rows} prompts are longer than max_prompt_length="
                f"{data.max_prompt_length} tokens (counted on a sample of {check.tokenized} of the {check.candidates} "
                f"rows long enough in bytes to be; the longest found: row {row}, {tokens} tokens)")
    else:
        what = (f"{check.too_long} of {check.rows} prompts are longer than max_prompt_length="
                f"{data.max_prompt_length} tokens (the longest: row {row}, {tokens} tokens)")
    if data.filter_overlong_prompts:
        report.notes.append(f"{check.path}: {what}; filter_overlong_prompts drops them")
    elif data.truncation != "error":
        report.notes.append(f"{check.path}: {what}; truncation = {data.truncation!r} cuts them")
    else:
        raise ConfigError(what, file=check.path, key="data.max_prompt_length",
                          hint=OVERLONG_FIXES.replace("raise data.max_prompt_length",
                                                      f"set data.max_prompt_length >= {tokens}"))


# ---------------------------------------------------------------------------------------------------------------
# Prompt lengths without transformers


class _ChatTokenizer:
    """What :func:`~hpcppo.data.dataset.render_prompt` needs of a tokenizer: ``chat_template`` and
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``, from the files alone."""

    def __init__(self, template: str | None, special: Mapping[str, str]) -> None:
        self.chat_template = template
        self._compiled = _compile_template(template) if template else None
        self._special = dict(special)

    def apply_chat_template(self, messages: list[Mapping[str, str]], *, add_generation_prompt: bool,
                            tokenize: bool) -> str:
        assert self._compiled is not None and not tokenize
        return self._compiled.render(**self._special, messages=messages, add_generation_prompt=add_generation_prompt)


def _compile_template(template: str) -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):  # AddedToken as tokenizer_config.json stores it
        value = value.get("content")
    return value if isinstance(value, str) else None


class PromptLengths:
    """Token counts of prompts as the trainer's tokenizer counts them, from ``tokenizer.json``,
    ``tokenizer_config.json`` and ``chat_template.jinja``."""

    def __init__(self, tokenizer: Any, chat: _ChatTokenizer, max_prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.uses_chat_template = bool(chat.chat_template)
        self.max_prompt_length = max_prompt_length
        self._overhead: dict[tuple[str, ...], int] = {}

    @classmethod
    def load(cls, directory: str | None, max_prompt_length: int, report: DataReport) -> PromptLengths | None:
        """None (with a note) when the lengths cannot be checked here: no local ``tokenizer.json``."""
        path = Path(directory) if directory else None
        if path is None or not (path / "tokenizer.json").is_file():
            report.notes.append(f"prompt lengths not checked: no tokenizer.json in {directory or '(no model path)'} "
                                "(the job checks them when it loads the tokenizer)")
            return None
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            # tokenizer.json may carry padding (to the batch's longest) and truncation settings, which transformers
            # overrides per call and would falsify the counts here.
            tokenizer.no_padding()
            tokenizer.no_truncation()
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8")) \
                if (path / "tokenizer_config.json").is_file() else {}
        except Exception as exc:  # a tokenizer the library cannot read: the job would fail on it too
            raise ConfigError(f"cannot read the tokenizer in {path}: {type(exc).__name__}: {exc}",
                              key="model.tokenizer_path") from exc
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: transformers takes "default"
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if (path / "chat_template.jinja").is_file():  # transformers 5 writes it here, and prefers it
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        special = {name: text for name in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                                           "cls_token", "mask_token")
                   if (text := _token_text(config.get(name))) is not None}
        return cls(tokenizer, _ChatTokenizer(template or None, special), max_prompt_length)

    def count(self, messages_per_row: Sequence[Sequence[Mapping[str, str]]]) -> list[int]:
        """Exact token counts of these prompts (as :class:`~hpcppo.data.dataset.PromptDataset` tokenises them)."""
        counts: list[int] = []
        for i in range(0, len(messages_per_row), ENCODE_ROWS):  # Encoding objects are heavy: keep only lengths
            texts = [render_prompt(self.chat, m, self.uses_chat_template) for m in messages_per_row[i:i + ENCODE_ROWS]]
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=not self.uses_chat_template)
            counts.extend(len(e.ids) for e in encodings)
        return counts

    def _template_bytes(self, roles: tuple[str, ...]) -> int:
        if roles not in self._overhead:
            empty = [{"role": r, "content": ""} for r in roles]
            try:
                self._overhead[roles] = len(render_prompt(self.chat, empty, self.uses_chat_template).encode())
            except Exception:  # a template that refuses empty contents: no bound, tokenise those rows
                self._overhead[roles] = NO_BOUND
        return self._overhead[roles]

    def measure(self, path: Path, prompt_key: str, text_prompt: bool, check: FileCheck) -> None:
        """Fill ``check`` (``too_long``, ``longest``, ``candidates``, ``tokenized``) from the file's prompt column,
        streamed batch by batch: rows under the byte bound are fine; the others are tokenised, all of them up to
        :data:`SAMPLE_ROWS`, else a uniform sample (reservoir, seeded: the same file gives the same report)."""
        rng = np.random.default_rng(0)
        sample: list[tuple[int, Any]] = []
        seen = 0  # candidates so far
        start = 0
        # pre_buffer=False: one row group's column chunk in memory at a time, not the whole column.
        for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=BATCH_ROWS, columns=[prompt_key]):
            column = batch.column(0)
            if text_prompt:
                content_bytes = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
                signatures = np.zeros(len(column), dtype=np.int64)
                overhead = np.array([self._template_bytes(("user",))], dtype=np.int64)
            else:
                content_bytes, signatures, overhead = self._list_bytes(column)
            bound = content_bytes + overhead[signatures] + SPECIAL_TOKENS_MARGIN
            for i in np.flatnonzero(bound > self.max_prompt_length).tolist():
                seen += 1
                if len(sample) < SAMPLE_ROWS:
                    sample.append((start + i, column[i].as_py()))
                elif (j := int(rng.integers(seen))) < SAMPLE_ROWS:
                    sample[j] = (start + i, column[i].as_py())
            start += len(column)
        check.candidates, check.tokenized = seen, len(sample)
        sample = sorted((item for item in sample if item[1]), key=lambda item: item[0])  # nulls: the job names them
        if not sample:
            return
        messages = [[{"role": "user", "content": p}] if text_prompt else p for _, p in sample]
        try:
            counts = self.count(messages)
        except Exception as exc:  # the job would fail on the same template
            raise ConfigError(f"the chat template fails on a prompt of this file: {type(exc).__name__}: {exc}",
                              file=str(path), key="model.tokenizer_path") from exc
        over = [(row, n) for (row, _), n in zip(sample, counts, strict=True) if n > self.max_prompt_length]
        if check.estimated and over:  # at least the rows found; the rest scaled from the sample
            check.too_long = max(len(over), round(len(over) * seen / len(sample)))
        else:
            check.too_long = len(over)
        check.longest = max(over, key=lambda item: item[1]) if over else None

    def _list_bytes(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Per row: the UTF-8 bytes of its messages' contents, and which sequence of roles it has.
        n = len(column)
        flat = pc.list_flatten(column)
        parents = pc.list_parent_indices(column).to_numpy()
        lengths = pc.binary_length(flat.field("content")).fill_null(0).to_numpy(zero_copy_only=False)
        content_bytes = np.bincount(parents, weights=lengths, minlength=n).astype(np.int64)
        roles = type(column).from_arrays(column.offsets, column.values.field("role"))  # list or large_list
        joined = pc.binary_join(roles, "\x1f")
        encoded = pc.dictionary_encode(joined.fill_null(""))
        signatures = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        overhead = np.array([self._template_bytes(tuple(s.split("\x1f")) if s else ())
                             for s in encoded.dictionary.to_pylist()], dtype=np.int64)
        return content_bytes, signatures, overhead


def iter_extra_info_field(path: Path, name: str, batch_rows: int = 4096) -> Iterable[tuple[int, Any]]:
    """``(row, extra_info[name])`` of every row of one Parquet file whose ``extra_info`` has a non-null ``name``
    (e.g. verl's ``tools_kwargs``), reading that column only; nothing when the file's ``extra_info`` struct has no
    such field."""
    schema = read_schema(path)
    index = schema.get_field_index("extra_info")
    if index < 0 or not pa.types.is_struct(schema.field(index).type):
        return
    struct_type = schema.field(index).type
    child = struct_type.get_field_index(name)
    if child < 0:
        return
    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["extra_info"]):
        values = batch.column(0).flatten()[child].to_pylist()  # flatten: a null extra_info row gives None
        for i, value in enumerate(values):
            if value is not None:
                yield row + i, value
        row += len(values)


def extra_info_values(data: Any, name: str) -> Iterator[tuple[str, Path, int, Any]]:
    """``(config key, file, row, value)`` of every row of the training and validation files (a
    :class:`~hpcppo.config.experiment.DataSection`) whose ``extra_info.<name>`` is not null."""
    for key, paths in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        for path in expand_paths(paths, key=key) if paths else []:
            for row, value in iter_extra_info_field(path, name):
                yield key, path, row, value
