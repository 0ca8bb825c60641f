"""The options batchtui's commands share (docs/cli.md's contract): the comparing commands' common set, and the
trainer, threads and remedy options several take."""

from __future__ import annotations

import argparse

from ..experiments.remedies import REMEDIES
from ..threads import THREADS_PER_CORE, most_threads
from .parser import OneLineParser
from .shared_options import add_shared
from .validators import int_within


def command_parser(prog: str, description: str) -> OneLineParser:
    """A command's parser with the options every comparing command takes."""
    parser = OneLineParser(prog=prog, description=description)
    add_common_options(parser)
    return parser


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to compare (default: a built-in set)")
    parser.add_argument("--texts-file", metavar="FILE", help="read texts from FILE, one per line")
    add_shared(parser, "--model", "--dtype", "--device", "--device-map", "--batch-size", "--padding-side")
    add_shared(parser, "--positions", "--attn")
    parser.add_argument(
        "--max-tokens", type=int, metavar="N", help="cut longer texts to N tokens, flagged (default: the context)"
    )
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="top tokens kept per position")
    add_shared(parser, "--atol", "--rtol")
    parser.add_argument(
        "--bitwise",
        action="store_true",
        help="judge bitwise: a text passes only where every logit is the same in both runs (--atol 0 --rtol 0)",
    )
    add_shared(parser, "--trust-remote-code")
    add_threads_option(parser)
    parser.add_argument(
        "--modules", action="store_true", help="localize per module: norms, attention, MLP, residual of each layer"
    )
    # The option's earlier name, kept working for scripts that use it.
    parser.add_argument("--layers", dest="modules", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--decompose", action="store_true", help="also run each padded row alone: batch-size vs padding effect"
    )
    parser.add_argument("--reference", action="store_true", help="also run each text alone in float64 on the CPU")
    add_shared(parser, "--invariant", "--invariant-classes")


def add_trainer_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trainer",
        choices=("batchtui", "trl"),
        default="batchtui",
        help="how the trainer's forward calls the model: batchtui (positions counted from each row's first token, "
        "log_softmax of the float32 logits) or trl (as TRL 1.16's GRPOTrainer does: no position ids, its fused LM "
        "head); with trl the report says which of the two moves the logprobs (default: batchtui)",
    )


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int_within(1, most_threads(), f"{THREADS_PER_CORE} times this machine's cores"),
        metavar="N",
        help="CPU threads for torch's kernels, at most 4 times the cores (default: torch's own, the same on every run "
        "on this machine; the count can change CPU results, so give the same N to runs you compare)",
    )


def add_remedy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remedy",
        action="append",
        default=[],
        metavar="NAME",
        help=f"measure a remedy before/after (repeatable): {', '.join(REMEDIES)}, invariant:CLASS+CLASS (the mode's "
        "parts alone); the exit code then follows the "
        "run with all applied",
    )
