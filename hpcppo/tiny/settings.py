"""``TinySettings``: everything that determines a tiny-model build, validated, with a stable hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from hpcppo.data import arith_tool, synthetic
from hpcppo.errors import ConfigError

from hpcppo.tiny.tokenizer import CHARS, SPECIAL_TOKENS, TOOL_TOKENS, VARIANTS, VOCAB_SIZE

MAX_SEED = 2**32 - 1 - 10_000_000  # the build derives seeds up to seed + 4,000,037
FORMAT_VERSION = 2  # 2: both warm-start stages run a fixed schedule to convergence
#: The tool variant's defaults (``TinySettings.of``): 3-digit multiplication (hpcppo.data.arith_tool), 256
#: positions for the multi-turn response, one warm-start stage on the call format (hpcppo.tiny.tool_warmstart).
TOOL_DEFAULTS: dict[str, Any] = {"min_operand": 100, "max_operand": 999, "max_position_embeddings": 256,
                                 "max_new_tokens": 24, "steps": 300, "eval_every": 50, "target_sampled_accuracy": 0.2}
#: The name of the tool the tool variant calls, and its call's opening (hpcppo.agent.builtin.Calculator's schema;
#: a test keeps them equal): the warm start's call is ``<call>calculator(A*B)</call>``.
CALCULATOR_NAME = "calculator"


@dataclasses.dataclass(frozen=True)
class TinySettings:
    """Everything that determines a build; its hash decides whether a rebuild is needed."""

    seed: int = 0
    # task (hpcppo.data.synthetic): a+b with a, b in 0..19 -- small enough to learn in ~300 steps
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
    # mixture of experts (0 = the dense Llama): a Qwen3-MoE of moe_experts experts per layer, moe_top_k routed per
    # token (norm_topk_prob, as Qwen3-30B-A3B), each expert intermediate_size // moe_top_k wide, so that the active
    # MLP width per token is the dense model's
    moe_experts: int = 0
    moe_top_k: int = 2
    # stage 1: learn the task, `steps` steps (warmup, then cosine to zero); target: greedy held-out accuracy
    lr: float = 3e-3
    batch_size: int = 128
    steps: int = 400
    warmup_steps: int = 20
    eval_every: int = 25
    eval_size: int = 256
    target_greedy_accuracy: float = 0.9
    # stage 2 (add_flaw): learn to ramble on after the answer (flaw_rate of the targets), same schedule;
    # converged, sampled accuracy is near 1 - flaw_rate; target: sampled held-out accuracy at most this
    target_sampled_accuracy: float = 0.4
    flaw_rate: float = 0.75
    flaw_lr: float = 2e-3
    flaw_steps: int = 150
    flaw_warmup_steps: int = 10
    max_new_tokens: int = 8
    # "arith": a+b (hpcppo.data.synthetic), two warm-start stages; "tool": a*b with a calculator call
    # (hpcppo.data.arith_tool), the tokenizer's TOOL_TOKENS, one warm-start stage on the call format
    variant: str = "arith"
    min_operand: int = 0  # the tool variant's smallest operand (the arith task's is 0)
    # the tool variant's warm start: this fraction of its trajectories call the calculator, the others answer at once
    # (wrongly: the model cannot multiply), so that RL has the choice to learn (rollout/tool_calls_mean rises)
    call_fraction: float = 0.5

    @classmethod
    def of(cls, *, variant: str = "arith", **fields: Any) -> TinySettings:
        """The settings of ``variant``: its defaults (:data:`TOOL_DEFAULTS` for "tool"), then ``fields``."""
        if variant not in VARIANTS:
            raise ConfigError(f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}", key="--variant")
        return cls(variant=variant, **{**(TOOL_DEFAULTS if variant == "tool" else {}), **fields})

    def __post_init__(self) -> None:
        if len(SPECIAL_TOKENS) + len(CHARS) + len(TOOL_TOKENS) > VOCAB_SIZE:
            raise AssertionError("the tokenizer's alphabet outgrew VOCAB_SIZE")
        if self.variant not in VARIANTS:
            raise ConfigError(f"unknown variant {self.variant!r}; allowed: {', '.join(VARIANTS)}", key="--variant")
        if self.variant == "arith" and self.min_operand:
            raise ConfigError(f"applies to the tool variant only (the arith task's operands start at 0), got "
                              f"{self.min_operand!r}", key="min_operand")
        if self.variant == "arith" and self.call_fraction != 0.5:
            raise ConfigError(f"applies to the tool variant only, got {self.call_fraction!r}", key="call_fraction")
        try:
            self.generate_rows(0, seed=self.seed, split="train")
        except ValueError as exc:
            raise ConfigError(str(exc), key="tiny-model task") from None
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"must be in 0 to {MAX_SEED:,} (numpy's and the data's seeds), got {self.seed!r}",
                              key="seed")
        self._check_answer_fits()
        for name in ("target_greedy_accuracy", "target_sampled_accuracy", "flaw_rate", "call_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"must be in [0, 1], got {getattr(self, name)!r}", key=name)
        for name in ("batch_size", "steps", "flaw_steps", "eval_every", "eval_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, name)!r}", key=name)
        if self.moe_experts and not 2 <= self.moe_top_k <= self.moe_experts:
            raise ConfigError(f"must be 2 to the number of experts ({self.moe_experts}), got {self.moe_top_k!r}",
                              key="--top-k")
        if self.moe_experts < 0 or self.moe_experts == 1:
            raise ConfigError(f"must be 0 (dense) or >= 2, got {self.moe_experts!r}", key="--experts")
        for name in ("warmup_steps", "flaw_warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, name)!r}", key=name)

    def _check_answer_fits(self) -> None:
        """The longest answer (its digits, a sign, the end token), or the tool variant's call turn, must fit
        ``max_new_tokens``: a task whose answers the model cannot finish writing cannot be learnt, and its build
        would spend minutes for nothing."""
        if self.variant == "tool":
            # the longer turn: <call>calculator(A*B)</call><eos>
            longest = 1 + len(CALCULATOR_NAME) + 1 + 2 * len(str(self.max_operand)) + 1 + 1 + 1 + 1
            if longest > self.max_new_tokens:
                raise ConfigError(f"{self.max_new_tokens!r} new tokens cannot hold the call "
                                  f"<call>{CALCULATOR_NAME}(A*B)</call> and the end token ({longest} tokens with "
                                  f"max_operand {self.max_operand}); allowed: >= {longest}", key="max_new_tokens")
            return
        longest = len(str(self.max_operand * self.num_operands)) + ("-" in self.operators) + 1
        if self.max_new_tokens >= 1 and longest > self.max_new_tokens:
            top = int("9" * max(self.max_new_tokens - 1 - ("-" in self.operators), 1)) // self.num_operands
            raise ConfigError(f"{self.max_operand!r} makes answers of {longest - 1} characters, more than the tiny "
                              f"model's {self.max_new_tokens} new tokens hold with the end token; allowed: 1 to {top:,}",
                              key="max_operand")

    @property
    def data_source(self) -> str:
        return arith_tool.DATA_SOURCE if self.variant == "tool" else synthetic.DATA_SOURCE

    def generate_rows(self, n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
        """``n`` rows of the task (verl's schema): the arith or the tool variant's generator."""
        if self.variant == "tool":
            return arith_tool.generate_rows(n, seed=seed, split=split, **self.task_kwargs())
        return synthetic.generate_rows(n, seed=seed, split=split, **self.task_kwargs())

    def task_kwargs(self) -> dict[str, Any]:
        if self.variant == "tool":
            return {"min_operand": self.min_operand, "max_operand": self.max_operand, "val_fraction": self.val_fraction}
        return {
            "max_operand": self.max_operand,
            "num_operands": self.num_operands,
            "operators": self.operators,
            "val_fraction": self.val_fraction,
        }

    def distinct_problems(self) -> int:
        """How many different problems the task can pose (both splits together)."""
        if self.variant == "tool":
            return (self.max_operand - self.min_operand + 1) ** 2
        return (self.max_operand + 1) ** self.num_operands * len(set(self.operators)) ** (self.num_operands - 1)

    def describe_task(self) -> str:
        if self.variant == "tool":
            return f"variant=tool, operands {self.min_operand} to {self.max_operand}, operators=*"
        return (f"max_operand={self.max_operand}, num_operands={self.num_operands}, "
                f"operators={''.join(self.operators)}")

    @property
    def architecture(self) -> str:
        return "Qwen3MoeForCausalLM" if self.moe_experts else "LlamaForCausalLM"

    def digest(self) -> str:
        fields = dataclasses.asdict(self)
        if not self.moe_experts:  # a dense build keeps the hash it had before the MoE fields existed
            del fields["moe_experts"], fields["moe_top_k"]
        if self.variant == "arith":  # ... and the arith variant the hash it had before the tool variant existed
            del fields["variant"], fields["min_operand"], fields["call_fraction"]
        payload = json.dumps({"format": FORMAT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]
