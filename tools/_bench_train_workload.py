"""The workload of tools/bench_train.py: its shape, the model and prompts it trains on, and its spec.

A helper module of the benchmark script (tools/ is not a package: the script's directory is on sys.path).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch

PROMPTS = 64
RESPONSE_LEN = 16
MINI_BATCHES = 4


def build_model_and_data(root: Path, *, train_rows: int) -> dict[str, Path]:
    """A ~0.5M-parameter Qwen2 model (random, seeded), the tiny character tokenizer, verl-schema prompts.

    The tokenizer goes to its own directory (``model.tokenizer_path``): ``AutoTokenizer`` on a directory whose
    config says ``model_type: qwen2`` substitutes ``Qwen2Tokenizer`` even when ``tokenizer_class`` is pinned in
    tokenizer_config.json, and that drops spaces of the custom vocabulary (checked below).
    """
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from hpcppo.data import synthetic
    from hpcppo.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=512, vocab_size=len(tok), max_position_embeddings=128,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    paths = {"model": root / "model", "tokenizer": root / "tokenizer", "train": root / "data" / "train.parquet"}
    model.save_pretrained(paths["model"])
    tok.save_pretrained(paths["tokenizer"])
    probe = "what is 3 + 4 ?"
    loaded = AutoTokenizer.from_pretrained(str(paths["tokenizer"]))
    if loaded(probe).input_ids != tok(probe).input_ids or loaded.decode(tok(probe).input_ids) != probe:
        raise RuntimeError(f"tokenizer round trip failed: {type(loaded).__name__} encodes {probe!r} differently")
    synthetic.write_split(paths["train"], synthetic.generate_rows(train_rows, seed=0, split="train"))
    return paths


def write_spec(root: Path, paths: dict[str, Path], *, steps: int) -> Path:
    spec = f"""
name = "bench-train"
seed = 1
[model]
path = {json.dumps(str(paths["model"]))}
tokenizer_path = {json.dumps(str(paths["tokenizer"]))}
dtype = "float32"
[data]
train_files = [{json.dumps(str(paths["train"]))}]
max_prompt_length = 32
max_response_length = {RESPONSE_LEN}
truncation = "error"
[rollout]
engine = "hf"
n = 1
temperature = 1.0
micro_batch_size_per_gpu = {PROMPTS}   # one no-grad forward per model for old/ref log-probs and values
[actor]
ppo_epochs = 1
ppo_mini_batch_size = {PROMPTS // MINI_BATCHES}
ppo_micro_batch_size_per_gpu = {PROMPTS // MINI_BATCHES}
[critic]
ppo_micro_batch_size_per_gpu = {PROMPTS // MINI_BATCHES}
[algorithm]
adv_estimator = "gae"
use_kl_in_reward = true
[trainer]
train_batch_size = {PROMPTS}
total_steps = {steps}
test_freq = 0
log_every = 1
collective_timeout_s = 120
[checkpoint]
save_every = 1
keep_last = 2
[resources]
procs_per_node = 1
time = "00:30:00"
"""
    path = root / "bench-train.toml"
    path.write_text(spec)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
