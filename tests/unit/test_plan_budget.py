"""hpcppo.sizing: the per-GPU memory budget and the time estimate, on realistic runs, checked against published
figures (each cited where it is used) and against the trainer's own choices (fp32 master weights, FSDP2 sharding,
AdamW moments, offload)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config import FsdpSection
from hpcppo.errors import ConfigError, ResolveError
from hpcppo.sizing.accumulation import grads_in_flight
from hpcppo.sizing.catalog import GPUS, KNOWN_MODELS, ModelShape
from hpcppo.sizing.check import check_colocation
from hpcppo.sizing.estimate import _layer_acts, _trained, estimate, model_shape

REPO = Path(__file__).resolve().parents[2]
GB = 1e9


def spec(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def q7b_ppo(tmp_path: Path, *, offload: bool) -> Path:
    """verl-style PPO (GAE: actor, critic) of Qwen2.5-7B on one node of 8 A100-80GB."""
    off = "true" if offload else "false"
    return spec(tmp_path, f"""
name = "q7b-ppo"
[model]
path = "Qwen/Qwen2.5-7B-Instruct"
gradient_checkpointing = true
[data]
train_files = ["train.parquet"]
max_prompt_length = 512
max_response_length = 512
[rollout]
engine = "vllm"
n = 1
tensor_parallel_size = 2
gpu_memory_utilization = 0.4
micro_batch_size_per_gpu = 16
[actor]
ppo_mini_batch_size = 256
ppo_micro_batch_size_per_gpu = 8
[actor.fsdp]
param_offload = {off}
optimizer_offload = {off}
[critic]
ppo_micro_batch_size_per_gpu = 8
[critic.fsdp]
param_offload = {off}
optimizer_offload = {off}
[algorithm]
adv_estimator = "gae"
[trainer]
train_batch_size = 1024
total_steps = 100
[resources]
nodes = 1
time = "12:00:00"
""")


def q32b_grpo(tmp_path: Path, *, offload: bool) -> Path:
    """GRPO of Qwen2.5-32B on 2 nodes x 8 H100 (HSDP: sharded over the 8 GPUs of a node)."""
    off = "true" if offload else "false"
    return spec(tmp_path, f"""
name = "q32b-grpo"
[model]
path = "Qwen/Qwen2.5-32B-Instruct"
gradient_checkpointing = true
[data]
train_files = ["train.parquet"]
max_prompt_length = 1024
max_response_length = 2048
[rollout]
engine = "vllm"
n = 8
tensor_parallel_size = 4
gpu_memory_utilization = 0.5
micro_batch_size_per_gpu = 8
[actor]
ppo_mini_batch_size = 32
ppo_micro_batch_size_per_gpu = 2
use_kl_loss = true
[actor.fsdp]
param_offload = {off}
optimizer_offload = {off}
[reference]
offload = true
[algorithm]
adv_estimator = "grpo"
[trainer]
train_batch_size = 128
total_steps = 200
[resources]
nodes = 2
time = "1-00:00:00"
""")


def budget_of(path: Path, site: str, overrides=()):
    c = compile_config(path, site, overrides, check_paths=False, check_memory=False)
    return estimate(c.site, c.experiment, c.plan), c


def items(budget, phase: str) -> dict[str, int]:
    [p] = [p for p in budget.phases if p.name == phase]
    return {i.what: i.bytes for i in p.items}


def grad_line(update: dict[str, int], role: str = "actor") -> tuple[str, int]:
    """An update's gradient line: its label and bytes (the fp32 shard + one layer's unsharded gradients in flight)."""
    [(what, size)] = [(k, v) for k, v in update.items() if k.startswith(f"{role} grads: fp32 shard ")]
    return what, size


# ------------------------------------------------------------------------------------------ published figures
def test_sixteen_bytes_per_parameter_as_in_the_zero_paper():
    # ZeRO (Rajbhandari et al., https://arxiv.org/abs/1910.02054, Sec. 3.1 and Figure 1): mixed-precision Adam holds
    # 16 bytes per parameter; a 7.5B model over 64 GPUs with P_os+g+p needs 1.9 GB per GPU (120 GB unsharded).
    # hpcppo's split differs (fp32 master 4 + fp32 grads 4 + AdamW moments 8; no fp16 copy is kept, FSDP2 casts
    # gathered layers on the fly) but the total per parameter is the same.
    t = _trained(7_500_000_000, 64, FsdpSection())
    assert t.params + t.grads + t.optim == 16 * 7_500_000_000 // 64
    assert round((t.params + t.grads + t.optim) / GB, 1) == 1.9
    one = _trained(7_500_000_000, 1, FsdpSection())
    assert (one.params + one.grads + one.optim) / GB == 120.0
    # Offload: FSDP2's CPUOffloadPolicy keeps all three on the host; optimizer_offload only the moments, between updates.
    assert _trained(7_500_000_000, 64, FsdpSection(param_offload=True)) == _trained(0, 64, FsdpSection())
    opt = _trained(7_500_000_000, 64, FsdpSection(optimizer_offload=True))
    assert opt.optim_between_updates == 0 and opt.optim == t.optim


def test_parameter_counts_match_the_qwen_model_cards():
    # https://huggingface.co/Qwen/Qwen2.5-7B: 7.61B parameters, 6.53B non-embedding;
    # https://huggingface.co/Qwen/Qwen2.5-0.5B: 0.49B, 0.36B non-embedding (tied embeddings).
    for name, total, non_embedding in (("qwen2.5-7b", 7.61, 6.53), ("qwen2.5-0.5b", 0.49, 0.36)):
        m = KNOWN_MODELS[name]
        assert abs(m.params / GB - total) < 0.01, (name, m.params)
        assert abs((m.params - m.embedding_params) / GB - non_embedding) < 0.01, (name, m.params - m.embedding_params)
    # https://huggingface.co/Qwen/Qwen2.5-32B states 32.5B and 31.0B non-embedding; its config.json (64 layers of
    # hidden 5120, intermediate 27648, 8 KV heads) gives 32.76B and 31.21B, which is what FSDP shards: the card
    # rounds down by under 1%.
    m = KNOWN_MODELS["qwen2.5-32b"]
    assert m.params / GB == pytest.approx(32.5, rel=0.01)
    assert (m.params - m.embedding_params) / GB == pytest.approx(31.0, rel=0.01)
    # https://huggingface.co/meta-llama/Llama-3.1-8B: 8.03B (Meta's model card: "8B"; 8,030,261,248 in safetensors)
    assert KNOWN_MODELS["llama-3.1-8b"].params == 8_030_261_248


def test_kv_bytes_per_token_as_in_the_pagedattention_paper():
    # Kwon et al., PagedAttention (https://arxiv.org/abs/2309.06180, Sec. 3): for OPT-13B "the KV cache of a single
    # token demands 800 KB of space, calculated as 2 (key and value vectors) x 5120 (hidden state size) x 40
    # (number of layers) x 2 (bytes per FP16)".
    opt13b = ModelShape("opt-13b", hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=20480, vocab=50272,
                        tie_word_embeddings=True)
    assert opt13b.kv_bytes_per_token(2) == 2 * 5120 * 40 * 2 == 800 * 1024
    # Qwen2.5-7B (GQA, 4 KV heads of 128): 56 KiB per token in bf16.
    assert KNOWN_MODELS["qwen2.5-7b"].kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 56 * 1024


def test_checkpointed_activations_keep_2sbh_bytes_per_layer():
    # Korthikanti et al. (https://arxiv.org/abs/2205.05198, Sec. 4.3): with full recomputation only each layer's
    # input, 2sbh bytes in 16-bit, is kept; one layer is recomputed at a time.
    m = KNOWN_MODELS["qwen2.5-7b"]
    tokens = 8 * 1024
    one_layer = tokens * m.activation_elems_per_token_layer() * 2
    assert _layer_acts(m, tokens, 2, checkpointing=True) == m.layers * 2 * tokens * m.hidden + one_layer * 5 // 4
    assert _layer_acts(m, tokens, 2, checkpointing=False) == m.layers * one_layer


# ------------------------------------------------------------------------------------------ model shapes
def test_a_local_config_json_is_read_and_matches_the_table(tmp_path):
    model = tmp_path / "my-qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}))
    shape, note = model_shape(str(model))
    assert "config.json" in note
    assert shape.params == KNOWN_MODELS["qwen2.5-7b"].params
    unknown, why = model_shape(str(tmp_path / "mystery-model"))
    assert unknown is None and "not a known architecture" in why and "Qwen2.5-7B" in why


# ------------------------------------------------------------------------------------------ Qwen2.5-7B on 8 x A100-80GB
def test_qwen7b_ppo_on_8_a100_without_offload(tmp_path):
    budget, c = budget_of(q7b_ppo(tmp_path, offload=False), "a100-cluster")
    n = KNOWN_MODELS["qwen2.5-7b"].params
    assert budget.gpu is GPUS["a100-80gb"] and budget.shard_size == 8 and not c.plan.hsdp
    update = items(budget, "actor update")
    # 16 bytes per parameter over 8 shards: 15.2 GB of actor state per GPU during its update.
    m = KNOWN_MODELS["qwen2.5-7b"]
    grads = grad_line(update)[1] - grads_in_flight(m, m.layer_params, 2, 4)  # the fp32 shard
    state = update["actor params (fp32 shard)"] + grads + update["actor AdamW moments (fp32 shard)"]
    assert state == pytest.approx(16 * n / 8, rel=1e-6) and round(state / GB, 1) == 15.2
    # The critic's params and moments stay resident during the actor's update.
    assert "critic params (fp32 shard)" in update and "critic AdamW moments (fp32 shard)" in update
    rollout = items(budget, "rollout (vLLM awake)")
    assert rollout["vLLM share (gpu_memory_utilization)"] == int(0.4 * 80 * 2**30)
    # vLLM: 7.6B bf16 weights over TP=2; 56 KiB per token over 2 GPUs; every sequence fits at once.
    assert budget.kv["weights_bytes"] == math.ceil(n * 2 / 2)
    assert budget.kv["kv_bytes_per_token_per_gpu"] == 28 * 1024
    assert budget.kv["concurrent_sequences"] == budget.kv["sequences_per_engine"] == 1024 // 4
    assert not budget.problems
    peak = budget.peak
    assert 40 * 2**30 < peak.total < 80 * 2**30, peak
    # Time: PPO does old log-probs, values, actor and critic training (8N with checkpointing) on 1024 x 1024 tokens.
    tokens = 1024 * 1024
    critic_n = KNOWN_MODELS["qwen2.5-7b"].critic_params
    assert budget.time["update_flops"] == pytest.approx(2 * n * tokens + 2 * critic_n * tokens + 8 * critic_n * tokens
                                                        + 8 * n * tokens)
    assert budget.time["gpu_hours"] == pytest.approx(100 * budget.time["step_s"] * 8 / 3600)


def test_qwen7b_ppo_on_8_a100_with_offload(tmp_path):
    plain, _ = budget_of(q7b_ppo(tmp_path, offload=False), "a100-cluster")
    off, _ = budget_of(q7b_ppo(tmp_path, offload=True), "a100-cluster")
    update = items(off, "actor update")
    assert not any(k.startswith(("actor params", "actor grads: fp32", "actor AdamW", "critic")) for k in update), update
    # the gradient shard is on the host; one layer's unsharded gradients are still made on the GPU
    m = KNOWN_MODELS["qwen2.5-7b"]
    [(what, size)] = [(k, v) for k, v in update.items() if k.startswith("actor grads: ")]
    assert what.endswith("; the fp32 shard on the host") and size == grads_in_flight(m, m.layer_params, 2, 4)
    n = KNOWN_MODELS["qwen2.5-7b"].params
    critic_n = KNOWN_MODELS["qwen2.5-7b"].critic_params
    # Offloading both frees 16 B/param of the actor and 12 B/param of the critic (its grads exist only in its update).
    saved = items(plain, "actor update")
    assert sum(saved.values()) - sum(update.values()) == pytest.approx((16 * n + 12 * critic_n) / 8, rel=1e-6)
    assert off.time["offload_bytes_per_gpu"] > 0 and off.time["offload_s"] > plain.time["offload_s"] == 0


def test_optimizer_offload_frees_the_moments_for_vllm(tmp_path):
    path = q7b_ppo(tmp_path, offload=False)
    plain, _ = budget_of(path, "a100-cluster")
    off, _ = budget_of(path, "a100-cluster", ["actor.fsdp.optimizer_offload=true"])
    n = KNOWN_MODELS["qwen2.5-7b"].params
    freed = items(plain, "rollout (vLLM awake)")["actor AdamW moments (fp32 shard)"]
    assert freed == 8 * n // 8 + (1 if (8 * n) % 8 else 0)
    assert "actor AdamW moments (fp32 shard)" not in items(off, "rollout (vLLM awake)")
    # It comes back for the update (4 mini-batches: present beside the activations from the second on).
    assert items(off, "actor update")["actor AdamW moments (fp32 shard)"] == freed


def test_offloaded_moments_with_a_single_optimizer_step_meet_the_grads_not_the_activations(tmp_path):
    # One mini-batch per step: OptimizerStateOffload brings the moments back only for the optimizer step, after the
    # activations of the last micro-batch are gone; the step is then a phase of its own.
    path = q7b_ppo(tmp_path, offload=False)
    budget, _ = budget_of(path, "a100-cluster", ["actor.fsdp.optimizer_offload=true", "actor.ppo_mini_batch_size=1024"])
    assert "actor AdamW moments (fp32 shard)" not in items(budget, "actor update")
    step = items(budget, "actor optimizer step")
    n = KNOWN_MODELS["qwen2.5-7b"].params
    assert step["actor AdamW moments (fp32 shard)"] == math.ceil(8 * n / 8)
    assert "actor grads (fp32 shard)" in step and not any(k.startswith(("activations", "policy")) for k in step)


# ------------------------------------------------------------------------------------------ Qwen2.5-32B on 2 x 8 H100
def test_qwen32b_on_2x8_h100_does_not_fit_without_offload_and_compile_says_what_to_change(tmp_path):
    path = q32b_grpo(tmp_path, offload=False)
    budget, c = budget_of(path, "h100-cluster")
    assert c.plan.hsdp and budget.shard_size == 8
    n = KNOWN_MODELS["qwen2.5-32b"].params
    # 16 B/param over one node's 8 GPUs: 65.5 GB of actor state alone, beside 0.5 x 79.6 GiB of vLLM.
    assert round(16 * n / 8 / GB, 1) == 65.5
    assert budget.problems
    with pytest.raises(ResolveError) as err:
        compile_config(path, "h100-cluster", check_paths=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert "rollout (vLLM awake) needs" in msg and "over the h100-80gb's 79.6 GiB" in msg
    for fix in ("rollout.gpu_memory_utilization (now 0.5)", "actor.fsdp.optimizer_offload = true",
                "actor.fsdp.param_offload = true", "more GPUs (resources.nodes, now 2)"):
        assert fix in msg


def test_qwen32b_on_2x8_h100_fits_with_offload(tmp_path, caplog):
    path = q32b_grpo(tmp_path, offload=True)
    with caplog.at_level(logging.WARNING, logger="hpcppo.sizing"):
        c = compile_config(path, "h100-cluster", check_paths=False)
    budget = check_colocation(c.site, c.experiment, c.plan)
    assert budget is not None and not budget.problems
    assert budget.peak.total < GPUS["h100-80gb"].memory_bytes
    # 128 prompts over 4 engines (TP=4 on 16 GPUs) x n=8: 256 sequences of up to 3072 tokens per engine do not all fit the KV cache: a warning, not a refusal.
    assert budget.kv["concurrent_sequences"] < budget.kv["sequences_per_engine"] == 128 // (16 // 4) * 8
    assert any("waves" in r.getMessage() for r in caplog.records)
    assert budget.time["gpu_hours"] == pytest.approx(200 * budget.time["step_s"] * 16 / 3600)


def test_a_kv_cache_smaller_than_one_sequence_is_refused(tmp_path):
    path = q32b_grpo(tmp_path, offload=True)
    with pytest.raises(ResolveError, match=r"fewer than one sequence of max_model_len 3072.*raise rollout.gpu_memory_utilization"):
        compile_config(path, "h100-cluster", ["rollout.gpu_memory_utilization=0.12"], check_paths=False)


def test_an_explicit_kv_cache_replaces_the_share_in_the_budget(tmp_path):
    path = q7b_ppo(tmp_path, offload=True)
    shared, _ = budget_of(path, "a100-cluster")
    explicit, c = budget_of(path, "a100-cluster", ["rollout.kv_cache_memory_mb=4096"])
    kv = explicit.kv
    # weights + profile pass + graphs + exactly the cache asked for, whatever gpu_memory_utilization says
    assert kv["kv_cache_bytes"] == 4096 * 2**20
    assert kv["vllm_share_bytes"] == kv["weights_bytes"] + kv["profile_activation_bytes"] + kv["cuda_graphs_bytes"] + 4096 * 2**20
    assert items(explicit, "rollout (vLLM awake)")["vLLM: weights + kv_cache_memory_mb"] == kv["vllm_share_bytes"]
    assert kv["vllm_share_bytes"] != shared.kv["vllm_share_bytes"]
    with pytest.raises(ResolveError, match=r"rollout.kv_cache_memory_mb = 1 holds \d+ tokens, fewer than one sequence of "
                                           r"max_model_len \d+ .*raise it to at least \d+, or set it to 0"):
        compile_config(path, "a100-cluster", ["rollout.kv_cache_memory_mb=1"], check_paths=False)


# ------------------------------------------------------------------------------------------ signal lead, sites
def test_signal_lead_shorter_than_step_and_checkpoint_warns(tmp_path, caplog):
    path = q32b_grpo(tmp_path, offload=True)
    with caplog.at_level(logging.WARNING, logger="hpcppo.sizing"):
        compile_config(path, "h100-cluster", ["site.slurm.signal_lead_s=60"], check_paths=False)
    [lead] = [r.getMessage() for r in caplog.records if "signal_lead_s" in r.getMessage()]
    assert "signal_lead_s = 60 s is shorter than an estimated step + checkpoint" in lead and "TIMEOUT" in lead
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hpcppo.sizing"):
        compile_config(path, "h100-cluster", ["site.slurm.signal_lead_s=7200"], check_paths=False)
    assert not [r for r in caplog.records if "signal_lead_s" in r.getMessage()]


def test_an_unknown_gpu_kind_is_one_line_naming_the_allowed_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        compile_config(REPO / "examples" / "gsm8k-qwen2.5-7b.toml", "a100-cluster", ["site.gpu=b200"], check_paths=False)
    msg = str(err.value)
    assert "gpu" in msg and "a100-80gb" in msg and "h100-80gb" in msg and "\n" not in msg


def test_a_gpu_site_that_cannot_be_judged_says_so(tmp_path, caplog):
    path = q32b_grpo(tmp_path, offload=False)
    with caplog.at_level(logging.WARNING, logger="hpcppo.sizing"):
        compile_config(path, "h100-cluster", ["site.gpu="], check_paths=False)
        compile_config(path, "h100-cluster", ["model.path=somewhere/my-own-model"], check_paths=False)
    notes = [r.getMessage() for r in caplog.records if "GPU memory not checked" in r.getMessage()]
    assert len(notes) == 2
    assert "site 'h100-cluster' has no gpu key (allowed: a100-40gb, a100-80gb" in notes[0]
    assert "'my-own-model' is not a known architecture" in notes[1]


def test_cpu_sites_are_not_judged(tmp_path):
    c = compile_config(REPO / "examples" / "arith-tiny.toml", "local", check_paths=False)
    assert check_colocation(c.site, c.experiment, c.plan) is None
    # A GPU site without a gpu key: memory shown, nothing refused.
    budget, _ = budget_of(q32b_grpo(tmp_path, offload=False), "h100-cluster", ["site.gpu="])
    assert budget.gpu is None and budget.phases and not budget.problems and not budget.time


@pytest.mark.parametrize("example,site", [("gsm8k-qwen2.5-7b.toml", "a100-cluster"),
                                          ("gsm8k-qwen2.5-7b.toml", "h100-cluster"),
                                          ("arith-tiny.toml", "local"), ("arith-tiny.toml", "local-slurm"),
                                          ("arith-tool.toml", "local")])
def test_the_examples_still_compile_on_their_sites(example, site):
    c = compile_config(REPO / "examples" / example, site, check_paths=False)
    if c.site.device == "cuda":
        budget = check_colocation(c.site, c.experiment, c.plan)
        assert budget is not None and budget.peak.total < budget.gpu.memory_bytes


def test_token_budgets_size_the_activations_and_logits_of_their_passes(tmp_path):
    """With max_tokens_per_micro_batch a micro-batch holds at most that many tokens whatever its rows: the plan sizes
    activations by the budget, not by micro-batch rows x the longest sequence, and bounds the logits by it."""
    path = q7b_ppo(tmp_path, offload=True)
    fixed, c = budget_of(path, "a100-cluster")
    seq = c.plan.max_sequence_length
    rows = c.plan.actor_micro_batch_per_rank
    same, _ = budget_of(path, "a100-cluster", [f"actor.max_tokens_per_micro_batch={rows * seq}"])
    double, _ = budget_of(path, "a100-cluster", [f"actor.max_tokens_per_micro_batch={2 * rows * seq}",
                                                 f"critic.max_tokens_per_micro_batch={4 * seq}",
                                                 f"rollout.max_tokens_per_micro_batch={4 * seq}"])

    def acts(budget, phase):
        return next(v for k, v in items(budget, phase).items() if k.startswith("activations"))

    assert acts(same, "actor update") == acts(fixed, "actor update")  # the same tokens in flight
    assert acts(double, "actor update") > acts(fixed, "actor update")
    four_rows, _ = budget_of(path, "a100-cluster", ["critic.ppo_micro_batch_size_per_gpu=4"])
    assert acts(double, "critic update") == acts(four_rows, "critic update")  # 4 x seq tokens either way
    # The logits: as many full-length responses as the budget holds, chunked as the trainer chunks them.
    response = c.experiment.data.max_response_length
    [label] = [k for k in items(double, "actor update") if k.startswith("policy logits")]
    assert label.startswith(f"policy logits ({2 * rows * seq // response} x ")
    fwd = items(double, "old log-probs / reference / values")
    assert any(f"a budget of {4 * seq} tokens" in k for k in fwd)


def test_the_72b_example_compiles_and_fits_64_h100s_with_the_settings_it_names():
    """examples/gsm8k-qwen2.5-72b.toml (docs/plan.md has its figures): meta-device loading keeps a rank's host memory
    near its shard, token budgets size the passes, full sharding over 64 GPUs fits every phase."""
    budget, c = budget_of(REPO / "examples" / "gsm8k-qwen2.5-72b.toml", "h100-cluster")
    assert c.plan.world_size == 64 and not c.plan.hsdp and budget.shard_size == 64
    assert budget.problems == []
    assert budget.peak is not None and budget.peak.total < budget.gpu.memory_bytes
    host = budget.host
    assert host["per_rank_bytes"] < host["old_path_per_rank_bytes"] / 20
    assert any("a budget of 6144 tokens" in k for k in items(budget, "actor update"))
