"""``hpcppo tools make-model``: the tiny offline model and its arithmetic data. :mod:`hpcppo.tiny` imports torch only
inside the functions that build: a build that is up to date returns at once, without torch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpcppo.errors import ConfigError
from hpcppo.tiny import TinySettings, build_tiny_model_and_data
from hpcppo.tiny.make import check_outputs
from hpcppo.tiny.reward_model import build_tiny_reward_model


def cmd_make_model(args: argparse.Namespace) -> int:
    # Each variant has its own default directories: one build never replaces the other's.
    default_root = Path("artifacts") / f"tiny-{args.variant}"
    args.out = str(default_root / "model") if args.out is None else args.out
    args.data_out = str(default_root / "data") if args.data_out is None else args.data_out
    # The library validates every value (ConfigError, exit 2) and refuses a foreign --out (PathError).
    overrides = {} if args.max_operand is None else {"max_operand": args.max_operand}
    if args.variant != "arith":
        overrides["variant"] = args.variant
        if args.reward_out:
            raise ConfigError("the tiny reward model scores the arith task only; leave it out with --variant tool",
                              key="--reward-out")
    if args.moe:
        overrides |= {"moe_experts": args.experts, "moe_top_k": args.top_k}
    elif (args.experts, args.top_k) != (4, 2):
        raise ConfigError("needs --moe (the dense model has no experts)", key="--experts" if args.experts != 4 else "--top-k")
    # Every setting and every output path before anything is built (a build takes minutes).
    TinySettings.of(seed=args.seed, **overrides)
    check_outputs(args.out, args.data_out or None, args.reward_out or None)
    info = build_tiny_model_and_data(Path(args.out), Path(args.data_out) if args.data_out else None, seed=args.seed,
                                     train_size=args.train_size, val_size=args.val_size, force=args.force, **overrides)
    if args.reward_out:
        info["reward_model"] = build_tiny_reward_model(Path(args.reward_out), seed=args.seed, force=args.force,
                                                       **overrides)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    ws = info["warm_start"]
    print(f"tiny model {args.out}: {info['architecture']}, {info['num_parameters']:,} parameters, "
          f"{'built in ' + format(info['build_seconds'], '.0f') + ' s' if info.get('built') else 'up to date'}")
    print(f"  warm start on held-out prompts: greedy {ws['greedy_accuracy']:.3f}, sampled {ws['sampled_accuracy']:.3f}")
    for split, path in sorted(info.get("data", {}).items()):
        print(f"  {split}: {path}")
    if args.reward_out:
        rm = info["reward_model"]
        print(f"tiny reward model {args.reward_out}: {rm['architecture']}, "
              f"{'built in ' + format(rm['build_seconds'], '.0f') + ' s' if rm['built'] else 'up to date'}; agrees "
              f"with the arith rule on {rm['held_out']['agreement']:.0%} of held-out responses")
    return 0
