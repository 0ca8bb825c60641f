"""`batchtui endpoint`: does what else is in flight change a served model's greedy answer?"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from ..endpoint.client import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT_S
from ..endpoint.result import DEFAULT_LADDER
from ..endpoint.transport import DEFAULT_MAX_ANSWER_MB
from ..errors import InputError
from ..settings import DTYPES, Settings
from ..visible import literal
from .exit_codes import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK, error_line, parsed_and_guarded
from .from_args import texts_from_args
from .options import add_threads_option
from .output import check_report_destination, human_output
from .parser import OneLineParser
from .progress import Progress
from .shared_options import add_shared
from .torch_start import start_torch
from .validators import int_at_least, int_within, levels_argument, number_within

DESCRIPTION = (
    "Greedy-complete each text on an OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI, transformers serve) "
    "alone, twice, and with all texts in flight together, and report where the continuations part. Exit 0 when "
    "every continuation is the same, 1 when any differs, 2 on bad input or a network fault."
)


# Rollouts sampled per prompt at most: a few hundred is what RL groups use; more is a typo, not a group.
MAX_SAMPLES_PER_PROMPT = 1024


def endpoint_parser(prog: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to complete (default: a built-in set)")
    parser.add_argument("--texts-file", metavar="FILE", help="read texts from FILE, one per line")
    add_shared(parser, "--url", url={"required": True})
    parser.add_argument("--model", help="the served model's name (default: the only one the server lists)")
    add_shared(parser, "--max-new-tokens")
    parser.add_argument(
        "--concurrency",
        type=levels_argument,
        metavar="N,N,...",
        help="the ladder: requests in flight under load at each level (default: "
        f"{','.join(map(str, DEFAULT_LADDER))}); with --save-rollouts one level: the requests in flight while sampling "
        "(default 1)",
    )
    add_shared(parser, "--rounds", rounds={"default": 3})
    parser.add_argument(
        "--max-in-flight",
        type=int_at_least(1),
        default=DEFAULT_MAX_IN_FLIGHT,
        metavar="N",
        help="the most requests in flight at once (a thread and a connection each here): a higher level is refused",
    )
    parser.add_argument(
        "--top-logprobs", type=int_at_least(0), default=5, metavar="K", help="logprobs asked per step (0: none)"
    )
    add_shared(parser, "--api-key-env")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds a request may take, connect to answer",
    )
    parser.add_argument(
        "--max-answer-mb",
        type=float,
        default=DEFAULT_MAX_ANSWER_MB,
        metavar="MB",
        help="the largest answer read from the server (after decompression)",
    )
    parser.add_argument(
        "--local",
        metavar="MODEL",
        help="also run each served continuation through this local model (a folder, a cached hub id, a built-in): "
        "its logprobs against the served ones, and RL's importance ratio",
    )
    parser.add_argument("--local-dtype", default="auto", choices=DTYPES, help="the local model's dtype")
    add_shared(parser, "--invariant")  # (the local model: with --local)
    add_threads_option(parser)
    add_shared(parser, "--json", "--quiet")
    sampling = parser.add_argument_group(
        "sampling rollouts", "with --save-rollouts, the server samples rollouts for `batchtui rollouts` instead"
    )
    sampling.add_argument(
        "--save-rollouts",
        metavar="OUT.jsonl",
        help="sample each prompt (TEXT, or --texts-file: one a line, or .jsonl with prompt or prompt_ids a line) and "
        "write the rollouts (prompt and completion ids, the server's logprobs and top-1) to a new file",
    )
    add_shared(sampling, "--temperature", temperature={"default": 1.0})
    sampling.add_argument(
        "--sample-top-p", type=float, default=1.0, metavar="P", help="nucleus sampling: 0 < P <= 1 (1: off)"
    )
    sampling.add_argument(
        "--sample-top-k", type=int, default=0, metavar="K", help="sample among the K likeliest (0: off)"
    )
    sampling.add_argument("--seed", type=int, default=0, help="sample k of prompt i is sampled with seed + i*N + k")
    sampling.add_argument(
        "--samples-per-prompt",
        type=int_within(1, MAX_SAMPLES_PER_PROMPT),
        default=1,
        metavar="N",
        help=f"rollouts sampled per prompt (at most {MAX_SAMPLES_PER_PROMPT})",
    )
    return parser


def run_endpoint(argv: list[str], prog: str = "batchtui endpoint") -> int:
    return parsed_and_guarded(endpoint_parser(prog), argv, _endpoint)


def _endpoint(args: argparse.Namespace) -> int:
    number_within(args.timeout, "--timeout", 0, 86_400, " seconds")
    number_within(args.max_answer_mb, "--max-answer-mb", 0, 4096)
    if args.save_rollouts:
        return _save_rollouts(args)
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    from ..endpoint.result import DEFAULT_LADDER
    from ..endpoint.run import check_ladder_bounds

    levels = sorted(set(args.concurrency or DEFAULT_LADDER))
    check_ladder_bounds(levels, len(numbered.texts), args.rounds, args.max_in_flight)  # before any request
    local = None
    if args.local:
        local = Settings(model=args.local, dtype=args.local_dtype, invariant=args.invariant).validated()
        start_torch(args)
    elif args.invariant:
        raise InputError("--invariant is for the local model: give it with --local MODEL")
    from ..endpoint.client import Endpoint
    from ..endpoint.report import endpoint_json, endpoint_verdict, format_endpoint_table, served_checks_lines
    from ..endpoint.run import measure_endpoint
    from ..reports.report import write_json

    endpoint = Endpoint(
        args.url, args.model, args.api_key_env, args.timeout, args.max_answer_mb, max(levels)
    )  # (its connection pool as large as the ladder's top)
    try:
        model = endpoint.resolve_model()
        bar = Progress(args.quiet)
        result = measure_endpoint(
            endpoint,
            numbered.texts,
            numbered.lines,
            args.max_new_tokens,
            args.concurrency,
            args.rounds,
            args.top_logprobs,
            config={"url": endpoint.url, "model": model},
            progress=lambda done, total: bar(done, total, "requests"),
            local=local,
            max_in_flight=args.max_in_flight,
        )
    finally:
        endpoint.close()
    out = human_output(args.json)
    print(format_endpoint_table(result), file=out)
    for note in result.notes:
        print(f"note: {note}", file=out)
    for line in served_checks_lines(result):
        print(line, file=out)
    print(endpoint_verdict(result), file=out)
    if args.json:
        write_json(endpoint_json(result), args.json)  # with what was measured before a fault, and the fault
    if result.failure is not None:
        print(error_line(InputError(result.failure)), file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_DIVERGED if result.any_differs else EXIT_OK


def _save_rollouts(args: argparse.Namespace) -> int:
    """`--save-rollouts`: sampled rollouts written, a line each, as they come; exit 0, 2 on bad input or a fault."""
    import math

    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise InputError(f"--temperature must be a number at least 0, not {args.temperature:g}")
    if not (math.isfinite(args.sample_top_p) and 0 < args.sample_top_p <= 1):
        raise InputError(f"--sample-top-p must be above 0 and at most 1, not {args.sample_top_p:g}")
    if not 0 <= args.sample_top_k <= 1_000_000:
        raise InputError(f"--sample-top-k must be 0 (off) or a count of tokens, not {args.sample_top_k}")
    levels = list(args.concurrency or [1])
    if len(levels) != 1:
        raise InputError("--save-rollouts samples at one level of requests in flight: --concurrency N")
    if levels[0] > args.max_in_flight:
        raise InputError(f"--concurrency {levels[0]} is above --max-in-flight {args.max_in_flight}")
    if args.local or args.invariant:
        raise InputError("--save-rollouts samples only: score the rollouts with `batchtui rollouts FILE --model M`")
    from ..endpoint.client import Endpoint
    from ..endpoint.rollout_sampling import Prompt, Sampling, read_prompts, save_rollouts

    if args.texts_file and args.texts:
        raise InputError("give texts or --texts-file, not both")
    if args.texts_file:
        prompts = read_prompts(args.texts_file)
        first = next(prompts, None)  # the file opened and its first prompt read before any request
        if first is None:
            raise InputError(f"prompts file {args.texts_file} has no prompts")
        prompts = itertools.chain([first], prompts)
    else:
        prompts = (Prompt(i, text, None) for i, text in enumerate(texts_from_args(args).texts, start=1))
    if os.path.lexists(args.save_rollouts):
        raise InputError(f"{args.save_rollouts} exists: rollouts are written to a new file")
    endpoint = Endpoint(args.url, args.model, args.api_key_env, args.timeout, args.max_answer_mb, args.max_in_flight)
    bar = Progress(args.quiet, unit="rollout", leave=True)
    try:
        model = endpoint.resolve_model()
        with bar:
            count = save_rollouts(
                endpoint, prompts, args.save_rollouts, args.max_new_tokens,
                Sampling(args.temperature, args.sample_top_p, args.sample_top_k), args.seed,
                args.samples_per_prompt, lambda done: bar(done, None), levels[0],
            )  # fmt: skip
    finally:
        endpoint.close()
    print(f"{count} rollouts of {literal(model)} written to {literal(args.save_rollouts)}")
    return EXIT_OK
