"""The argument parser. Each command names its function as ``"<module>:<function>"`` of a module of
:mod:`hpcppo.cli`, which :func:`hpcppo.cli.dispatch` imports when that command runs."""

from __future__ import annotations

import argparse
from typing import Any

from hpcppo import __version__
from hpcppo.cli.common import DEFAULT_SITE, RUNS_ROOT_HELP


def add_compile_args(p: argparse.ArgumentParser, *, spec: bool = True) -> None:
    if spec:
        p.add_argument("spec", help="experiment spec (TOML)")
    p.add_argument("--site", default=DEFAULT_SITE, help=f"site profile name or path (default: {DEFAULT_SITE})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o actor.lr=1e-6 (repeatable; site keys as site.KEY)")
    p.add_argument("--runs-root", help=RUNS_ROOT_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the job script")
    if spec:
        p.add_argument("--no-check-paths", action="store_true",
                       help="do not check that model and data paths exist (they may exist only on the cluster)")


def add_runs_root_args(p: argparse.ArgumentParser, *,
                        site_help: str = "site whose runs root holds the run") -> None:
    """Where a command finds run directories: the site's ``paths.runs_root`` unless ``--runs-root`` says."""
    p.add_argument("--site", default=DEFAULT_SITE, help=site_help)
    p.add_argument("--runs-root", help=RUNS_ROOT_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcppo",
                                     description="PPO RLHF for LLMs on Slurm clusters, driven by a config compiler.")
    parser.add_argument("--version", action="version", version=f"hpcppo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_commands(sub)
    _add_seeing_commands(sub)
    _add_config_and_tool_commands(sub)
    return parser


def _add_run_commands(sub: Any) -> None:
    """compile, submit, preflight, plan, status, cancel, resume, rollback, watchdog: making and steering runs."""
    p = sub.add_parser("compile", help="validate and resolve a spec, write the run directory, print the job script")
    add_compile_args(p)
    p.set_defaults(func="submit:cmd_compile")

    p = sub.add_parser("submit", help="compile and submit (Slurm through submitit, or the local executor)")
    add_compile_args(p)
    p.add_argument("--dry-run", action="store_true", help="stop before submitting")
    p.add_argument("--wait", action="store_true", help="wait until the job ends and report its state")
    p.add_argument("--follow", action="store_true",
                   help="watch the job live (state, steps, metrics, events), then report as --wait does; Ctrl-C "
                        "detaches and the job goes on")
    p.set_defaults(func="submit:cmd_submit")

    p = sub.add_parser("preflight", help="a short distributed check job through the whole launch path")
    add_compile_args(p, spec=False)
    p.add_argument("--nodes", type=int, default=None, help="nodes to check (default 1)")
    p.add_argument("--dry-run", action="store_true", help="stop before submitting")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="return after submitting")
    p.set_defaults(func="submit:cmd_preflight", wait=True)

    p = sub.add_parser("plan", help="per-GPU memory budget and step-time / GPU-hour estimate of a spec on a site, "
                                    "each constant with its source (docs/plan.md)")
    p.add_argument("spec", help="experiment spec (TOML)")
    p.add_argument("--site", default=DEFAULT_SITE, help=f"site profile name or path (default: {DEFAULT_SITE})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o actor.fsdp.param_offload=true (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func="configure:cmd_plan")

    p = sub.add_parser("status", help="list runs, or one run in detail")
    p.add_argument("run", nargs="?", help="run id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verify", action="store_true",
                   help="with RUN: also check every checkpoint shard's CRC-32 (reads them all; by default sizes and "
                        "the small files only)")
    add_runs_root_args(p, site_help="site whose runs root to list (default: local)")
    p.set_defaults(func="control:cmd_status")

    p = sub.add_parser("cancel", help="cancel a run's job")
    p.add_argument("run", help="run id")
    add_runs_root_args(p)
    p.set_defaults(func="control:cmd_cancel")

    p = sub.add_parser("resume", help="submit a stopped run again (paused, preempted, failed): it continues from "
                                      "its newest committed checkpoint")
    p.add_argument("run", help="run id")
    p.add_argument("--wait", action="store_true", help="wait until the job ends and report its state")
    add_runs_root_args(p)
    p.set_defaults(func="submit:cmd_resume")

    p = sub.add_parser("rollback", help="roll a run back to a committed checkpoint with a lower learning rate: a "
                                        "running job applies it at its next step; a stopped run is resubmitted")
    p.add_argument("run", help="run id")
    p.add_argument("--to", type=int, default=None, metavar="STEP",
                   help="go back to the newest committed checkpoint at or before STEP (default: the newest)")
    p.add_argument("--lr-scale", type=float, default=None, metavar="X",
                   help="multiply the learning rates by X, in (0, 1] (default: 0.5)")
    p.add_argument("--wait", action="store_true", help="wait for the trainer's acknowledgement and print it")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (default: 600)")
    add_runs_root_args(p)
    p.set_defaults(func="control:cmd_rollback")

    p = sub.add_parser("watchdog", help="watchdog tools")
    wsub = p.add_subparsers(dest="watchdog_command", required=True, metavar="SUBCOMMAND")
    q = wsub.add_parser("replay", help="what the watchdog rules would have done over a run's metric log, step by "
                                       "step (tune thresholds on past runs)")
    q.add_argument("run", help="run id")
    q.add_argument("--rules", metavar="FILE",
                   help="TOML file of [[rules]] tables and an optional `defaults = true|false` (default: the rules "
                        "in the run's resolved.toml)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    add_runs_root_args(q)
    q.set_defaults(func="seeing:cmd_watchdog_replay")


def _add_seeing_commands(sub: Any) -> None:
    """runs, follow, logs, plot, metrics, compare: seeing runs, from the HDF5 logs and the run directories."""
    p = sub.add_parser("runs", help="every run under the runs root, newest first: state, step/total, last "
                                    "reward and KL, site, age")
    p.add_argument("--state", action="append", metavar="STATE",
                   help="only runs in this state (RUNNING, PENDING, COMPLETED ...; comma-separated or repeated)")
    p.add_argument("--name", metavar="TEXT", help="only run ids containing TEXT (a glob when it has *?[)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_runs_root_args(p, site_help="site whose runs root to list (default: local)")
    p.set_defaults(func="seeing:cmd_runs")

    p = sub.add_parser("follow", help="watch a run live until its job ends: state, a progress bar over the steps, "
                                      "reward, KL, events (Ctrl-C detaches; the job goes on)")
    p.add_argument("run", help="run id (or run directory)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between looks, > 0 and <= 3600 (default: 1)")
    add_runs_root_args(p)
    p.set_defaults(func="seeing:cmd_follow")

    p = sub.add_parser("samples", help="a step's sample trajectories (trainer.log_samples rows per step): the prompt, "
                                       "then each turn, tool turns marked")
    p.add_argument("run", help="run id (or run directory)")
    p.add_argument("--step", type=int, metavar="N", help="the step (default: the newest with samples)")
    p.add_argument("--json", action="store_true", help="machine-readable output (one object: run, step, samples)")
    add_runs_root_args(p)
    p.set_defaults(func="seeing:cmd_samples")

    p = sub.add_parser("logs", help="print a run's job log: the batch log, one rank's or the watchdog's (-f follows it "
                                    "live)")
    p.add_argument("run", help="run id (or run directory)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=None, metavar="R", help="this rank's log (default: the batch log; "
                                                                           "rank 0's on a local run)")
    which.add_argument("--watchdog", action="store_true",
                       help="the log of the monitor beside the trainer (logs/attempt-<A>/watchdog.log)")
    p.add_argument("--attempt", default=None, metavar="A",
                   help="attempt (local-1745, 4242.0, or a job id: its latest restart; default: the newest)")
    p.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N lines (0: none, with -f only what comes)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended until the job ends")
    add_runs_root_args(p)
    p.set_defaults(func="seeing:cmd_logs")

    p = sub.add_parser("plot", help="metric curves of runs as an image: one panel per metric, runs overlaid, "
                                    "abandoned branches faint, rollbacks/pauses/resumes as vertical lines")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run id, run directory or metric file (.h5)")
    p.add_argument("-m", "--metric", action="append", metavar="NAMES",
                   help="metrics, comma-separated or repeated (default: reward/mean,kl/actor_ref,kl/coef)")
    p.add_argument("--smooth", default=None, metavar="SPEC", help="none, ema:A (e.g. ema:0.9) or window:N")
    p.add_argument("-x", default="step", metavar="AXIS",
                   help="x axis: step, wall time, or tokens processed (default: step)")
    p.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="image file, .png, .pdf or .svg (default: <first run>.png)")
    p.add_argument("--title", default=None, help="a heading above the legend")
    add_runs_root_args(p)
    p.set_defaults(func="seeing:cmd_plot")


def _add_config_and_tool_commands(sub: Any) -> None:
    """export, config, import-verl, tools: models out, configuration in."""
    p = sub.add_parser("export", help="write a checkpoint's actor as a Hugging Face directory (safetensors)")
    p.add_argument("run", help="run id")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest committed)")
    p.add_argument("--out", required=True, help="output directory (must not exist)")
    add_runs_root_args(p)
    p.set_defaults(func="export:cmd_export")

    run_help = "run id, run directory, or metric file (attempt-NNNN.h5)"
    p = sub.add_parser("metrics", help="a run's metric log: summary table, export to Parquet/CSV")
    msub = p.add_subparsers(dest="metrics_command", required=True, metavar="SUBCOMMAND")
    q = msub.add_parser("summary", help="per run: steps done of total, last/smoothed/best of the headline metrics, "
                                        "the first non-finite value, the watchdog's and other events")
    q.add_argument("runs", nargs="+", metavar="RUN", help=run_help)
    q.add_argument("-m", "--metric", action="append", metavar="NAMES",
                   help="also show these metrics (comma-separated or repeated)")
    q.add_argument("--json", action="store_true", help="machine-readable output (a list, one object per run)")
    add_runs_root_args(q)
    q.set_defaults(func="seeing:cmd_metrics_summary")
    q = msub.add_parser("export", help="write a run's metrics as one Parquet or CSV file (atomically), or as "
                                       "TensorBoard event files")
    q.add_argument("runs", nargs=1, metavar="RUN", help=run_help)
    q.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="file to write (replaced if it exists); with --format tensorboard the log directory "
                        "(default: the run's tensorboard/)")
    q.add_argument("--format", default=None, metavar="FORMAT",
                   help="parquet, csv (default: from the suffix of FILE) or tensorboard (needs the tensorboard "
                        "package: pip install 'hpcppo[trackers]')")
    q.add_argument("--all-attempts", action="store_true",
                   help="every row of every attempt, abandoned branches included, with a boolean current column "
                        "(default: the current history, one row per step)")
    q.add_argument("--columns", action="append", metavar="NAMES",
                   help="only these metric columns (comma-separated or repeated; default: all)")
    add_runs_root_args(q)
    q.set_defaults(func="seeing:cmd_metrics_export")

    p = sub.add_parser("compare", help="runs side by side: the config keys that differ (resolved.toml) and the "
                                       "outcome metrics")
    p.add_argument("runs", nargs="+", metavar="RUN", help=run_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_runs_root_args(p)
    p.set_defaults(func="seeing:cmd_compare")

    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    q = csub.add_parser("show", help="the resolved config and where each value came from")
    q.add_argument("spec")
    q.add_argument("--site", default=DEFAULT_SITE)
    q.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--toml", action="store_true", help="print resolved.toml instead of the provenance table")
    q.set_defaults(func="configure:cmd_config_show")
    q = csub.add_parser("explain", help="describe a config key (e.g. actor.clip_ratio_c, site.slurm.partition)")
    q.add_argument("key")
    q.set_defaults(func="configure:cmd_config_explain")

    p = sub.add_parser("import-verl", help="translate a verl command line (python3 -m verl.trainer.main_ppo ...) or "
                                           "verl YAML into an exp.toml; reports every key not translated (docs/verl.md)")
    p.add_argument("input", nargs="?", help="shell script / command line file, verl YAML file, or - for stdin")
    p.add_argument("-o", "--out", default="exp.toml", help="experiment spec to write (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--name", default=None, help="experiment name (default: trainer.experiment_name, else the input's "
                                                "file name)")
    p.add_argument("--watchdog", choices=("off", "defaults"), default="off",
                   help="off (default): none of hpcppo's built-in watchdog rules, as verl has none (the hang monitor "
                        "stays on); defaults: the built-in rules (rollback with lr x 0.5, KL raises ...), listed in "
                        "the file")
    p.add_argument("--table", action="store_true", help="print the verl key mapping (docs/verl.md) and exit")
    p.set_defaults(func="configure:cmd_import_verl")

    _add_tool_commands(sub)


def _add_tool_commands(sub: Any) -> None:
    """tools: the project's own (the tiny offline model and its data)."""
    p = sub.add_parser("tools", help="project tools")
    tsub = p.add_subparsers(dest="tools_command", required=True, metavar="TOOL")
    q = tsub.add_parser("make-model", help="build the tiny offline model, tokenizer and arithmetic data (idempotent: "
                                           "returns at once when the outputs hold a build with the same settings)")
    q.add_argument("--out", default=None,
                   help="model directory, Hugging Face layout (default: artifacts/tiny-arith/model, with --variant "
                        "tool artifacts/tiny-tool/model)")
    q.add_argument("--data-out", default=None,
                   help="directory of train.parquet and val.parquet, '' for none (default: artifacts/tiny-arith/data, "
                        "with --variant tool artifacts/tiny-tool/data)")
    q.add_argument("--seed", type=int, default=0, help="seed of the model, its warm start and the data (default: 0)")
    q.add_argument("--train-size", type=int, default=4096, help="rows of train.parquet (default: 4096)")
    q.add_argument("--val-size", type=int, default=512, help="rows of val.parquet (default: 512)")
    q.add_argument("--max-operand", type=int, default=None, help="task difficulty (default: the library's)")
    q.add_argument("--variant", choices=("arith", "tool"), default="arith",
                   help="arith: a+b answered in one turn; tool: 3-digit a*b answered with a calculator call in the "
                        "compact format (<call>calculator(A*B)</call>), the tokenizer's tool tokens, 256 positions "
                        "(examples/arith-tool.toml) (default: %(default)s)")
    q.add_argument("--moe", action="store_true",
                   help="a mixture-of-experts model instead of the dense Llama: Qwen3-MoE, every layer's MLP "
                        "--experts experts of which --top-k are routed per token (norm_topk_prob, as Qwen3-30B-A3B)")
    q.add_argument("--experts", type=int, default=4, help="with --moe: experts per layer (default: %(default)s)")
    q.add_argument("--top-k", type=int, default=2, help="with --moe: experts routed per token (default: %(default)s)")
    q.add_argument("--reward-out", default="",
                   help="also build a tiny reward model here (LlamaForSequenceClassification, the same tokenizer, "
                        "regressed in seconds onto the arith rule's score: [reward_model] path); '' for none "
                        "(default)")
    q.add_argument("--force", action="store_true", help="rebuild even when up to date")
    q.add_argument("--json", action="store_true", help="print the whole build record (hpcppo_tiny.json) as JSON")
    q.set_defaults(func="tools:cmd_make_model")
