"""A :class:`~hpcppo.sizing.estimate.Budget` as rich tables (``hpcppo plan``) or as JSON (``--json``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from hpcppo.sizing.catalog import GIB, ModelShape
from hpcppo.sizing.estimate import Budget
from hpcppo.sizing.steptime import UNLIMITED_TOOL_TURNS

__all__ = ["render", "as_json"]


def _gib(b: float) -> str:
    return f"{b / GIB:,.1f}"


def _size(b: float) -> str:
    return f"{b / GIB:,.1f} GiB" if b >= GIB / 10 else f"{b / 2**20:,.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:,.1f} s"
    if s < 7200:
        return f"{s / 60:,.1f} min"
    return f"{s / 3600:,.1f} h"


def _parameters(m: ModelShape) -> str:
    """The model line's parameter count: of a mixture of experts, total (memory) and active (FLOPs) and its
    experts."""
    if not m.is_moe:
        return f"{_count(m.params)} parameters"
    return (f"{_count(m.params)} parameters in total (memory), {_count(m.active_params)} active per token (FLOPs): "
            f"{m.num_experts} experts of {m.moe_intermediate}, {m.experts_per_token} per token, in {m.moe_layers} of "
            f"{m.layers} layers")


def as_json(budget: Budget, *, site: str, spec: str) -> dict[str, Any]:
    return {"site": site, "spec": spec, **budget.to_dict()}


def _table(what: str, amount: str) -> Table:
    """A table of two columns: what, and how much (right-aligned)."""
    table = Table()
    table.add_column(what)
    table.add_column(amount, justify="right")
    return table


def _phase_tables(budget: Budget) -> list[Any]:
    """Memory per phase: one table each, red where it does not fit."""
    out: list[Any] = []
    gpu = budget.gpu
    cap = gpu.memory_bytes if gpu else None
    for phase in budget.phases:
        title = f"{phase.name}: {_size(phase.total)}" + (f" of {_gib(cap)} GiB" if cap else "") + \
            (" per GPU" if budget.device == "cuda" else " per rank")
        over = cap is not None and phase.total > cap
        out.append(Text(title, style="bold red" if over else "bold"))
        table = _table("on each GPU" if budget.device == "cuda" else "on each rank", "size")
        for item in sorted(phase.items, key=lambda i: -i.bytes):
            table.add_row(item.what, _size(item.bytes))
        out.append(table)
    return out


def _host_table(budget: Budget) -> list[Any]:
    """Host memory per rank and node while the models load."""
    out: list[Any] = []
    host = budget.host
    if host:
        limit = host["limit_per_rank_bytes"]
        over = limit is not None and host["per_rank_bytes"] > limit
        out.append(Text(f"host memory at start-up: {_size(host['per_node_bytes'])} per node of "
                        f"{host['ranks_per_node']} ranks" + (f", {_size(limit * host['ranks_per_node'])} given "
                                                              "(slurm.mem_per_task x ranks)" if limit else ""),
                        style="bold red" if over else "bold"))
        table = _table("on each rank while the models load", "size")
        table.add_row("shards kept on the host (CPU ranks, param_offload, reference.offload)",
                      _size(host["shards_on_host_bytes"]))
        table.add_row("one tensor's rows in flight (the largest)", _size(host["largest_slice_bytes"]))
        table.add_row("the rank's process (rank process host)", _size(host["process_bytes"]))
        table.add_row("per rank", _size(host["per_rank_bytes"]), style="bold")
        table.add_row("per rank, old path (the whole float32 model on every rank)",
                      _size(host["old_path_per_rank_bytes"]))
        out.append(table)
    return out


def _kv_table(budget: Budget) -> list[Any]:
    """vLLM's share of a GPU and the KV cache it leaves."""
    out: list[Any] = []
    kv = budget.kv
    if kv:
        out.append(Text("vLLM share", style="bold"))
        table = _table("per GPU", "value")
        source = ("weights + profile + graphs + kv_cache_memory_mb" if kv.get("share_from") == "kv_cache_memory_mb"
                  else "gpu_memory_utilization x memory")
        table.add_row(f"share ({source})", f"{_gib(kv['vllm_share_bytes'])} GiB")
        table.add_row("weights (model.dtype / tensor parallel)", f"{_gib(kv['weights_bytes'])} GiB")
        table.add_row("profiling activations", f"{_gib(kv['profile_activation_bytes'])} GiB")
        table.add_row("CUDA graphs", f"{_gib(kv['cuda_graphs_bytes'])} GiB")
        table.add_row("KV cache", f"{_gib(max(0, kv['kv_cache_bytes']))} GiB")
        table.add_row("KV bytes per token (model / this GPU)",
                      f"{kv['kv_bytes_per_token_model']:,} / {kv['kv_bytes_per_token_per_gpu']:,}")
        table.add_row("KV cache tokens", f"{kv['kv_tokens']:,}")
        table.add_row("sequences per engine at max_model_len",
                      f"{kv['concurrent_sequences']:,} of {kv['sequences_per_engine']:,} "
                      f"({kv['waves']} wave{'s' if kv['waves'] != 1 else ''})")
        out.append(table)
    return out


def _time_table(budget: Budget) -> list[Any]:
    """One step's time, worst case, and GPU-hours."""
    out: list[Any] = []
    t = budget.time
    if t:
        out.append(Text("one step, worst case (every response max_response_length long"
                        + (", all turns together" if "tool_calls_per_trajectory" in t else "") + ")", style="bold"))
        table = _table("phase", "estimate")
        table.add_row("generation (prefill + decode)", _duration(t["generate_s"]))
        table.add_row("  generated tokens/s (whole job)", f"{t['generated_tokens_per_s']:,.0f}")
        if t.get("baseline_generate_s"):
            table.add_row("ReMax greedy baselines (one response per prompt)", _duration(t["baseline_generate_s"]))
        if "tool_calls_per_trajectory" in t:
            calls = int(t["tool_calls_per_trajectory"])
            turns = (f"{UNLIMITED_TOOL_TURNS} tool turns assumed: no turn limit is set" if t["tool_turns_assumed"]
                     else "the turn limit")
            table.add_row(f"tool calls ({calls} per trajectory, {turns}; x rollout.multi_turn.expected_tool_s, one "
                          f"call at a time per rank)", _duration(t["tool_s"]))
        table.add_row("forwards + updates at MFU", _duration(t["forward_and_update_s"]))
        table.add_row("  FLOPs", f"{t['update_flops']:.3g}")
        table.add_row(f"weight sync ({t['weight_sync_bytes'] / 1e9:,.1f} GB all-gathered"
                      + (", then broadcast to the rollout ranks)" if "weight_broadcast_s" in t else ")"),
                      _duration(t["weight_sync_s"]))
        if t.get("grad_reduce_scatters"):
            table.add_row(f"gradient reduce-scatters ({int(t['grad_reduce_scatters'])}: one per micro-batch, "
                          f"{t['grad_reduce_scatter_bytes_per_gpu'] / 1e9:,.1f} GB per GPU; "
                          f"{_duration(t['grad_reduce_scatter_link_s'])} on the link, the rest under backward)",
                          _duration(t["grad_reduce_scatter_s"]))
        if t["replica_grad_sync_s"]:
            table.add_row("HSDP gradient all-reduce across nodes", _duration(t["replica_grad_sync_s"]))
        table.add_row(f"offload traffic ({t['offload_bytes_per_gpu'] / 1e9:,.1f} GB per GPU over PCIe)",
                      _duration(t["offload_s"]))
        table.add_row("step", _duration(t["step_s"]), style="bold")
        table.add_row(f"checkpoint ({t['checkpoint_bytes'] / 1e9:,.0f} GB)", _duration(t["checkpoint_s"]))
        if t.get("checkpoint_queue_wait_s"):
            table.add_row("checkpoint's wait for the queued samples (worst case)",
                          _duration(t["checkpoint_queue_wait_s"]))
        if "validation_s" in t:
            table.add_row(f"one validation ({int(t['validation_prompts']):,} prompts x rollout.val_n)",
                          _duration(t["validation_s"]))
        table.add_row("GPU-hours per 100 steps", f"{t['gpu_hours_per_100_steps']:,.1f}")
        if "gpu_hours" in t:
            table.add_row(f"GPU-hours for {int(t['total_steps']):,} steps", f"{t['gpu_hours']:,.1f}", style="bold")
        out.append(table)
    return out


def _placements_table(budget: Budget) -> list[Any]:
    """The step time of this run's placement and of the best other one (docs/placement.md), and the verdict."""
    out: list[Any] = []
    if budget.placements:
        out.append(Text("placements (one step, worst case)", style="bold"))
        table = _table("placement", "step")
        for column in ("generation side", "training side", "weight transfer", "GPU-hours / 100 steps"):
            table.add_column(column, justify="right")
        for i, row in enumerate(budget.placements):
            table.add_row(("this run: " if i == 0 else "instead: ") + row["layout"], _duration(row["step_s"]),
                          _duration(row["rollout_side_s"]), _duration(row["trainer_side_s"]),
                          _duration(row["weight_sync_s"]), f"{row['gpu_hours_per_100_steps']:,.1f}")
        out.append(table)
    if budget.placement_verdict:
        out.append(Text(budget.placement_verdict))
    return out


def _constants_table(budget: Budget) -> list[Any]:
    """The constants the estimate uses, with their sources."""
    out: list[Any] = []
    out.append(Text("constants", style="bold"))
    table = _table("constant", "value")
    table.add_column("source", overflow="fold")
    for c in budget.constants:
        table.add_row(c.name, f"{c.value:g} {c.unit}", c.source)
    out.append(table)
    return out


def render(budget: Budget, *, site: str, spec: str) -> list[Any]:
    """Renderables for a rich Console, top to bottom: memory per phase, KV cache, time, constants, verdict."""
    out: list[Any] = []
    m, gpu = budget.model, budget.gpu
    ranks = "GPUs" if budget.device == "cuda" else "CPU ranks"
    head = f"{spec} on {site}: {budget.world_size} {ranks}, FSDP shards over {budget.shard_size}"
    out.append(Text(head, style="bold"))
    out.append(Text(f"model: {budget.model_note}" + (f"; {_parameters(m)}" if m else "")))
    if gpu is None:
        out.append(Text("GPU kind unknown (the site has no `gpu` key, or it is a CPU site): memory is shown without a "
                        "capacity, and no time is estimated", style="yellow"))
    if m is None:
        return out

    out += (_phase_tables(budget) + _host_table(budget) + _kv_table(budget) + _time_table(budget)
            + _placements_table(budget))
    out += _constants_table(budget)
    for problem in budget.problems:
        out.append(Text(f"does not fit: {problem}", style="bold red"))
    for warning in budget.warnings:
        out.append(Text(f"warning: {warning}", style="yellow"))
    if gpu is not None and not budget.problems:
        peak = budget.peak
        assert peak is not None
        out.append(Text(f"fits: peak {_gib(peak.total)} of {_gib(gpu.memory_bytes)} GiB ({peak.name})", style="green"))
    return out
