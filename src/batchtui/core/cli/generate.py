"""`batchtui generate`: does batching change the greedy continuation of each text, and from which token?"""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..run.trl_call import check_trl
from .exit_codes import parsed_and_guarded
from .options import add_remedy_option, add_trainer_option, command_parser
from .report_command import ReportKind, add_repro_options, report_command
from .shared_options import add_shared

DESCRIPTION = (
    "Greedy-decode each text alone and inside its left-padded batch with transformers' generate "
    "and report the first step where the continuations part. Exit 0 when every continuation is the same, "
    "1 when any differs, 2 on bad input."
)


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """What `generate` and `sweep --generate` share: how much and from what each text is generated."""
    add_shared(parser, "--max-new-tokens")
    parser.add_argument(
        "--from-embeds", action="store_true", help="generate from inputs_embeds (the original report's path)"
    )


def _add_comparisons(parser: argparse.ArgumentParser) -> None:
    """What `generate` also sets each continuation against."""
    parser.add_argument(
        "--vs-prefill",
        action="store_true",
        help="also set each decode step of the text alone (KV cache) against one forward of the sequence so far",
    )
    parser.add_argument(
        "--vs-trainer",
        action="store_true",
        help="also score each batched continuation as a trainer does (one training-mode forward of prompt + "
        "completion, autograd on) against the logprobs the batched decode gave its tokens: RL's importance ratio",
    )
    add_shared(parser, "--ops")


def run_generate(argv: list[str], prog: str = "batchtui generate") -> int:
    parser = command_parser(prog, DESCRIPTION)
    add_generation_options(parser)
    _add_comparisons(parser)
    add_trainer_option(parser)
    add_shared(parser, "--json", "--quiet")
    add_remedy_option(parser)
    add_repro_options(parser)
    return parsed_and_guarded(parser, argv, lambda args: _generate(args, [*prog.split(), *argv]))


def _generate(args: argparse.Namespace, command_line: list[str]) -> int:
    args.command_line = command_line
    if args.ops and not args.vs_trainer:
        raise InputError("--ops names where the sampler and the trainer part: it needs --vs-trainer")
    if args.trainer != "batchtui":
        if not args.vs_trainer:
            raise InputError("--trainer says how the trainer calls the model: it needs --vs-trainer")
        check_trl()

    def run(texts, settings, lines, sink, progress):
        from ..run.generation_run import generate_and_compare

        return generate_and_compare(
            texts, settings, args.max_new_tokens, args.from_embeds, progress=progress, lines=lines, logits_sink=sink,
            vs_prefill=args.vs_prefill, vs_trainer=args.vs_trainer, ops=args.ops, trainer=args.trainer,
        )  # fmt: skip

    return report_command(args, run, _generation_report)


def _generation_report() -> ReportKind:
    from ..reports.generation_json import generation_json, generation_summary_json
    from ..terminal.generation_text import format_generation_table, generation_verdict

    return ReportKind(
        format_generation_table,
        generation_verdict,
        generation_json,
        generation_summary_json,
        diverged=lambda comparison: bool(comparison.summary.differ),
    )
