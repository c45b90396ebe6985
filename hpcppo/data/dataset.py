"""Prompt datasets in verl's Parquet schema: read, validate, write, tokenise.

verl's preprocessing scripts write one Parquet row per prompt with these columns (nested types)::

    data_source   string
    prompt        list<struct<role: string, content: string>>     (chat messages; column name = prompt_key)
                  or string                                        (plain text: one user message)
    ability       string                                           (optional)
    reward_model  struct<style: string, ground_truth: string>
    extra_info    struct<...>                                      (optional, e.g. split/index/answer/question)

Files written by verl users load unchanged. Columns other than these are ignored on read (verl files may carry
more), so the error for a missing column lists the required and optional ones and the columns present.

Nothing here imports torch: reading, validating and writing Parquet are used by login-node tools
(``tools/prepare_gsm8k.py``, config checks), which must not pay for — or need — torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from hpcppo.fsutil import atomic_write
from hpcppo.errors import ConfigError, PathError

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
#: ``extra_info`` as verl's GSM8K preprocessing writes it; other data sets bring their own struct.
GSM8K_EXTRA_INFO_TYPE = pa.struct(
    [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
)
REQUIRED_COLUMNS = ("data_source", "reward_model")  # plus the prompt column (prompt_key)
VISION_COLUMNS = ("images", "videos")  # verl's default data.image_key and data.video_key
OPTIONAL_COLUMNS = ("ability", "extra_info")
TRUNCATION_MODES = ("error", "left", "right", "middle")
#: files that are not Parquet but look like prompt data: named in the error, with how to convert them
NOT_PARQUET_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".arrow")
PROMPT_TYPES = "list<struct<role: string, content: string>> (chat messages) or string (plain text)"

Truncation = Literal["error", "left", "right", "middle"]  # data.truncation's values


def prompt_schema(prompt_key: str = "prompt", extra_info_type: pa.DataType = GSM8K_EXTRA_INFO_TYPE) -> pa.Schema:
    """The explicit Parquet schema we write (verl's column order)."""
    return pa.schema(
        [
            ("data_source", pa.string()),
            (prompt_key, pa.list_(MESSAGE_TYPE)),
            ("ability", pa.string()),
            ("reward_model", REWARD_MODEL_TYPE),
            ("extra_info", extra_info_type),
        ]
    )


@dataclass(frozen=True)
class PromptRecord:
    """One prompt row, as read from a file.

    ``ground_truth`` is passed to reward functions as stored (verl does the same); the built-in scorers expect a
    string. ``source`` and ``row`` locate the row for error messages.
    """

    data_source: str
    prompt: list[dict[str, str]]
    ground_truth: Any
    ability: str | None = None
    reward_style: str | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    row: int = 0

    def to_row(self, prompt_key: str = "prompt") -> dict[str, Any]:
        """The verl-schema row this record came from (for :func:`write_prompts_parquet`)."""
        return {
            "data_source": self.data_source,
            prompt_key: [dict(m) for m in self.prompt],
            "ability": self.ability,
            "reward_model": {"style": self.reward_style, "ground_truth": self.ground_truth},
            "extra_info": dict(self.extra_info) if self.extra_info else None,
        }


# ---------------------------------------------------------------------------------------------------------------
# Writing


def write_prompts_parquet(
    rows: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    prompt_key: str = "prompt",
    extra_info_type: pa.DataType | None = None,
) -> Path:
    """Write verl-schema rows to ``path`` atomically (temp file in the same directory, fsync, rename).

    ``extra_info_type`` fixes the struct type of ``extra_info``; when None it is inferred from the rows (it must
    come out as a struct). Returns the final path. A reader never sees a half-written file.
    """
    path = Path(path)
    rows = list(rows)
    for i, row in enumerate(rows):
        _check_row_for_write(row, i, prompt_key, path)
    if extra_info_type is None:
        extra_values = [row.get("extra_info") for row in rows]
        extra_info_type = pa.array(extra_values).type if any(v for v in extra_values) else GSM8K_EXTRA_INFO_TYPE
        if not pa.types.is_struct(extra_info_type):
            raise ConfigError(f"extra_info must be a mapping in every row, got values of type {extra_info_type}",
                              file=str(path), key="extra_info")
    schema = prompt_schema(prompt_key, extra_info_type)
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    table = pa.Table.from_pydict(columns, schema=schema)

    return atomic_write(path, lambda fh: pq.write_table(table, fh))


def _check_row_for_write(row: Mapping[str, Any], i: int, prompt_key: str, path: Path) -> None:
    where = f"row {i}"
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(row).__name__}", file=str(path))
    for key in ("data_source", prompt_key, "reward_model"):
        if key not in row:
            raise ConfigError(f"{where}: missing key {key!r} (a row needs data_source, {prompt_key}, reward_model; "
                              f"ability and extra_info are optional)", file=str(path))
    messages = row[prompt_key]
    if not isinstance(messages, list | tuple) or not messages:
        raise ConfigError(f"{where}: {prompt_key} must be a non-empty list of {{role, content}} messages",
                          file=str(path))
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(f"{where}: every message in {prompt_key} needs string 'role' and 'content', got {m!r}",
                              file=str(path))
    reward = row["reward_model"]
    if not isinstance(reward, Mapping) or not isinstance(reward.get("ground_truth"), str):
        raise ConfigError(f"{where}: reward_model must be a mapping with a string 'ground_truth', got {reward!r}",
                          file=str(path))


# ---------------------------------------------------------------------------------------------------------------
# Reading


def expand_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 key: str | None = None) -> list[Path]:
    """Files named by ``paths``: a directory stands for its ``*.parquet`` files, sorted by name. ``key`` (e.g.
    ``data.train_files``) names the config entry in the errors, as compile reports them."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise ConfigError("no prompt files given")
    out: list[Path] = []
    for i, item in enumerate(items):
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.parquet"))
            if not found:
                raise PathError(f"{key}[{i}]: directory {p} contains no *.parquet files" if key
                                else f"{p}: directory contains no *.parquet files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise PathError(f"{key}[{i}]: {p} does not exist" if key else f"{p}: prompt file does not exist")
    return out


def count_rows(paths: Sequence[str | os.PathLike[str]]) -> int | None:
    """The rows of the Parquet files ``paths`` name (from their footers: nothing else is read), or None when one
    cannot be read here (``hpcppo plan`` on a machine without the data)."""
    try:
        return sum(pq.ParquetFile(path).metadata.num_rows for path in expand_paths(paths))
    except (OSError, pa.ArrowException, ConfigError, PathError):
        return None


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_text_prompt(schema: pa.Schema, prompt_key: str) -> bool:
    """Whether the prompt column holds plain text (wrapped as one user message) rather than chat messages."""
    return _is_string(schema.field(prompt_key).type)


def check_not_parquet_suffix(path: Path) -> None:
    """A ConfigError for a file whose name says it is not Parquet (``.jsonl`` ...), saying what is required."""
    if path.suffix.lower() in NOT_PARQUET_SUFFIXES:
        raise ConfigError(f"{path.suffix} files are not read: prompt files must be Parquet in verl's schema "
                          "(data_source, prompt, reward_model, optionally ability and extra_info)", file=str(path),
                          hint="convert it, e.g. pandas.read_json(path, lines=True).to_parquet(...) with those "
                               "columns, or tools/prepare_gsm8k.py for GSM8K")


def validate_schema(schema: pa.Schema, file: str, prompt_key: str) -> None:
    """ConfigError naming ``file`` unless ``schema`` has verl's required columns with usable types."""
    required = (REQUIRED_COLUMNS[0], prompt_key, *REQUIRED_COLUMNS[1:])
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise ConfigError(
            f"missing column(s) {', '.join(repr(c) for c in missing)}; required: {', '.join(required)}; "
            f"optional: {', '.join(OPTIONAL_COLUMNS)}; present: {', '.join(schema.names) or '(none)'}",
            file=file,
            hint="is the prompt column named differently? set data.prompt_key" if prompt_key in missing else None,
        )

    # verl's dataset puts the images/videos columns into the prompt (RLHFDataset._build_messages, data.image_key and
    # data.video_key, default "images" and "videos"): trained as text only, the run would differ from verl's. A
    # column of nulls only (type null) holds no media.
    media = [c for c in VISION_COLUMNS if c in schema.names and not pa.types.is_null(schema.field(c).type)]
    if media:
        raise ConfigError(f"has column(s) {', '.join(repr(c) for c in media)}: prompts with images or videos (verl "
                          f"feeds them to a vision-language model); hpcppo trains text-only models on text prompts: "
                          f"drop the column(s) for a text-only run", file=file)

    def bad(column: str, expected: str) -> ConfigError:
        return ConfigError(f"column {column!r} has type {schema.field(column).type}, expected {expected}", file=file)

    if not _is_string(schema.field("data_source").type):
        raise bad("data_source", "string")
    ptype = schema.field(prompt_key).type
    if _is_string(ptype):
        pass  # plain text: one user message
    elif not (pa.types.is_list(ptype) or pa.types.is_large_list(ptype)) or not pa.types.is_struct(ptype.value_type):
        raise bad(prompt_key, PROMPT_TYPES)
    else:
        value_type = ptype.value_type
        names = {value_type.field(i).name: value_type.field(i).type for i in range(value_type.num_fields)}
        if not all(k in names and _is_string(names[k]) for k in ("role", "content")):
            raise bad(prompt_key, PROMPT_TYPES)
    rtype = schema.field("reward_model").type
    if not pa.types.is_struct(rtype) or rtype.get_field_index("ground_truth") < 0:
        raise bad("reward_model", "struct<style: string, ground_truth: ...>")
    if "ability" in schema.names and not (_is_string(schema.field("ability").type)
                                          or pa.types.is_null(schema.field("ability").type)):
        raise bad("ability", "string")
    if "extra_info" in schema.names and not (pa.types.is_struct(schema.field("extra_info").type)
                                             or pa.types.is_null(schema.field("extra_info").type)):
        raise bad("extra_info", "struct")


def read_prompts(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, prompt_key: str = "prompt"
) -> list[PromptRecord]:
    """Read and validate verl-schema Parquet files (or directories of them, sorted by name), in order.

    Raises :class:`PathError` for a missing/unreadable file and :class:`ConfigError` naming the file (and row)
    for a schema problem: a missing column, a wrong type, an empty prompt, a null data_source.
    """
    records: list[PromptRecord] = []
    for path in expand_paths(paths):
        file = str(path)
        schema = read_schema(path)
        validate_schema(schema, file, prompt_key)
        wanted = ["data_source", prompt_key, "reward_model"] + [c for c in OPTIONAL_COLUMNS if c in schema.names]
        try:  # only the columns we use: verl files may carry large others
            table = pq.read_table(path, columns=wanted)
        except (OSError, pa.ArrowException) as exc:
            raise PathError(f"{file}: not a readable Parquet file ({exc})") from exc
        for row, values in enumerate(table.to_pylist()):
            records.append(_record_from_row(values, prompt_key, file, row))
    return records


def read_schema(path: Path) -> pa.Schema:
    """The Arrow schema of a Parquet file (its footer only); PathError if it is not Parquet, ConfigError if its
    name says it is JSONL/CSV."""
    check_not_parquet_suffix(path)
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise PathError(f"{path}: not a readable Parquet file ({exc})") from exc


def _record_from_row(values: dict[str, Any], prompt_key: str, file: str, row: int) -> PromptRecord:
    where = f"row {row}"
    if not values["data_source"]:
        raise ConfigError(f"{where}: data_source is null or empty", file=file)
    messages = values[prompt_key]
    if isinstance(messages, str) and messages:
        messages = [{"role": "user", "content": messages}]  # a plain-text prompt is one user message
    if not messages:
        raise ConfigError(f"{where}: column {prompt_key!r} is null, empty or an empty list of messages", file=file)
    for m in messages:
        if m is None or m.get("role") is None or m.get("content") is None:
            raise ConfigError(f"{where}: a message in {prompt_key!r} has a null role or content: {m!r}", file=file)
    reward = values["reward_model"] or {}
    if reward.get("ground_truth") is None:
        raise ConfigError(f"{where}: the reward_model column's ground_truth is null", file=file)
    return PromptRecord(
        data_source=values["data_source"],
        prompt=[{"role": m["role"], "content": m["content"]} for m in messages],
        ground_truth=reward["ground_truth"],
        ability=values.get("ability"),
        reward_style=reward.get("style"),
        extra_info=dict(values.get("extra_info") or {}),
        source=file,
        row=row,
    )


# ---------------------------------------------------------------------------------------------------------------
# Tokenisation


@dataclass(frozen=True)
class PromptItem:
    """One tokenised prompt: ``input_ids`` unpadded (1-D list of token ids), the record, its dataset index."""

    index: int
    input_ids: list[int]
    record: PromptRecord


OVERLONG_FIXES = ('raise data.max_prompt_length, set data.filter_overlong_prompts = true (drops them) or '
                  'data.truncation = "left", "right" or "middle" (cuts them)')


def render_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]], uses_chat_template: bool) -> str:
    """The text that is tokenised for a prompt: the chat template with the generation prompt (verl's rule), or,
    for a tokenizer without one, the messages' contents joined by a newline."""
    if uses_chat_template:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages)


def truncate_ids(ids: list[int], max_length: int, truncation: str) -> list[int]:
    """verl's cut of an over-long prompt (verl/utils/torch_functional.py ``postprocess_data``): left keeps the end,
    right the start, middle the first ``max_length // 2`` and the last ``max_length - max_length // 2`` tokens."""
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head):]
    raise ValueError(f"truncate_ids: truncation {truncation!r} does not cut")


class PromptDataset:
    """Prompts tokenised once, up front, with the tokenizer's chat template.

    Tokenising everything in the constructor (rather than per ``__getitem__``) makes an over-long prompt fail at
    start-up, before any GPU time is spent, and prompt sets for PPO are small (GSM8K train: 7,473 rows).

    Text of a prompt: with a chat template (``apply_chat_template=None`` means "if ``tokenizer.chat_template`` is
    set"), ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` tokenised without added
    special tokens (the template already has them) — what verl does. Without one (base models), the messages'
    contents joined by a newline, tokenised *with* the tokenizer's special tokens (e.g. a BOS).

    Prompts longer than ``max_prompt_length`` tokens: with ``filter_overlong_prompts`` they are dropped (counted in
    ``filtered``; verl filters before it truncates, so truncation never applies then); otherwise
    ``truncation="error"`` raises a :class:`ConfigError` naming the file, row and length, and ``"left"``,
    ``"right"``, ``"middle"`` cut them (:func:`truncate_ids`, counted in ``truncated``).
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        tokenizer: Any,
        *,
        max_prompt_length: int,
        truncation: Truncation = "error",
        filter_overlong_prompts: bool = False,
        apply_chat_template: bool | None = None,
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ConfigError(f"unknown truncation {truncation!r}; allowed: {', '.join(TRUNCATION_MODES)}",
                              key="data.truncation")
        if not isinstance(max_prompt_length, int) or max_prompt_length < 1:
            raise ConfigError(f"must be a positive integer, got {max_prompt_length!r}", key="data.max_prompt_length")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if apply_chat_template is None:
            apply_chat_template = has_template
        elif apply_chat_template and not has_template:
            raise ConfigError("apply_chat_template is true but the tokenizer has no chat_template",
                              key="apply_chat_template", hint="set it to false to join the messages' contents")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.uses_chat_template = bool(apply_chat_template)
        self.truncated = 0  # how many prompts were cut (reported by the trainer)
        self.filtered = 0  # how many prompts filter_overlong_prompts dropped
        kept: list[PromptRecord] = []
        self._ids: list[list[int]] = []
        for record in records:
            ids = self._tokenize(record)
            if len(ids) > max_prompt_length and filter_overlong_prompts:
                self.filtered += 1
                continue
            kept.append(record)
            self._ids.append(self._fit(ids, record))
        self.records = kept
        if records and not kept:
            raise ConfigError(f"every one of the {len(records)} prompts is longer than max_prompt_length="
                              f"{max_prompt_length}, and filter_overlong_prompts drops them all",
                              file=records[0].source, key="data.max_prompt_length")

    def prompt_text(self, record: PromptRecord) -> str:
        """The exact text that is tokenised for ``record``."""
        return render_prompt(self.tokenizer, record.prompt, self.uses_chat_template)

    def _tokenize(self, record: PromptRecord) -> list[int]:
        text = self.prompt_text(record)
        ids = list(self.tokenizer(text, add_special_tokens=not self.uses_chat_template)["input_ids"])
        if not ids:
            raise ConfigError(f"row {record.row}: prompt tokenises to zero tokens", file=record.source)
        return ids

    def _fit(self, ids: list[int], record: PromptRecord) -> list[int]:
        n = len(ids)
        if n <= self.max_prompt_length:
            return ids
        if self.truncation == "error":
            raise ConfigError(
                f"row {record.row}: prompt has {n} tokens, more than max_prompt_length={self.max_prompt_length}",
                file=record.source, hint=OVERLONG_FIXES)
        self.truncated += 1
        return truncate_ids(ids, self.max_prompt_length, self.truncation)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> PromptItem:
        return PromptItem(index=index, input_ids=self._ids[index], record=self.records[index])

    @property
    def prompt_lengths(self) -> list[int]:
        """Token count of every prompt (after truncation)."""
        return [len(ids) for ids in self._ids]
