"""`batchtui check --from DIR`: run a repro pack's command again on this machine and say, per text, whether its
logits alone and in its batch are the pack's, bit for bit; the environment's differences first."""

from __future__ import annotations

import argparse

from ..reports.report import number
from ..terminal.plain import format_columns, format_float
from ..visible import literal
from .exit_codes import EXIT_DIVERGED, EXIT_OK
from .output import check_report_destination, human_output
from .progress import Progress
from .torch_start import start_torch
from .validators import number_within


def _match_words(match) -> str:
    if match is None:
        return "no logits in the pack"
    if match.bitwise_equal:
        return "bitwise"
    return f"max|Δ| {format_float(match.max_abs_diff)}, {match.flips} flips, from position {match.first_position}"


def _match_json(match) -> dict | None:
    if match is None:
        return None
    return {
        "bitwise_equal": match.bitwise_equal,
        "max_abs_diff": number(match.max_abs_diff),
        "flips": match.flips,
        "first_position": match.first_position,
    }


def check_from_pack(args: argparse.Namespace, given: set[str]) -> int:
    """`given`: the options named on the command line; only `--model` (and with it `--trust-remote-code`)
    changes what the pack runs."""
    from ..reports.pack_reader import choose_model, read_pack
    from ..reports.report import write_json
    from ..run.repro_pack import replay_pack

    number_within(args.repro_max_mb, "--repro-max-mb", 0, 1_000_000)  # (the largest logits file read)
    pack = read_pack(args.from_pack, args.repro_max_mb)
    chosen = choose_model(pack, args.model if "model" in given else None, args.trust_remote_code)
    check_report_destination(args.json)
    start_torch(args)
    with Progress(args.quiet, unit="pass") as bar:
        replay = replay_pack(pack, chosen, bar)
    here, changed = replay.environment, replay.changed
    out = human_output(args.json)
    print(literal(chosen.line), file=out)
    if changed:
        print(f"environment: {len(changed)} differences (the pack's → here)", file=out)
        for name, theirs, ours in changed:
            print(f"  {literal(str(name), 80)}: {literal(str(theirs), 60)} → {literal(str(ours), 60)}", file=out)
    else:
        print(f"environment: the same as the pack's (fingerprint {here['fingerprint']})", file=out)
    rows = [(str(t.line), literal(t.text, 32), _match_words(t.single), _match_words(t.batched)) for t in replay.texts]
    print(format_columns(("#", "text", "alone", "batched"), rows, left={1, 2, 3}), file=out)
    same, compared = replay.reproduced, replay.compared
    print(f"{same} of {compared} texts reproduce the pack's logits bitwise, alone and batched", file=out)
    if args.json:
        write_json(
            {
                "pack": str(pack.path),
                "model": chosen.settings.model,
                "model_is_the_packs": chosen.settings.model == pack.settings.model,
                "environment_differences": [{"field": f, "pack": a, "here": b} for f, a, b in changed],
                "texts": [
                    {
                        "index": t.index,
                        "line": t.line,
                        "text": t.text,
                        "single": _match_json(t.single),
                        "batched": _match_json(t.batched),
                    }
                    for t in replay.texts
                ],  # fmt: skip
                "reproduced": same,
                "compared": compared,
                "environment": here,
            },
            args.json,
        )
    return EXIT_OK if same == compared else EXIT_DIVERGED
