"""An `EndpointComparison` as the CLI's table, its verdict and JSON (`generate`'s report, served)."""

from __future__ import annotations

from ..reports.report import number, run_json
from ..run.backend import ServedContinuation
from ..terminal.plain import counted, format_columns, format_float
from ..visible import literal
from .result import ContinuationSplit, EndpointComparison, ServedText, batch_ceiling


def _verdict_word(split: ContinuationSplit | None) -> str:
    """`same` (tokens and logprobs bitwise), `Δlp X` (the same tokens, logprobs apart by up to X), `split k`."""
    if split is None:
        return "-"
    if split.step is not None:
        return f"split {split.step}"
    return f"Δlp {format_float(split.max_abs_diff)}" if split.logprobs_differ else "same"


def _loaded_word(t: ServedText) -> str:
    """Under load over every round and level: the split shown, or the largest logprob move, or same."""
    if t.split is None or t.split.differs or not t.logprobs_differ:
        return _verdict_word(t.split)
    return f"Δlp {format_float(t.max_abs_diff)}"


def split_at(t: ServedText) -> tuple[str, str]:
    """What each run continues with from the split (alone first): the token where the server names its tokens,
    else the next characters."""
    split, shown = t.split, t.shown_round
    if split is None or split.step is None or t.alone is None or shown is None:  # (a split needs both)
        return "", ""
    step, ours, theirs = split.step, t.alone, t.under_load[shown]
    if ours.steps is not None and theirs.steps is not None:
        words = [steps[step].token if step < len(steps) else "" for steps in (ours.steps, theirs.steps)]
    else:
        words = [c.text[step : step + 10] for c in (ours, theirs)]
    return literal(repr(words[0])), literal(repr(words[1]))


def format_endpoint_table(comparison: EndpointComparison) -> str:
    header: tuple[str, ...] = (
        "#", "text", "generated alone", "alone×2", "under load", "alone →", "load →", "margin", "max|Δlp|", "near-tie"
    )  # fmt: skip
    logprobs = bool(comparison.config.get("logprobs"))
    rows = [_endpoint_row(t, logprobs) for t in comparison.texts]
    if not logprobs:  # margins and Δ need logprobs: no empty columns
        header, rows = header[:7], [row[:7] for row in rows]
    return format_columns(header, rows, left={1, 2, 5, 6, 9})


def _endpoint_row(t: ServedText, logprobs: bool) -> tuple[str, ...]:
    alone, loaded = split_at(t)
    split = t.split
    margin = "" if split is None or split.margin is None else format_float(split.margin)
    near_tie = "" if t.near_tie is None else ("yes" if t.near_tie else "no")
    return (
        str(t.line),
        literal(t.text, 24),
        "-" if t.alone is None else literal(t.alone.text, 22),
        _verdict_word(t.noise),
        _loaded_word(t),
        alone,
        loaded,
        margin,
        format_float(t.max_abs_diff) if logprobs else "",
        near_tie,
    )


def endpoint_verdict(comparison: EndpointComparison) -> str:
    s = comparison.summary
    rounds = comparison.config.get("rounds", 1)
    levels = comparison.config.get("concurrency") or []
    at = f"concurrency {','.join(map(str, levels))}; " if levels else ""
    verdict = f"{s.differ} of {s.texts} continuations differ under load ({at}{rounds} round{'s' * (rounds != 1)})"
    also_alone = sum(bool(t.differs or t.logprobs_differ) and t.noisy for t in comparison.texts)
    if also_alone:
        verdict += f" ({also_alone} of them differ alone too)"
    if s.near_ties:
        verdict += f", {s.near_ties} at a near-tie"
    if s.logprobs_differ:
        moved = max(t.max_abs_diff for t in comparison.texts if t.logprobs_differ)
        verdict += f"; {s.logprobs_differ} more keep their tokens with logprobs apart by up to {format_float(moved)}"
    if len(levels) > 1:
        first = comparison.first_breaking_concurrency
        verdict += "; no level breaks" if first is None else f"; first breaks at concurrency {first}"
    verdict += f"; alone vs alone: {s.alone_differ} of {s.texts} differ"
    if s.alone_differ:
        verdict += (
            f" (the server is nondeterministic by itself: identical requests alone, {rounds + 1} of each, answered "
            f"otherwise; the ladder counts only the other {s.texts - s.alone_differ})"
        )
    if s.measured < s.texts:
        verdict += f"; {s.texts - s.measured} not measured"
    return verdict


def server_batch_line(comparison: EndpointComparison) -> str | None:
    """Per level, the most requests the server ran at once and kept waiting (its metrics); None where it said
    nothing."""
    ladder = [(level.concurrency, level.server) for level in comparison.ladder if level.server is not None]
    if not ladder:
        return None
    each = " · ".join(
        f"{concurrency}: {server.running} running" + (f", {server.waiting} waiting" if server.waiting else "")
        for concurrency, server in ladder
    )
    line = f"the server's own batch per level (its /metrics): {each}"
    full = batch_ceiling(comparison.ladder)
    if full is not None:
        line += f"; from {full.concurrency} in flight it ran no more at once than at the level below: the rest waited"
    return line


def served_checks_lines(comparison: EndpointComparison) -> list[str]:
    """One line per served check that was measured: prefill vs decode, the prefix cache; the server's batch."""
    lines = [line for line in (server_batch_line(comparison),) if line is not None]
    prefills = [t.prefill_decode for t in comparison.texts if t.prefill_decode is not None]
    if prefills:
        apart = [p for p in prefills if p.first_differing_step is not None]
        lines.append(
            f"prefill vs decode: {len(prefills) - len(apart)} of {len(prefills)} continuations bitwise"
            + (f", {len(apart)} apart by up to {format_float(max(p.max_abs_diff for p in apart))} in logprob"
               if apart else "")
        )  # fmt: skip
    locals_ = [t.served_vs_local for t in comparison.texts if t.served_vs_local is not None]
    if locals_ and not any(v.steps for v in locals_):
        lines.append("served vs local: nothing compared (the server's continuations hold no token)")
    elif locals_:
        side = comparison.config["local"]
        mode = ", invariant mode" if side["invariant"] else ""
        lines.append(
            f"served vs local ({literal(side['model'], 40)}, {side['dtype']}{mode}): max|Δlp| "
            f"{format_float(max(v.max_abs_diff for v in locals_))}, mean "
            f"{format_float(sum(v.mean_abs_diff * v.steps for v in locals_) / max(1, sum(v.steps for v in locals_)))}"
            f" per token, {counted(sum(v.top1_disagree for v in locals_), 'top-1 disagreement')}, importance ratio "
            f"{format_float(min(v.ratio_min for v in locals_))}..{format_float(max(v.ratio_max for v in locals_))}"
        )
    caches = [t.prefix_cache for t in comparison.texts if t.prefix_cache is not None]
    if caches:
        cached = [c.cached_tokens for c in caches if c.cached_tokens is not None]
        span = (
            f"{min(cached)}"
            if cached and min(cached) == max(cached)
            else f"{min(cached, default=0)}-{max(cached, default=0)}"
        )
        hits = f"{span} prompt tokens cached" if cached else "cache hits unknown"
        checked = [(t, t.prefix_cache) for t in comparison.texts if t.prefix_cache is not None]
        split = [t for t, cache in checked if cache.split.differs]
        moved = [(t, cache) for t, cache in checked if cache.split.logprobs_differ]
        words = f"prefix cache, miss vs hit ({hits}): {len(split)} of {len(caches)} continuations split"
        if moved:
            top = max(cache.max_abs_diff for _, cache in moved)
            words += f", {len(moved)} more keep their tokens with logprobs apart by up to {format_float(top)}"
        noisy = sum(t.noisy for t in (*split, *(t for t, _ in moved)))
        if noisy:
            words += f" ({noisy} of them differ alone too: the server's own noise, not the cache's)"
        lines.append(words)
    return lines


def _continuation(c: ServedContinuation | None) -> dict | None:
    if c is None:
        return None
    out: dict[str, object] = {"text": c.text, "finish_reason": c.finish_reason}
    if c.steps is not None:
        out["tokens"] = [s.token for s in c.steps]
        out["logprobs"] = [None if s.logprob is None else number(s.logprob) for s in c.steps]
    return out


def _split(split: ContinuationSplit | None) -> dict | None:
    if split is None:
        return None
    return {
        "differs": split.differs,
        "split_step": split.step,
        "logprob_diffs": [None if d is None else number(d) for d in split.logprob_diffs],
        "max_abs_diff": number(split.max_abs_diff),
        "margin": None if split.margin is None else number(split.margin),
        "near_tie": split.near_tie,
        "top_alone": [[token, number(lp)] for token, lp in split.reference_top],
        "top_under_load": [[token, number(lp)] for token, lp in split.other_top],
    }


def _text(t: ServedText) -> dict:
    shown = t.shown_round
    out = {
        "index": t.index,
        "line": t.line,
        "text": t.text,
        "measured": t.measured,
        "differs": t.differs,
        "split_step": t.split_step,
        "near_tie": t.near_tie,
        "max_abs_diff": number(t.max_abs_diff),
        "alone": _continuation(t.alone),
        "alone_again": _continuation(t.alone_again),
        "under_load": None if shown is None else _continuation(t.under_load[shown]),
        "under_load_round": shown,
        "alone_vs_alone": _split(t.noise),
        "alone_more": [_continuation(c) for c in t.alone_more],
        "noisy": t.noisy,
        "split": _split(t.split),
        "logprobs_differ": t.logprobs_differ,
        "rounds": [
            {"round": r, "differs": s.differs, "split_step": s.step, "logprobs_differ": s.logprobs_differ}
            for r, s in enumerate(t.rounds)
        ],
    }
    prefill, cache = t.prefill_decode, t.prefix_cache
    out["prefill_vs_decode"] = None if prefill is None else {
        "steps": prefill.steps,
        "max_abs_diff": number(prefill.max_abs_diff),
        "first_differing_step": prefill.first_differing_step,
        "diffs": [number(d) for d in prefill.diffs],
    }  # fmt: skip
    out["prefix_cache"] = None if cache is None else {
        "cached_tokens": cache.cached_tokens,
        "differs": cache.differs,
        "split_step": cache.split.step,
        "max_abs_diff": number(cache.max_abs_diff),
    }  # fmt: skip
    local = t.served_vs_local
    out["served_vs_local"] = None if local is None else {
        "steps": local.steps,
        "max_abs_diff": number(local.max_abs_diff),
        "mean_abs_diff": number(local.mean_abs_diff),
        "top1_disagree": local.top1_disagree,
        "ratio_min": number(local.ratio_min),
        "ratio_max": number(local.ratio_max),
        "diffs": [number(d) for d in local.diffs],
    }  # fmt: skip
    if t.prompt is not None:
        out["prompt_positions"] = [
            {"index": i, "max_abs_diff": number(d), "top1_flip": flip}
            for i, (d, flip) in enumerate(zip(t.prompt.max_abs_diff, t.prompt.top1_flip))
        ]
    return out


def endpoint_summary_json(comparison: EndpointComparison) -> dict:
    s = comparison.summary
    return {
        "texts": s.texts,
        "measured": s.measured,
        "differ": s.differ,
        "logprobs_differ": s.logprobs_differ,
        "alone_differ": s.alone_differ,
        "near_ties": s.near_ties,
        "max_abs_diff": number(s.max_abs_diff),
    }


def endpoint_json(comparison: EndpointComparison) -> dict:
    report = run_json(comparison, endpoint_summary_json(comparison), [_text(t) for t in comparison.texts])
    report["levels"] = [
        {
            "concurrency": level.concurrency,
            "rounds": level.rounds,
            "texts_split": level.texts_split,
            "texts_logprobs_differ": level.texts_logprobs_differ,
            "max_abs_logprob_diff": number(level.max_abs_logprob_diff),
            "texts_noisy": level.texts_noisy,
            "server_running": None if level.server is None else level.server.running,
            "server_waiting": None if level.server is None else level.server.waiting,
        }
        for level in comparison.ladder
    ]
    report["first_breaking_concurrency"] = comparison.first_breaking_concurrency
    report["failure"] = comparison.failure
    return report
