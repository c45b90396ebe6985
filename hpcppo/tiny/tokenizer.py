"""The tiny model's character-level tokenizer and the encodings built with it.

A ``tokenizers`` WordLevel model over digits, lowercase letters, a few operators and chat markers,
wrapped in ``PreTrainedTokenizerFast`` with a Jinja chat template. Importing this module is cheap:
``tokenizers``, ``transformers`` and torch are imported inside the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 64
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz +-*/=?.,:()\n"
#: The tool variant's extra tokens, in three of the padding slots (so every other id is the base tokenizer's): the
#: tool turn's role marker and the compact call format's delimiters (hpcppo.agent.parse.COMPACT_START/END; a test
#: keeps them equal). The calls themselves need only CHARS: ``<call>calculator(123*456)</call>``.
TOOL_TOKENS = ("<|tool|>", "<call>", "</call>")
#: The tokens the tool variant keeps special (skipped when decoding): its role markers and the call delimiters are
#: text, so that the reward sees the turns of a multi-turn response (hpcppo.data.arith_tool), as Qwen's role names
#: survive ``skip_special_tokens`` after ``<|im_start|>``.
TOOL_SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
VARIANTS = ("arith", "tool")
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


def build_tokenizer(variant: str = "arith") -> PreTrainedTokenizerFast:
    """The character-level tokenizer, its vocab padded to ``VOCAB_SIZE`` (= the model's vocab); ``variant`` "tool"
    adds :data:`TOOL_TOKENS` and keeps only :data:`TOOL_SPECIAL_TOKENS` special."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if variant not in VARIANTS:
        raise ValueError(f"unknown tokenizer variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    tokens = list(SPECIAL_TOKENS) + list(CHARS) + (list(TOOL_TOKENS) if variant == "tool" else [])
    # Pad to the model's vocab so every id the model can emit decodes to something.
    tokens += [f"<extra_{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    if variant == "tool":
        core.add_special_tokens(list(TOOL_SPECIAL_TOKENS))
        # Markers that are text: still one token each (added tokens are matched before the split into characters).
        core.add_tokens([AddedToken(t, special=False, normalized=False)
                         for t in (*SPECIAL_TOKENS, *TOOL_TOKENS) if t not in TOOL_SPECIAL_TOKENS])
    else:
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


def prompt_text(tokenizer: PreTrainedTokenizerFast, row: dict[str, Any]) -> str:
    """The chat-templated prompt of a verl row, ending with the assistant marker."""
    return cast(str, tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))


def encode_prompts(tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``/``attention_mask`` ``[n, max_prompt_len]`` for generation."""
    texts = [prompt_text(tokenizer, row) for row in rows]
    return tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")


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
