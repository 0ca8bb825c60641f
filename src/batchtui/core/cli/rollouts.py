"""`batchtui rollouts FILE.jsonl`: a sampler's rollouts scored by the local model as a trainer scores them."""

from __future__ import annotations

import argparse
import os
import sys

from ..visible import literal
from .exit_codes import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, error_line, parsed_and_guarded
from .options import add_threads_option, add_trainer_option
from .output import check_report_destination, human_output
from .parser import OneLineParser
from .progress import Progress
from .shared_options import add_shared
from .torch_start import start_torch

DESCRIPTION = (
    "Score rollouts a sampler made (JSONL: prompt_ids, completion_ids and the sampler's logprobs, a line each) with "
    "the local model as a trainer does (one training-mode forward of prompt + completion, logprobs in float32) and "
    "report RL's training-inference mismatch: kl, k3_kl, chi2, perplexities, clip and TIS fractions, percentiles of "
    "|δ|, the worst sequences and tokens. Under torchrun the rollouts are split across the ranks. Exit 0 when every "
    "ratio is exactly 1 (with --max-kl: when the kl is at most X), 1 when not, 2 on bad input, 130 when interrupted "
    "(--resume goes on)."
)


def rollouts_parser(prog: str) -> OneLineParser:
    from ..rollouts.job import DEFAULT_DIST_TIMEOUT_S
    from ..rollouts.plan import DEFAULT_BATCH_TOKENS

    parser = OneLineParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("file", metavar="FILE.jsonl", help="the rollouts, one JSON object a line")
    add_shared(parser, "--model", model={"default": None, "required": True})
    add_shared(parser, "--dtype", "--device", "--trust-remote-code", "--invariant", "--invariant-classes")
    add_shared(parser, "--batch-tokens", batch_tokens={"default": DEFAULT_BATCH_TOKENS})
    parser.add_argument("--records", metavar="OUT.jsonl", help="write one line per sequence as it is scored")
    parser.add_argument("--resume", action="store_true", help="go on from --records: score only what it lacks")
    parser.add_argument("--skip-bad", action="store_true", help="skip faulty lines (counted in the report)")
    said = "the lines' `temperature`, 1 where they give none"
    add_shared(parser, "--temperature", temperature={"default_said": said})
    parser.add_argument(
        "--clip-eps", type=float, default=0.2, metavar="E",
        help="PPO's clip range the clip_fraction counts against: |ratio − 1| > E (default 0.2)",
    )  # fmt: skip
    parser.add_argument(
        "--tis-cap", type=float, default=2.0, metavar="C",
        help="truncated importance sampling's cap: tis_fraction counts ratios above C (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--tis-floor", type=float, metavar="F",
        help="a lower cap: tis_low_fraction counts ratios below F; the masked fractions count outside [F, C]",
    )  # fmt: skip
    parser.add_argument(
        "--max-kl", type=float, metavar="X",
        help="a gate for CI: exit 1 when the kl is above X, 0 when not (however small the mismatch left)",
    )  # fmt: skip
    add_shared(parser, "--quiet")
    parser.add_argument(
        "--dist-timeout", type=float, default=DEFAULT_DIST_TIMEOUT_S, metavar="S",
        help="under torchrun: seconds the ranks wait for each other, to meet and at each round, before ending",
    )  # fmt: skip
    add_trainer_option(parser)
    parser.add_argument(
        "--layout", choices=("grpo", "packed"), default="grpo",
        help="the trainer's batch: grpo (TRL's: prompts left-padded, completions right-padded) or packed (sequences "
        "one after another in rows, positions from 0 each, no padding: verl's and OpenRLHF's) (default: grpo)",
    )  # fmt: skip
    add_threads_option(parser)
    add_shared(parser, "--json")
    return parser


def run_rollouts(argv: list[str], prog: str = "batchtui rollouts") -> int:
    return parsed_and_guarded(rollouts_parser(prog), argv, _rollouts)


def _rollouts(args: argparse.Namespace) -> int:
    from ..settings import Settings

    settings = Settings(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        invariant=args.invariant,
        invariant_classes=args.invariant_classes,
    ).validated()
    check_report_destination(args.json)
    start_torch(args, keep_freed=False)  # (memory flat in the number of batches)
    from ..numbers.importance import Correction
    from ..reports.report import write_json
    from ..reports.rollouts_json import rollouts_json
    from ..rollouts.job import RolloutsJob
    from ..rollouts.ranks import RanksLost
    from ..rollouts.scoring import score_rollouts
    from ..terminal.rollouts_text import format_rollouts, rollouts_notes, rollouts_verdict

    correction = Correction(args.clip_eps, args.tis_cap, args.tis_floor)
    job = RolloutsJob(
        args.file, settings, args.batch_tokens, args.records, args.resume, args.skip_bad, args.dist_timeout,
        args.temperature, correction, args.max_kl, args.trainer, args.layout,
    ).checked()  # fmt: skip
    bar = Progress(args.quiet, unit="seq", leave=True)
    try:
        with bar:
            summary = score_rollouts(job, bar)
    except KeyboardInterrupt:
        print(f"batchtui: interrupted; {_kept(args.records, bar.total)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RanksLost as exc:
        print(f"{error_line(exc)}; {_kept(args.records, bar.total)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if summary is None:  # another rank than the first of a torchrun: rank 0 reports
        return EXIT_OK
    out = human_output(args.json)
    print(format_rollouts(summary, color=out.isatty()), file=out)
    for note in rollouts_notes(summary):
        print(f"note: {note}", file=out)
    print(rollouts_verdict(summary), file=out)
    if args.json:
        write_json(rollouts_json(summary), args.json)
    if summary.kl_within is not None:  # --max-kl decides
        return EXIT_OK if summary.kl_within else EXIT_DIVERGED
    return EXIT_OK if summary.bitwise else EXIT_DIVERGED


def _kept(records: str | None, total: int | None) -> str:
    """What a stopped run leaves: the records written so far, resumable."""
    if not records:
        return "nothing kept (--records keeps each sequence scored)"
    if not os.path.exists(records):
        return "nothing scored yet"
    return f"{_whole_lines(records)} of {total} sequences in {literal(records)}: --resume scores the rest"


def _whole_lines(path: str) -> int:
    """The whole records in the file (its first line is the run's settings, not a record)."""
    with open(path, "rb") as handle:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    return max(0, lines - 1)
