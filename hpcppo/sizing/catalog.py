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
    """What the memory and FLOP arithmetic needs from a decoder-only (Llama/Qwen2/Qwen3-style) model's config.json.

    Mixture of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): ``num_experts`` > 0; ``moe_layers`` of the ``layers`` hold a
    router (hidden -> experts), ``num_experts`` SwiGLU experts of ``moe_intermediate`` and, with
    ``shared_expert_intermediate``, a shared expert and its gate (hidden -> 1); the others a dense MLP of
    ``intermediate``. Every token runs ``experts_per_token`` of the experts: memory counts all parameters
    (:attr:`params`), FLOPs only the ones a token runs (:attr:`active_params`)."""

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
    qk_norm: bool = False  # Qwen3: an RMSNorm of head_dim on each query and key head
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    moe_layers: int = 0  # layers with experts (the rest are dense)
    shared_expert_intermediate: int = 0

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.moe_layers > 0

    @property
    def attention_params(self) -> int:
        """q, k, v, o (and their biases, the q/k norms), and the layer's two RMSNorms."""
        h, hd = self.hidden, self.hd
        attn = h * self.heads * hd + 2 * h * self.kv_heads * hd + self.heads * hd * h
        bias = (self.heads * hd + 2 * self.kv_heads * hd) if self.attention_bias else 0
        return attn + bias + (2 * hd if self.qk_norm else 0) + 2 * h

    def _expert_block(self, experts: int) -> int:
        """Router, ``experts`` routed experts (gate, up, down) and the shared expert with its gate."""
        h = self.hidden
        shared = 3 * h * self.shared_expert_intermediate + h if self.shared_expert_intermediate else 0
        return h * self.num_experts + experts * 3 * h * self.moe_intermediate + shared

    @property
    def layer_params(self) -> int:
        """The largest decoder layer (an expert layer when there are any): what FSDP gathers for one layer."""
        mlp = self._expert_block(self.num_experts) if self.is_moe else 3 * self.hidden * self.intermediate
        return self.attention_params + mlp

    def _layers_params(self, experts: int) -> int:
        dense = self.layers - (self.moe_layers if self.is_moe else 0)
        moe = self.moe_layers * self._expert_block(experts) if self.is_moe else 0
        return self.layers * self.attention_params + dense * 3 * self.hidden * self.intermediate + moe

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        return self.vocab * self.hidden * (1 if self.tie_word_embeddings else 2)

    @property
    def params(self) -> int:
        """Every parameter: what is stored, sharded, synced and checkpointed."""
        return self._layers_params(self.num_experts) + self.embedding_params + self.hidden  # + final norm

    @property
    def active_params(self) -> int:
        """The parameters one token runs through (``experts_per_token`` of the experts): what FLOPs count. Equal to
        :attr:`params` for a dense model."""
        if not self.is_moe:
            return self.params
        return self._layers_params(self.experts_per_token) + self.embedding_params + self.hidden

    def params_read(self, tokens: float) -> float:
        """Parameters a forward of ``tokens`` tokens reads (a decode step of that many sequences): all of a dense
        model; of a mixture of experts the non-expert ones and the share of experts at least one token is routed to,
        ``1 - (1 - k / E) ** tokens`` with uniform routing (vLLM's fused MoE kernel reads only experts with tokens)."""
        if not self.is_moe:
            return float(self.params)
        experts = self.moe_layers * self.num_experts * 3 * self.hidden * self.moe_intermediate
        touched = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(tokens, 1.0)
        return self.params - experts + experts * touched

    @property
    def critic_params(self) -> int:
        """The critic: the backbone without the LM head, plus a value head (hidden -> 1, with bias)."""
        return self._layers_params(self.num_experts) + self.vocab * self.hidden + self.hidden + self.hidden + 1

    @property
    def critic_active_params(self) -> int:
        """The critic's parameters one token runs through (its FLOPs)."""
        return self.critic_params - self.params + self.active_params

    @property
    def root_params(self) -> int:
        """What FSDP's root unit owns (embeddings, LM head, final norm): gathered for a whole forward/backward."""
        return self.embedding_params + self.hidden

    @property
    def largest_tensor_elems(self) -> int:
        """The largest single parameter: the embedding (vocab x hidden), or a fused expert tensor (transformers 5 keeps
        a layer's experts as one ``gate_up_proj`` of experts x 2 x moe_intermediate x hidden)."""
        return max(self.vocab * self.hidden, 2 * self.num_experts * self.moe_intermediate * self.hidden)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Key and value of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.hd * dtype_bytes

    def mlp_elems_per_token(self) -> int:
        """Elements of the MLP's intermediate tensors per token of one layer: gate, up, SiLU(gate) and their product
        (dense); per routed expert a token runs the same at ``moe_intermediate`` plus its output before the weighted
        sum, and the router's logits and probabilities (the largest layer's, for a mixture of experts)."""
        if not self.is_moe:
            return 4 * self.intermediate
        routed = self.experts_per_token * (4 * self.moe_intermediate + self.hidden)
        return routed + 2 * self.num_experts + 4 * self.shared_expert_intermediate

    def working_elems_per_token(self) -> int:
        """What one layer's forward without autograd holds at once, per token: the residual stream and the MLP's gate,
        up and product (dense), or those of each routed expert a token runs, their outputs and the router's."""
        if not self.is_moe:
            return 2 * self.hidden + 3 * self.intermediate
        routed = self.experts_per_token * (3 * self.moe_intermediate + self.hidden)
        return 2 * self.hidden + routed + 2 * self.num_experts + 3 * self.shared_expert_intermediate

    def activation_elems_per_token_layer(self) -> int:
        """Tensors one decoder layer keeps for backward, per token, in elements of the compute dtype: both norms'
        inputs and outputs, q/k/v, the attention output (flash/SDPA: no score matrix), and the MLP's
        (:meth:`mlp_elems_per_token`)."""
        h = self.hidden
        return 5 * h + self.heads * self.hd + 2 * self.kv_heads * self.hd + self.mlp_elems_per_token()


_QWEN = "https://huggingface.co/Qwen/{}/blob/main/config.json"
_LLAMA = "https://huggingface.co/meta-llama/{}/blob/main/config.json"


def _qwen(name: str, hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tie: bool) -> ModelShape:
    return ModelShape(name, hidden, layers, heads, kv, inter, vocab, tie, attention_bias=True,
                      source=_QWEN.format(name))


def _qwen3(name: str, hidden: int, layers: int, heads: int, kv: int, inter: int, *, experts: int = 0, top_k: int = 0,
           moe_inter: int = 0) -> ModelShape:
    """A Qwen3 model (model_type qwen3 / qwen3_moe): head_dim 128 whatever hidden / heads, q/k norms, no attention
    bias, vocab 151936, untied embeddings; the MoE models have experts in every layer (``decoder_sparse_step`` 1,
    ``mlp_only_layers`` empty)."""
    return ModelShape(name, hidden, layers, heads, kv, inter, 151936, False, head_dim=128, qk_norm=True,
                      num_experts=experts, experts_per_token=top_k, moe_intermediate=moe_inter,
                      moe_layers=layers if experts else 0, source=_QWEN.format(name))


# The -Instruct variants share each base model's shape (and Qwen3's -Instruct-2507 / -Thinking-2507 theirs).
KNOWN_MODELS: dict[str, ModelShape] = {m.name.lower(): m for m in (
    _qwen("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True),
    _qwen("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
    _qwen("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True),
    _qwen("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False),
    _qwen("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, False),
    _qwen("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, False),
    _qwen("Qwen2.5-72B", 8192, 80, 64, 8, 29568, 152064, False),
    _qwen3("Qwen3-8B", 4096, 36, 32, 8, 12288),
    _qwen3("Qwen3-32B", 5120, 64, 64, 8, 25600),
    _qwen3("Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, experts=128, top_k=8, moe_inter=768),
    _qwen3("Qwen3-235B-A22B", 4096, 94, 64, 4, 12288, experts=128, top_k=8, moe_inter=1536),
    ModelShape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, False, source=_LLAMA.format("Llama-3.1-8B")),
    ModelShape("Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256, False, source=_LLAMA.format("Llama-3.1-70B")),
)}
