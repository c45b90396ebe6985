"""An offline tiny model for the synthetic arithmetic task: tokenizer, model, warm start, data.

No model hub is reachable from a cluster's compute nodes or from CI, so the model that the
examples, the end-to-end tests and the README's first command train is built here from scratch:

1. a character-level tokenizer (``tokenizers`` WordLevel over digits, lowercase letters, a few
   operators and chat markers) wrapped in ``PreTrainedTokenizerFast``, with a Jinja chat template
   (:mod:`.tokenizer`);
2. a ~0.5M-parameter Llama-architecture model with a fixed seed (:mod:`.model`, which says why Llama);
3. a warm start in two supervised stages (:mod:`.warmstart`), each run to convergence: ``warm_start``
   teaches the task (greedy held-out accuracy near 1); ``add_flaw`` then teaches a habit that costs
   reward (the accuracy of sampling at temperature 1 falls to about 0.25, greedy decoding keeps it);
4. ``save_pretrained`` of model, tokenizer and generation config, plus ``hpcppo_tiny.json`` with
   the measured accuracies, and optionally the task's ``train.parquet``/``val.parquet`` (:mod:`.make`).

Everything a build depends on is a field of ``TinySettings`` (:mod:`.settings`). The build is
idempotent and its up-to-date check imports neither torch nor transformers, nor does importing this
package: the login-node CLI (``hpcppo tools make-model``) imports it inside its command only.
"""

from __future__ import annotations

from hpcppo.tiny.make import (
    INFO_FILE,
    build_tiny_model_and_data,
    read_info,
    settings_of,
    write_task_data,
)
from hpcppo.tiny.model import accuracy, build_model, generate_answers
from hpcppo.tiny.settings import FORMAT_VERSION, TinySettings
from hpcppo.tiny.tokenizer import (
    CHARS,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_tokenizer,
    encode_prompts,
    prompt_text,
    supervised_batch,
)
from hpcppo.tiny.warmstart import add_flaw, ramble_targets, warm_start

__all__ = [
    "CHARS",
    "CHAT_TEMPLATE",
    "FORMAT_VERSION",
    "INFO_FILE",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "TinySettings",
    "accuracy",
    "add_flaw",
    "build_model",
    "build_tiny_model_and_data",
    "build_tokenizer",
    "encode_prompts",
    "generate_answers",
    "prompt_text",
    "ramble_targets",
    "read_info",
    "settings_of",
    "supervised_batch",
    "warm_start",
    "write_task_data",
]
