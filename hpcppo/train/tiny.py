"""An offline tiny model for the synthetic arithmetic task: tokenizer, model, warm start, data.

No model hub is reachable from a cluster's compute nodes or from CI, so the model that the
examples, the end-to-end tests and the README's first command train is built here from scratch:

1. a character-level tokenizer (``tokenizers`` WordLevel over digits, lowercase letters, a few
   operators and chat markers) wrapped in ``PreTrainedTokenizerFast``, with a Jinja chat template;
2. a ~0.5M-parameter Llama-architecture model with a fixed seed;
3. a warm start in two supervised stages: ``warm_start`` teaches the task (teacher forcing, loss
   on the answer tokens only) until greedy held-out accuracy reaches a target; ``add_flaw`` then
   teaches a habit that costs reward (a stray digit after the answer) until the accuracy of
   sampling at temperature 1 falls to a target. PPO thus starts, as RLHF starts from an SFT model,
   from a policy that knows most answers, succeeds only sometimes, and can be fixed quickly;
4. ``save_pretrained`` of model, tokenizer and generation config, plus ``hpcppo_tiny.json`` with
   the measured accuracies, and optionally the task's ``train.parquet``/``val.parquet``.

Why Llama and not Qwen2: ``AutoTokenizer.from_pretrained`` on a directory whose config says
``model_type: qwen2`` forces ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says (transformers
5.x lists qwen2 among models with a "wrong hub tokenizer class") and silently mangles a custom
vocabulary. With a Llama config the saved ``tokenizer_class`` is honoured, so the trainer can use
``AutoTokenizer`` as it will for real models. The architectures differ only in attention biases.

The build is idempotent: when ``out_dir`` (and ``data_dir``) already hold a build with the same
settings hash, ``build_tiny_model_and_data`` returns the recorded summary without importing torch.
It runs on one torch thread, so its result depends only on the seed and the settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcppo.data import synthetic
from hpcppo.errors import ConfigError, PathError

from hpcppo.fsutil import fsync_dir as _fsync_dir

if TYPE_CHECKING:  # torch and transformers are imported lazily: the up-to-date check must stay instant
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

INFO_FILE = "hpcppo_tiny.json"
FORMAT_VERSION = 1
VOCAB_SIZE = 64
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz +-*/=?.,:()\n"
# <bos><|role|>content ... then <|assistant|>; an assistant turn ends with <eos>, which is also what
# the policy emits to stop. bos comes from the template (no post-processor) so that a trainer that
# renders the template to text and tokenizes it again does not get two of them.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class TinySettings:
    """Everything that determines a build; its hash decides whether a rebuild is needed."""

    seed: int = 0
    # task (hpcppo.data.synthetic): a+b with a, b in 0..19 -- small enough to learn in ~250 steps
    max_operand: int = 19
    num_operands: int = 2
    operators: tuple[str, ...] = ("+",)
    val_fraction: float = 0.1
    # model (Llama architecture, ~0.5M parameters)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 64
    # stage 1: learn the task until greedy held-out accuracy >= target_greedy_accuracy
    lr: float = 3e-3
    batch_size: int = 128
    max_steps: int = 500
    eval_every: int = 20
    eval_size: int = 256
    target_greedy_accuracy: float = 0.6
    # stage 2 (add_flaw): until the accuracy of sampling at temperature 1 is <= target_sampled_accuracy
    target_sampled_accuracy: float = 0.3
    flaw_rate: float = 0.7
    flaw_lr: float = 1e-3  # gentle: the habit is learnt in a few steps, and the arithmetic must survive
    flaw_max_steps: int = 60
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        if len(SPECIAL_TOKENS) + len(CHARS) > VOCAB_SIZE:
            raise AssertionError("the tokenizer's alphabet outgrew VOCAB_SIZE")
        try:
            synthetic.generate_rows(0, seed=self.seed, **self.task_kwargs())
        except ValueError as exc:
            raise ConfigError(str(exc), key="tiny-model task") from None
        for name in ("target_greedy_accuracy", "target_sampled_accuracy", "flaw_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"must be in [0, 1], got {getattr(self, name)!r}", key=name)
        for name in ("batch_size", "max_steps", "eval_every", "eval_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, name)!r}", key=name)

    def task_kwargs(self) -> dict[str, Any]:
        return {
            "max_operand": self.max_operand,
            "num_operands": self.num_operands,
            "operators": self.operators,
            "val_fraction": self.val_fraction,
        }

    def digest(self) -> str:
        payload = json.dumps({"format": FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- tokenizer, model, evaluation
def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer, its vocab padded to ``VOCAB_SIZE`` (= the model's vocab)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = list(SPECIAL_TOKENS) + list(CHARS)
    # Pad to the model's vocab so every id the model can emit decodes to something.
    tokens += [f"<extra_{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> LlamaForCausalLM:
    """A randomly initialised Llama model (seeded), its special ids and generation config set."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        max_position_embeddings=settings.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,  # a quarter fewer parameters; FSDP2 handles tied weights (torch-cpu.md)
    )
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = LlamaForCausalLM(config)
    # Plain sampling at temperature 1 by default: the accuracy recorded in hpcppo_tiny.json is measured so.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=settings.max_new_tokens,
    )
    return model


def prompt_text(tokenizer: PreTrainedTokenizerFast, row: dict[str, Any]) -> str:
    """The chat-templated prompt of a verl row, ending with the assistant marker."""
    return tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)


def encode_prompts(tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``/``attention_mask`` ``[n, max_prompt_len]`` for generation."""
    texts = [prompt_text(tokenizer, row) for row in rows]
    return tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting from 0 at each row's first real token ``[n, T]`` (left padding gets 0)."""
    from hpcppo.rollout.base import position_ids_from_mask as shared  # torch: imported only when building

    return shared(attention_mask)


def supervised_batch(
    tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, Any]], targets: list[str] | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded prompt+target+eos ``[n, T]`` with ``labels`` -100 everywhere but the target and eos.

    ``targets`` default to the rows' ground truths.

    Right padding puts every row's first token at position 0, as generation from left-padded
    prompts does (positions follow the attention mask there).
    """
    import torch

    # One batched tokenizer call per part: per-row calls dominate the step time of a 0.5M model.
    prompts = tokenizer([prompt_text(tokenizer, row) for row in rows], add_special_tokens=False)["input_ids"]
    if targets is None:
        targets = [row["reward_model"]["ground_truth"] for row in rows]
    answers = tokenizer(targets, add_special_tokens=False)["input_ids"]
    seqs, label_seqs = [], []
    for p, a in zip(prompts, answers):
        a = a + [tokenizer.eos_token_id]
        seqs.append(p + a)
        label_seqs.append([-100] * len(p) + a)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(seqs, label_seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(lab)
        mask[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def generate_answers(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    *,
    greedy: bool,
    seed: int,
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Decoded completions (special tokens skipped) for ``rows``; sampling at temperature 1 unless ``greedy``."""
    import torch

    out: list[str] = []
    model.eval()
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)  # evaluation must not consume the training RNG stream
        for start in range(0, len(rows), batch_size):
            enc = encode_prompts(tokenizer, rows[start : start + batch_size])
            # top_k=0 switches off transformers' default top-k of 50: plain sampling from the softmax.
            sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            gen = model.generate(
                **enc,
                **sampling,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out.extend(tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    *,
    greedy: bool,
    seed: int,
    max_new_tokens: int = 8,
) -> float:
    """Mean ``synthetic.compute_score`` of the model's completions on ``rows``."""
    texts = generate_answers(model, tokenizer, rows, greedy=greedy, seed=seed, max_new_tokens=max_new_tokens)
    scores = [
        synthetic.compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) for r, t in zip(rows, texts)
    ]
    return sum(scores) / len(scores)


# ----------------------------------------------------------------------------- the two warm-start stages
def warm_start(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> dict[str, Any]:
    """Stage 1: supervised steps on training-pool rows until greedy held-out accuracy reaches its target.

    Returns ``{"steps", "reached_target", "history": [{"step", "loss", "greedy_accuracy"}]}``.
    """
    import torch

    rows = synthetic.generate_rows(
        settings.max_steps * settings.batch_size, seed=settings.seed, split="train", **settings.task_kwargs()
    )
    eval_rows = _eval_rows(settings)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    history: list[dict[str, float]] = []
    step, reached = 0, False
    while step < settings.max_steps:
        batch = supervised_batch(tokenizer, rows[step * settings.batch_size : (step + 1) * settings.batch_size])
        loss = _sft_step(model, opt, batch)
        step += 1
        if step % settings.eval_every == 0:
            acc = accuracy(model, tokenizer, eval_rows, greedy=True, seed=0, max_new_tokens=settings.max_new_tokens)
            history.append({"step": step, "loss": loss, "greedy_accuracy": acc})
            if acc >= settings.target_greedy_accuracy:
                reached = True
                break
    model.eval()
    return {"steps": step, "reached_target": reached, "history": history}


def ramble_targets(rows: list[dict[str, Any]], rate: float, *, seed: int) -> list[str]:
    """Ground truths, a fraction ``rate`` of them with one random digit appended ("19" -> "193")."""
    rng = random.Random(f"hpcppo-tiny-ramble:{seed}")
    return [row["reward_model"]["ground_truth"] + (str(rng.randrange(10)) if rng.random() < rate else "") for row in rows]


def add_flaw(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> dict[str, Any]:
    """Stage 2: teach a habit of rambling on after the answer until sampled held-out accuracy <= target.

    Why: after stage 1 a tiny model is either wrong or confidently right (its sampled and greedy
    accuracies are close), so RL would have to teach arithmetic itself -- too slow for a demo.
    Fine-tuned on answers of which ``flaw_rate`` carry a stray digit after them, the model keeps
    its arithmetic and often appends a digit when sampled at temperature 1 (a wrong answer), while
    greedy decoding still mostly stops in time (the end token stays the likeliest continuation).
    That is where RLHF starts -- a capable SFT model with a systematic flaw -- and a short RL run
    fixes it. (Stray digits mixed into stage 1 were tried: they slowed the arithmetic badly. So was
    scaling the logits down: RL then has to sharpen every decision and gained far less.)
    Returns ``{"steps", "reached_target", "history": [{"step", "sampled_accuracy"}]}``.
    """
    import torch

    rows = synthetic.generate_rows(
        settings.flaw_max_steps * settings.batch_size, seed=settings.seed + 3_000_017, split="train", **settings.task_kwargs()
    )
    targets = ramble_targets(rows, settings.flaw_rate, seed=settings.seed)
    eval_rows = _eval_rows(settings)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.flaw_lr, weight_decay=0.0)
    history: list[dict[str, float]] = []
    step, reached = 0, False
    while True:
        acc = accuracy(model, tokenizer, eval_rows, greedy=False, seed=settings.seed + step, max_new_tokens=settings.max_new_tokens)
        history.append({"step": step, "sampled_accuracy": acc})
        if acc <= settings.target_sampled_accuracy:
            reached = True
            break
        if step == settings.flaw_max_steps:
            break
        lo, hi = step * settings.batch_size, (step + 1) * settings.batch_size
        _sft_step(model, opt, supervised_batch(tokenizer, rows[lo:hi], targets[lo:hi]))
        step += 1
    model.eval()
    return {"steps": step, "reached_target": reached, "history": history}


def _sft_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    import torch

    model.train()
    loss = model(**batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _eval_rows(settings: TinySettings) -> list[dict[str, Any]]:
    # Held-out problems; the seed offset keeps these draws apart from the val.parquet rows.
    return synthetic.generate_rows(settings.eval_size, seed=settings.seed + 1_000_003, split="val", **settings.task_kwargs())


# ----------------------------------------------------------------------------- build and files
def build_tiny_model_and_data(
    out_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    train_size: int = 4096,
    val_size: int = 512,
    force: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Build (or find up to date) the tiny model in ``out_dir`` and the task data in ``data_dir``.

    ``overrides`` are ``TinySettings`` fields (e.g. ``max_operand=49``). Returns the summary recorded
    in ``out_dir/hpcppo_tiny.json`` plus ``"built"`` (False when the model was up to date) and
    ``"data"`` (the Parquet paths, when ``data_dir`` is given). Raises ``ConfigError`` for an
    unknown or bad setting and ``PathError`` when ``out_dir`` exists but is not a tiny-model build
    (it is never deleted then).
    """
    fields = [f.name for f in dataclasses.fields(TinySettings) if f.name != "seed"]
    for key in overrides:
        if key not in fields:
            raise ConfigError(f"unknown tiny-model setting; allowed: {', '.join(fields)}", key=key)
    if "operators" in overrides:
        overrides["operators"] = tuple(overrides["operators"])
    if train_size < 1 or val_size < 1:
        raise ConfigError(f"train_size and val_size must be >= 1, got {train_size} and {val_size}", key="data")
    settings = TinySettings(seed=seed, **overrides)
    out_dir = Path(out_dir)

    data_paths: dict[str, str] = {}
    if data_dir is not None:
        data_dir = Path(data_dir)
        digest = _data_digest(settings, train_size, val_size)
        if force or not all(_parquet_digest(data_dir / f"{s}.parquet") == digest for s in ("train", "val")):
            data_paths = write_task_data(data_dir, settings=settings, train_size=train_size, val_size=val_size)
        else:
            data_paths = {s: str(data_dir / f"{s}.parquet") for s in ("train", "val")}

    info = _read_info(out_dir)
    if out_dir.exists() and info is None and any(out_dir.iterdir()):
        raise PathError(f"{out_dir} exists and is not a tiny-model build (no readable {INFO_FILE}); "
                        "choose another --out or remove it")
    if not force and info is not None and info.get("settings_hash") == settings.digest():
        return {**info, "built": False, "data": data_paths}
    info = _build_model_dir(out_dir, settings)
    return {**info, "built": True, "data": data_paths}


def write_task_data(
    data_dir: str | os.PathLike[str], *, settings: TinySettings, train_size: int, val_size: int
) -> dict[str, str]:
    """``train.parquet`` and ``val.parquet`` of the task under ``data_dir`` (atomic); returns their paths."""
    data_dir = Path(data_dir)
    meta = {"hpcppo_settings": _data_digest(settings, train_size, val_size)}
    paths = {}
    for split, n in (("train", train_size), ("val", val_size)):
        rows = synthetic.generate_rows(n, seed=settings.seed, split=split, **settings.task_kwargs())
        paths[split] = str(synthetic.write_split(data_dir / f"{split}.parquet", rows, metadata=meta))
    return paths


def _build_model_dir(out_dir: Path, settings: TinySettings) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    # One thread: float reductions (hence the accuracies that decide when each stage stops) are the
    # same on every machine, and a 0.5M model gains nothing from more (on a busy 2-core machine two
    # threads were 10x slower than one).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, settings)
        stage1 = warm_start(model, tokenizer, settings)
        stage2 = add_flaw(model, tokenizer, settings)
        kw = {"seed": settings.seed, "max_new_tokens": settings.max_new_tokens}
        held_out = synthetic.generate_rows(512, seed=settings.seed + 2_000_003, split="val", **settings.task_kwargs())
        seen = synthetic.generate_rows(512, seed=settings.seed + 4_000_037, split="train", **settings.task_kwargs())
        measured = {
            "greedy_accuracy": accuracy(model, tokenizer, held_out, greedy=True, **kw),
            "sampled_accuracy": accuracy(model, tokenizer, held_out, greedy=False, **kw),
            # training-pool prompts, as in train.parquet: where PPO's reward starts
            "train_greedy_accuracy": accuracy(model, tokenizer, seen, greedy=True, **kw),
            "train_sampled_accuracy": accuracy(model, tokenizer, seen, greedy=False, **kw),
        }
    finally:
        torch.set_num_threads(threads)
    info = {
        "format": FORMAT_VERSION,
        "settings_hash": settings.digest(),
        "settings": dataclasses.asdict(settings),
        "seed": settings.seed,
        "task": {"data_source": synthetic.DATA_SOURCE, **settings.task_kwargs()},
        "architecture": "LlamaForCausalLM",
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "warm_start": {**measured, "eval_prompts": len(held_out), "task_stage": stage1, "flaw_stage": stage2},
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    info = json.loads(text)  # what a later up-to-date call reads back (tuples become lists)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f"{out_dir.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _pin_tokenizer_class(tmp)
        (tmp / INFO_FILE).write_text(text)
        _fsync_tree(tmp)
        _install_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _pin_tokenizer_class(model_dir: Path) -> None:
    """Name ``PreTrainedTokenizerFast`` in tokenizer_config.json so AutoTokenizer loads tokenizer.json as is."""
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _install_dir(tmp: Path, out_dir: Path) -> None:
    """Move the finished ``tmp`` build to ``out_dir``, replacing an outdated build (or empty dir) there."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f"{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        # A concurrent builder installed first: keep theirs (it raced us with the same request).
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(out_dir.parent)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(root)


def _read_info(out_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((out_dir / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def read_info(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``hpcppo_tiny.json`` summary of a built model directory; ``PathError`` if it is missing."""
    info = _read_info(Path(model_dir))
    if info is None:
        raise PathError(f"{model_dir} has no readable {INFO_FILE}: build it with tools/make_tiny_model.py")
    return info


def settings_of(info: dict[str, Any]) -> TinySettings:
    """The ``TinySettings`` recorded in a build summary."""
    raw = dict(info["settings"])
    raw["operators"] = tuple(raw["operators"])
    return TinySettings(**raw)


def _data_digest(settings: TinySettings, train_size: int, val_size: int) -> str:
    payload = {"format": FORMAT_VERSION, "seed": settings.seed, "train": train_size, "val": val_size, **settings.task_kwargs()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _parquet_digest(path: Path) -> str | None:
    try:
        return synthetic.read_metadata(path).get("hpcppo_settings")
    except (OSError, ValueError):
        return None
