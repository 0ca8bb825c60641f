"""The options every batchtui command shares (DESIGN.md's CLI contract), and what they build."""

from __future__ import annotations

import argparse

from .errors import InputError
from .settings import DEFAULT_ATOL, DEFAULT_MODEL, DEFAULT_RTOL, DTYPES, PADDING_SIDES, POSITION_MODES, Settings
from .texts import DEFAULT_TEXTS, read_texts_file


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2, never a traceback or a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to compare (default: a built-in set)")
    parser.add_argument("--texts-file", metavar="FILE", help="read texts from FILE, one per line")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="built-in name, local path or Hub id (default: tiny)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="default: the checkpoint's dtype")
    parser.add_argument("--device", default="auto", help="cuda, cuda:1, mps, cpu... (default: auto)")
    parser.add_argument(
        "--device-map", metavar="MAP", help="'auto': shard the model across this host's GPUs (needs accelerate)"
    )
    parser.add_argument("--batch-size", type=int, default=8, metavar="N", help="texts per batched pass (default: 8)")
    parser.add_argument("--padding-side", default="left", choices=PADDING_SIDES)
    parser.add_argument("--positions", default="mask", choices=POSITION_MODES, help="position ids (default: mask)")
    parser.add_argument("--attn", metavar="IMPL", help="attn_implementation: sdpa, eager, flash_attention_2...")
    parser.add_argument(
        "--max-tokens", type=int, metavar="N", help="cut longer texts to N tokens, flagged (default: the context)"
    )
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="top tokens kept per position")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"default: {DEFAULT_ATOL:g}")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"default: {DEFAULT_RTOL:g}")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the checkpoint's own Python code")
    parser.add_argument(
        "--layers", action="store_true", help="localize per module: norms, attention, MLP, residual of each layer"
    )
    parser.add_argument(
        "--decompose", action="store_true", help="also run each padded row alone: batch-size vs padding effect"
    )
    parser.add_argument("--reference", action="store_true", help="also run each text alone in float64 on the CPU")


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        device_map=args.device_map,
        batch_size=args.batch_size,
        padding_side=args.padding_side,
        positions=args.positions,
        attn=args.attn,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        atol=args.atol,
        rtol=args.rtol,
        trust_remote_code=args.trust_remote_code,
        modules=args.layers,
        decompose=args.decompose,
        reference=args.reference,
    ).validated()


def texts_from_args(args: argparse.Namespace) -> list[str]:
    """Texts from the command line, then --texts-file; the default set when neither gives any."""
    texts = list(args.texts)
    if args.texts_file:
        texts += read_texts_file(args.texts_file)
        if not texts:
            raise InputError(f"texts file {args.texts_file!r} has no texts")
    return texts or list(DEFAULT_TEXTS)
