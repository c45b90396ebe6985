"""How long ``hpcppo compile``'s data check (hpcppo.data.check) takes on a large Parquet file.

    .venv/bin/python tools/bench_data_check.py                          # ~1 GB file in /tmp, max_prompt_length 1024
    .venv/bin/python tools/bench_data_check.py --gb 0.2 --max-prompt-length 256 --tokenizer path/to/model

The file is verl-shaped: ``data_source``, ``prompt`` (one user message of pseudo-English, lengths spread from a
few hundred to several thousand characters), ``reward_model``, and an ``extra_info`` struct carrying a long text as
big as the prompt (columns verl files carry and the check must not read). The tokenizer is a byte-level BPE trained
here on the same text (``--tokenizer DIR`` takes a real one), with a ChatML-style template.

Reported: the file's size and rows, the time of the whole check (compile's call), and its parts measured apart —
schema (footer), the data_source column, the prompt column (byte bound over every row, exact count of the rows over
the bound, at most hpcppo.data.check.SAMPLE_ROWS of them), the tokenisation rate — and the peak RSS of the process
(the file is written by a child process). Run alone: the figures are for this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def words(rng: random.Random, n: int) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    return ["".join(rng.choice(letters[: 8 + i % 18]) for _ in range(2 + i % 7)) for i in range(n)]


def text(rng: random.Random, vocab: list[str], chars: int) -> str:
    out, size = [], 0
    while size < chars:
        w = rng.choice(vocab) if rng.random() > 0.08 else str(rng.randint(0, 10**rng.randint(1, 6)))
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def make_file(path: Path, gb: float, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    vocab = words(rng, 5000)
    # A pool of texts reused across rows keeps generation fast; lengths: mostly short, a long tail.
    pool = [text(rng, vocab, int(min(12000, rng.lognormvariate(6.6, 0.8)))) for _ in range(4000)]
    schema = pa.schema([("data_source", pa.string()), ("prompt", pa.list_(pa.struct([("role", pa.string()),
                                                                                        ("content", pa.string())]))),
                        ("ability", pa.string()),
                        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
                        ("extra_info", pa.struct([("index", pa.int64()), ("context", pa.string())]))])
    rows = 0
    with pq.ParquetWriter(path, schema) as writer:
        while True:
            batch = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": rng.choice(pool)}],
                      "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(rows + i)},
                      "extra_info": {"index": rows + i, "context": rng.choice(pool)}} for i in range(20000)]
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            rows += len(batch)
            if path.stat().st_size >= gb * 1e9:
                break
    return rows, path.stat().st_size / 1e9


def bpe_dir(out: Path, seed: int) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed + 1)
    vocab = words(random.Random(seed), 5000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text(rng, vocab, 2000) for _ in range(500)],
                            trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                                  "<|im_end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}')
    (out / "chat_template.jinja").write_text(CHATML)
    return out


class Took(float):
    """Wall seconds, with the process's CPU seconds (every thread: the tokenizer's rayon pool too) as ``.cpu``; on
    a shared machine the CPU time is the figure that does not depend on the others' load."""

    cpu: float

    def __str__(self) -> str:
        return f"{float(self):.2f} s wall / {self.cpu:.2f} s CPU"


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    value = fn()
    took = Took(time.perf_counter() - start)
    took.cpu = time.process_time() - cpu
    return value, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="file size to generate (GB)")
    parser.add_argument("--max-prompt-length", type=int, default=1024)
    parser.add_argument("--tokenizer", help="a model/tokenizer directory with tokenizer.json (default: a BPE "
                                            "trained here)")
    parser.add_argument("--dir", help="where to write the file (default: a temporary directory, removed after)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--make-only", metavar="PATH", help=argparse.SUPPRESS)  # the child that writes the file
    args = parser.parse_args()
    if args.make_only:
        rows, size_gb = make_file(Path(args.make_only), args.gb, args.seed)
        print(rows)
        return

    from hpcppo.config.experiment import DataSection
    from hpcppo.data.check import FileCheck, PromptLengths, _data_sources, check_data
    from hpcppo.data.dataset import read_schema

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "big.parquet"
        # Written by a child process, so the peak RSS below is the check's alone.
        child, t_make = timed(lambda: subprocess.run(
            [sys.executable, __file__, "--make-only", str(path), "--gb", str(args.gb), "--seed", str(args.seed)],
            check=True, capture_output=True, text=True))
        rows, size_gb = int(child.stdout.split()[-1]), path.stat().st_size / 1e9
        tok_dir = Path(args.tokenizer) if args.tokenizer else bpe_dir(Path(tmp) / "tok", args.seed)
        print(f"file: {size_gb:.2f} GB, {rows} rows, {pq.ParquetFile(path).metadata.num_row_groups} row groups "
              f"(written in {t_make:.0f} s); tokenizer: {tok_dir}; max_prompt_length={args.max_prompt_length}")

        data = DataSection(train_files=[str(path)], max_prompt_length=args.max_prompt_length, truncation="left")
        report, t_all = timed(lambda: check_data(data, train_batch_size=256, tokenizer_dir=str(tok_dir)))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        (check,) = report.files["data.train_files"]
        print(f"whole check (compile's call): {t_all}, peak RSS {peak:.0f} MiB; "
              f"{'about ' if check.estimated else ''}{check.too_long} rows over the limit; {check.candidates} rows "
              f"over the byte bound ({100 * check.candidates / rows:.1f}%), {check.tokenized} of them tokenised")

        _, t_schema = timed(lambda: read_schema(path))
        _, t_sources = timed(lambda: _data_sources(path, auto=True))
        # The streaming pass and byte bound alone: a limit no row can reach in bytes, so nothing is tokenised.
        loose = PromptLengths.load(str(tok_dir), 10**9, report)
        _, t_bound = timed(lambda: loose.measure(path, "prompt", False, FileCheck(path=str(path), rows=rows,
                                                                                   data_sources={})))
        counter = PromptLengths.load(str(tok_dir), args.max_prompt_length, report)
        probe = FileCheck(path=str(path), rows=rows, data_sources={})
        _, t_lengths = timed(lambda: counter.measure(path, "prompt", False, probe))
        per_row = (t_lengths.cpu - t_bound.cpu) / max(1, probe.tokenized) * 1e3
        print(f"parts: schema {t_schema * 1e3:.1f} ms wall; data_source column {t_sources}; prompt column streamed "
              f"with the byte bound {t_bound}; the same with the exact count of {probe.tokenized} sampled rows "
              f"{t_lengths} ({per_row:.2f} ms CPU per tokenised row: template + encode_batch)")
        print(f"load average during the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} "
              "cores")


if __name__ == "__main__":
    main()
