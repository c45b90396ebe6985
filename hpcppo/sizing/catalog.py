"""Facts the planner uses, each with where it comes from: GPU kinds, interconnects, known model shapes, and the
efficiency assumptions (which are guesses, and are printed as such).

Torch-free: the site schema imports :data:`GPU_KINDS` and the login-node ``plan`` command reads everything here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Constant", "GpuSpec", "GPUS", "GPU_KINDS", "ModelShape", "KNOWN_MODELS", "ASSUMPTIONS", "GIB", "GB"]

GIB = 1024**3
GB = 10**9


@dataclass(frozen=True)
class Constant:
    """A number the estimate depends on, and where it comes from (a URL, or "assumption: ...")."""

    name: str
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class GpuSpec:
    """One GPU kind. Bandwidths are per GPU and per direction; ``memory_bytes`` is what the device reports as its
    total (what vLLM multiplies ``gpu_memory_utilization`` by), not the marketing figure."""

    kind: str
    memory_bytes: int
    hbm_bytes_s: float
    bf16_flops: float
    nvlink_bytes_s: float
    network_bytes_s: float
    pcie_bytes_s: float
    source: str
    network_source: str

    def constants(self) -> list[Constant]:
        return [
            Constant(f"{self.kind} memory", self.memory_bytes / GIB, "GiB", self.source),
            Constant(f"{self.kind} HBM bandwidth", self.hbm_bytes_s / 1e12, "TB/s", self.source),
            Constant(f"{self.kind} dense bf16", self.bf16_flops / 1e12, "TFLOP/s", self.source),
            Constant(f"{self.kind} NVLink per direction", self.nvlink_bytes_s / GB, "GB/s", self.source),
            Constant(f"{self.kind} PCIe host link per direction", self.pcie_bytes_s / GB, "GB/s", self.source),
            Constant(f"{self.kind} inter-node network per GPU", self.network_bytes_s / GB, "GB/s", self.network_source),
        ]


_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_DGX_A100 = "DGX A100 user guide: 8x HDR InfiniBand 200 Gb/s, one per GPU (https://docs.nvidia.com/dgx/dgxa100-user-guide/)"
_DGX_H100 = "DGX H100 user guide: 8x NDR InfiniBand 400 Gb/s, one per GPU (https://docs.nvidia.com/dgx/dgxh100-user-guide/)"

# Memory: the total nvidia-smi reports (81920 MiB for A100 80GB, 81559 MiB for H100 80GB, 143771 MiB for H200).
# NVLink: the datasheets give the bidirectional total (600 / 900 GB/s); half of it flows each way. PCIe: Gen4 x16
# 64 GB/s and Gen5 x16 128 GB/s bidirectional per the datasheets, half each way. Dense bf16 (without sparsity).
GPUS: dict[str, GpuSpec] = {
    "a100-40gb": GpuSpec("a100-40gb", 40960 * 2**20, 1.555e12, 312e12, 300e9, 25e9, 32e9, _A100, _DGX_A100),
    "a100-80gb": GpuSpec("a100-80gb", 81920 * 2**20, 2.039e12, 312e12, 300e9, 25e9, 32e9, _A100, _DGX_A100),
    "h100-80gb": GpuSpec("h100-80gb", 81559 * 2**20, 3.35e12, 989e12, 450e9, 50e9, 64e9, _H100, _DGX_H100),
    "h200-141gb": GpuSpec("h200-141gb", 143771 * 2**20, 4.8e12, 989e12, 450e9, 50e9, 64e9, _H200, _DGX_H100),
}
GPU_KINDS: tuple[str, ...] = tuple(GPUS)
"""What a site's ``gpu`` key may name."""

# Efficiency assumptions: printed next to every estimate, because they are guesses.
ASSUMPTIONS: dict[str, Constant] = {c.name: c for c in (
    Constant("train MFU", 0.40, "of peak", "Llama 3 paper, 38-43% bf16 MFU on H100 for 405B pre-training "
             "(https://arxiv.org/abs/2407.21783, Table 4); RL updates on short sequences often do worse"),
    Constant("prefill MFU", 0.40, "of peak", "assumption: as training"),
    Constant("decode bandwidth use", 0.60, "of HBM", "assumption: memory-bound decode reaches 50-70% of peak "
             "bandwidth in vLLM at large batch"),
    Constant("collective efficiency", 0.70, "of link", "assumption: nccl-tests all-gather bus bandwidth is "
             "~70-80% of NVLink/IB line rate"),
    Constant("checkpoint write per node", 2.0, "GB/s", "assumption: a shared parallel file system (Lustre/GPFS) "
             "under load; measure yours"),
    Constant("framework reserve", 2.0, "GiB", "assumption: CUDA context (~0.5 GiB), NCCL buffers, allocator "
             "fragmentation"),
    Constant("rank process host", 2.0, "GiB", "a trainer rank's host memory before its models load: 0.5 GB "
             "measured on CPU after importing torch + transformers and joining the process group "
             "(tools/bench_load.py); assumption: CUDA's context and libraries add ~1.5 GiB on a GPU node"),
    Constant("vLLM CUDA graphs", 1.0, "GiB", "assumption: vLLM's graph pool with enforce_eager = false"),
    Constant("vLLM batched tokens", 8192, "tokens", "vLLM's profiling forward (max_num_batched_tokens), whose "
             "activations are reserved before the KV cache (vllm/v1/worker/gpu_worker.py determine_available_memory)"),
)}


@dataclass(frozen=True)
class ModelShape:
    """What the memory and FLOP arithmetic needs from a decoder-only (Llama/Qwen2-style) model's config.json."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_word_embeddings: bool
    head_dim: int = 0  # 0 = hidden / heads
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    source: str = ""

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        h, hd = self.hidden, self.hd
        attn = h * self.heads * hd + 2 * h * self.kv_heads * hd + self.heads * hd * h
        bias = (self.heads * hd + 2 * self.kv_heads * hd) if self.attention_bias else 0
        return attn + bias + 3 * h * self.intermediate + 2 * h  # q,k,v,o + gate,up,down + two RMSNorms

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        return self.vocab * self.hidden * (1 if self.tie_word_embeddings else 2)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.hidden  # + final norm

    @property
    def critic_params(self) -> int:
        """The critic: the backbone without the LM head, plus a value head (hidden -> 1, with bias)."""
        return self.layers * self.layer_params + self.vocab * self.hidden + self.hidden + self.hidden + 1

    @property
    def root_params(self) -> int:
        """What FSDP's root unit owns (embeddings, LM head, final norm): gathered for a whole forward/backward."""
        return self.embedding_params + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Key and value of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.hd * dtype_bytes

    def activation_elems_per_token_layer(self) -> int:
        """Tensors one decoder layer keeps for backward, per token, in elements of the compute dtype: both norms'
        inputs and outputs, q/k/v, the attention output (flash/SDPA: no score matrix), gate, up, SiLU(gate) and the
        product fed to down_proj."""
        h = self.hidden
        return 6 * h + 2 * self.kv_heads * self.hd + 4 * self.intermediate


_QWEN = "https://huggingface.co/Qwen/{}/blob/main/config.json"
_LLAMA = "https://huggingface.co/meta-llama/{}/blob/main/config.json"


def _qwen(name: str, hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tie: bool) -> ModelShape:
    return ModelShape(name, hidden, layers, heads, kv, inter, vocab, tie, attention_bias=True,
                      source=_QWEN.format(name))


# The -Instruct variants share each base model's shape.
KNOWN_MODELS: dict[str, ModelShape] = {m.name.lower(): m for m in (
    _qwen("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True),
    _qwen("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
    _qwen("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True),
    _qwen("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False),
    _qwen("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, False),
    _qwen("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, False),
    _qwen("Qwen2.5-72B", 8192, 80, 64, 8, 29568, 152064, False),
    ModelShape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, False, source=_LLAMA.format("Llama-3.1-8B")),
    ModelShape("Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256, False, source=_LLAMA.format("Llama-3.1-70B")),
)}
