"""`batchtui bench` (and `python -m batchtui.core bench`): the comparison's cost and memory against its floor."""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..terminal.plain import format_columns
from .exit_codes import EXIT_OK, EXIT_TARGET_MISSED, parsed_and_guarded
from .from_args import settings_from_args
from .options import add_threads_option
from .output import check_report_destination, human_output
from .parser import OneLineParser
from .progress import Progress
from .shared_options import add_shared
from .torch_start import start_torch

MATMUL_PATHS_SAID = (
    "per kind of call, the path taken, the rows a shorter call is padded to and a taller one cut at (each height up "
    "to it measured); each path measured"
)


def matmul_path_rows(paths: list[dict]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The bench's table of the mode's matmul paths: headers and rows."""

    def keeps(name: str, height: int | None, failed: list[str], unneeded: list[str], floor: int | None) -> str:
        if name in failed:
            return "no kernel here"
        if name in unneeded:
            return f"not below {floor}"
        return "none up to 16" if height is None else f"from {height}"

    def short(path: str, height: int | None, ceiling: int | None) -> str:
        if height is None:
            return "tiles of 16"
        if ceiling is None:
            return "as it is, any height"
        return ("as it is" if height == 1 else f"padded to {height}") + f", cut at {ceiling}"

    # (a layer measured through both of its op's overloads, `invariant.linear`, shows once where the two agree)
    rows = [
        (
            p["op"],
            p["operand"],
            p["path"],
            short(p["path"], p["height"], p["ceiling"]),
            ", ".join(
                f"{name} {keeps(name, height, p['failed'], p.get('unneeded', []), p['height'])}"
                for name, height in p["heights"].items()
            ),
        )
        for p in paths
    ]
    return ("op", "operand", "path", "short calls", "rows kept"), list(dict.fromkeys(rows))


def run_bench(argv: list[str], prog: str = "batchtui bench") -> int:
    parser = OneLineParser(
        prog=prog,
        description="Time compare() against the bare forward passes it compares, and generate mode against "
        "the bare generate calls. Exit 0 when every target holds, 4 when one is missed, 2 on bad input.",
    )
    add_shared(parser, "--model", "--dtype", "--device", "--device-map", "--attn", "--padding-side", "--positions")
    parser.add_argument("--text-count", type=int, default=16, metavar="N", help="how many texts the workload has")
    parser.add_argument("--min-text-tokens", type=int, default=32, metavar="N", help="the workload's shortest text")
    parser.add_argument("--max-text-tokens", type=int, default=128, metavar="N", help="the workload's longest text")
    add_shared(parser, "--batch-size", "--rounds", "--max-new-tokens", "--trust-remote-code", rounds={"default": 5})
    add_threads_option(parser)
    add_shared(parser, "--json", "--quiet")
    return parsed_and_guarded(parser, argv, _bench)


def _bench(args: argparse.Namespace) -> int:
    if args.text_count < 1 or not 1 <= args.min_text_tokens <= args.max_text_tokens:
        raise InputError("--text-count must be at least 1, and 1 <= --min-text-tokens <= --max-text-tokens")
    settings = settings_from_args(args)
    check_report_destination(args.json)
    start_torch(args)
    from ..bench.methods import workload
    from ..bench.phase_clock import PHASES
    from ..bench.rounds import bench
    from ..models.loading import load_model

    texts = workload(load_model(settings).tokenizer, args.text_count, args.min_text_tokens, args.max_text_tokens)
    out = human_output(args.json)
    from ..bench.rollouts_methods import rollouts_methods

    result = bench(
        texts,
        settings,
        args.rounds,
        progress=Progress(args.quiet),
        new_tokens=args.max_new_tokens,
        more=rollouts_methods,
    )
    print(
        f"{result.model} · {result.dtype} on {result.device} · {result.texts} texts, {result.tokens} tokens, "
        f"batch size {result.batch_size} · vocabulary {result.vocab_size} · best of {result.rounds} rounds",
        file=out,
    )
    rows: list[tuple[str, ...]] = [(name, f"{seconds * 1000:.1f}") for name, seconds in result.seconds.items()]
    print(format_columns(("method", "ms (best)"), rows, left={0}), file=out)
    ratios = [(name, f"{value:.3f}", _spread(result.spreads.get(name))) for name, value in result.ratios.items()]
    print(format_columns(("ratio", "value", "rounds from-to"), ratios, left={0}), file=out)
    if result.phases:
        rows = [(name, *(f"{phases[phase] * 1000:.1f}" for phase in PHASES)) for name, phases in result.phases.items()]
        print(format_columns(("forward passes of", "prefill ms", "decode ms"), rows, left={0}), file=out)
    if result.matmul_paths:
        print(f"the mode's matmuls ({MATMUL_PATHS_SAID}):", file=out)
        print(format_columns(*matmul_path_rows(result.matmul_paths), left={0, 1, 2, 3, 4, 5}), file=out)
    if result.library_kernels:
        print(
            "the mode's CPU kernels left to the library (this model calls them only where a batch changes nothing, "
            "or inside the layers the mode computes itself): " + ", ".join(result.library_kernels),
            file=out,
        )
    print(
        "peak memory above the weights: "
        + ", ".join(f"{name} {b / 2**20:.1f} MiB" for name, b in result.peak_bytes.items()),
        file=out,
    )
    rows = [
        (t["name"], f"{t['value']:.3f}", f"{t['limit']:.2f}", "PASS" if t["pass"] else "FAIL") for t in result.targets
    ]
    print(format_columns(("target", "value", "limit", "result"), rows, left={0}), file=out)
    if args.json:
        from ..reports.report import run_environment, write_json

        write_json({**result.as_dict(), "environment": run_environment(settings.as_dict(), texts)}, args.json)
    if not all(t["pass"] for t in result.targets):
        print(
            f"note: a target missed, exit {EXIT_TARGET_MISSED}; timings of {args.rounds} round(s) on a busy or small "
            "machine swing by a tenth or more: run again with more --rounds on a quiet one before reading it as a "
            "regression",
            file=out,
        )
        return EXIT_TARGET_MISSED
    return EXIT_OK


def _spread(spread: tuple[float, float] | None) -> str:
    """A ratio's least and greatest round (its median is the value): how far one run of the bench can be trusted."""
    return "" if spread is None else f"{spread[0]:.3f}-{spread[1]:.3f}"
