"""Real tokenizers and a scripted real model for the tool-loop tests.

- :func:`compact_tokenizer`: the tiny character tokenizer (hpcppo.tiny) with three of its spare ids named
  ``<call>``, ``</call>`` and ``<|tool|>`` (one token each), its chat template unchanged (a ``tool`` message renders
  as ``<|tool|>`` + the text).
- :func:`hermes_tokenizer`: a ChatML tokenizer as Qwen2.5's renders tools (``<|im_start|>``, ``<|im_end|>``,
  ``<tool_call>``, ``</tool_call>``; a tool message is a user turn holding ``<tool_response>...</tool_response>``),
  characters plus the JSON pieces of an ``echo`` call as single tokens.
- :func:`scripted_engine`: a real Qwen2 model in the HF engine whose next token depends on the current token only
  (its layers add nothing: ``o_proj`` and ``down_proj`` are zero; the embedding is one-hot; ``lm_head`` holds the
  table), so a test writes down what the model does: ``{"<|assistant|>": ["<call>"], "(": list("0123456789")}``
  (several successors: equally likely; a token without an entry: EOS).
"""

from __future__ import annotations

from typing import Any

import torch

from hpcppo.rollout.hf import HFRolloutEngine
from hpcppo.tiny.tokenizer import CHARS, CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE

TOOL_TOKENS = ("<call>", "</call>", "<|tool|>")
ECHO_HEAD = '{"name": "echo", "arguments": {"n": '
ECHO_TAIL = "}}"
HERMES_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
HERMES_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz :\n{}\",_-()=+*.'"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _char_tokenizer(specials: tuple[str, ...], chars: str, added: tuple[str, ...], size: int, **named: str) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = list(specials) + list(chars) + list(added)
    tokens += [f"<extra_{i}>" for i in range(size - len(tokens))]
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=named["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(specials))
    core.add_tokens(list(added))
    return PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", **named)


def compact_tokenizer() -> Any:
    tok = _char_tokenizer(SPECIAL_TOKENS + TOOL_TOKENS, CHARS, (), VOCAB_SIZE, bos_token="<bos>", eos_token="<eos>",
                          pad_token="<pad>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def hermes_tokenizer() -> Any:
    tok = _char_tokenizer(("<unk>", *HERMES_SPECIAL), HERMES_CHARS, ("<tool_response>", "</tool_response>",
                          ECHO_HEAD, ECHO_TAIL), 96, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                          unk_token="<unk>")
    tok.chat_template = CHATML_TEMPLATE
    return tok


def script(model: Any, tokenizer: Any, table: dict[str, Any], *, strength: float = 6.0) -> Any:
    """Set a Qwen2 or Llama model's weights (hidden size = vocab size, untied) so that its next token follows
    ``table`` (see the module docstring; a successor given as ``{token: strength}`` gets that logit weight instead
    of ``strength``); returns it."""
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        head = model.lm_head.weight  # [vocab (next), hidden (= current token)]
        for current in range(vocab):
            head[eos, current] = strength
        for current, nexts in table.items():
            c = tokenizer.convert_tokens_to_ids(current)
            head[eos, c] = 0.0
            weights = nexts if isinstance(nexts, dict) else dict.fromkeys(nexts, strength)
            for n, w in weights.items():
                head[tokenizer.convert_tokens_to_ids(n), c] = w
    return model


def scripted_engine(tokenizer: Any, table: dict[str, Any]) -> HFRolloutEngine:
    """The HF engine over a one-layer Qwen2 whose next token follows ``table`` (see the module docstring)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = len(tokenizer)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=vocab, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=8, vocab_size=vocab,
                                         max_position_embeddings=512, tie_word_embeddings=False))
    return HFRolloutEngine(script(model, tokenizer, table).eval())


def scripted_model_dir(path: Any, tokenizer: Any, table: dict[str, Any]) -> Any:
    """A one-layer Llama (the tiny model's family) scripted by ``table``, saved with ``tokenizer`` for a run."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    vocab = len(tokenizer)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=vocab, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=8, vocab_size=vocab,
                                         max_position_embeddings=256, tie_word_embeddings=False, **ids))
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **ids)
    script(model, tokenizer, table).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
