"""Plain-text rendering for terminals: numbers, aligned tables, the check's output."""

from __future__ import annotations

import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from ..numbers.comparison import Comparison, TextResult
from ..visible import columns, literal


def format_float(value: float | None) -> str:
    """A metric in 3 significant digits; "-" where there was nothing to measure (no token)."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"


def format_precise(value: float | None) -> str:
    """A logprob or ratio as the rollouts tables give them: six decimals from 0.0001 to a million, else seven
    significant digits (a tiny ratio is not 0.000000, a logprob of -1e308 not 309 digits); "-" for nothing."""
    if value is None:
        return "-"
    if not math.isfinite(value) or value == 0:
        return str(value) if value != 0 else "0.000000"
    return f"{value:.6f}" if 1e-4 <= abs(value) < 1e6 else f"{value:.7g}"


def counted(n: int, noun: str) -> str:
    """`n` and its noun, plural but for one: "1 top-1 flip", "3 top-1 flips"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def decimals_to_tell_apart(values, least: int = 2, most: int = 6) -> int:
    """The fewest decimals (at least `least`, at most `most`) with which the distinct values among
    `values` all print differently: a near-tie reads 11.1875 vs 11.1882, not 11.19 vs 11.19."""
    distinct = set(values)
    for decimals in range(least, most + 1):
        if len({f"{v:.{decimals}f}" for v in distinct}) == len(distinct):
            return decimals
    return most


def format_columns(header: Sequence[str], rows: Sequence[Sequence[str]], left: AbstractSet[int] = frozenset()) -> str:
    """An aligned table with a rule under the header; columns in `left` are left-aligned."""
    table = [header, *rows]
    widths = [max(columns(row[c]) for row in table) for c in range(len(header))]
    lines = []
    for r, row in enumerate(table):
        cells = [_padded(cell, w, c in left) for c, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if r == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _padded(cell: str, width: int, left: bool) -> str:
    """`cell` filled to `width` terminal columns (by display width: wide characters and combining marks)."""
    fill = " " * (width - columns(cell))
    return cell + fill if left else fill + cell


def _text_row(t: TextResult, comparison: Comparison) -> tuple[str, ...]:
    row: tuple[str, ...] = (
        str(t.line),
        literal(t.text, 32),
        f"{len(t.token_ids)} cut" if t.truncated else str(len(t.token_ids)),
        format_float(t.max_abs_diff),
        f"{t.max_abs_diff_ulp:.3g}",
        format_float(t.kl_max),
        str(t.top1_flips),
        str(t.worst_position),
        "yes" if t.allclose else "NO",
    )
    if comparison.config.get("decompose"):
        d = t.decomposition
        assert d is not None  # measured for every text when asked
        row += (format_float(d.batch_effect), format_float(d.padding_effect))
    if comparison.config.get("reference"):
        r = t.reference
        assert r is not None  # measured for every text when asked
        row += (format_float(r.batched), format_float(r.single))
    return row


def format_table(comparison: Comparison) -> str:
    header: tuple[str, ...] = ("#", "text", "tokens", "max|Δ|", "ulp", "KL max", "flips", "worst pos", "allclose")
    if comparison.config.get("decompose"):
        header += ("batch eff", "pad eff")
    if comparison.config.get("reference"):
        header += ("B-f64", "S-f64")
    rows = [_text_row(t, comparison) for t in comparison.texts]
    return format_columns(header, rows, left={1, 8})


def format_localization(comparison: Comparison) -> str:
    """Where each text's divergence starts, and the growth curve of its worst text to the logits."""
    lines = []
    for t in comparison.texts:
        first = t.first_divergent_module or t.first_divergent_layer
        where = f"first divergent module {module_label(first)}" if first else "every module bitwise equal"
        lines.append(f"text {t.line}: {where}")
        if t.first_op is not None:
            op = t.first_op
            lines.append(f"  first op: {literal(op.words())} (max|Δ| {format_float(op.max_abs_diff)}): {op.cause()}")
        if t.routing_changes:
            lines.append(f"  {describe_routing(t)}")
    worst = max(comparison.texts, key=lambda t: t.max_abs_diff)
    modules = worst.modules or worst.layers
    start = next((i for i, m in enumerate(modules) if not m.bitwise_equal), None)
    if start is not None:
        lines.append(f"growth in text {worst.line} from {module_label(modules[start])} to the logits:")
        rows = [(module_label(m), format_float(m.max_abs_diff), format_float(m.rel_l2)) for m in modules[start:]]
        lines.append(format_columns(("module", "max|Δ|", "rel L2"), rows, left={0}))
    return "\n".join(lines)


def module_label(module) -> str:
    """`model.layers.3.mlp (MLP)`: the real name, and the role where it is known."""
    return f"{module.name} ({module.role})" if module.role else module.name


def describe_routing(text) -> str:
    """The MoE routing changes of one text, in words: a discrete cause, not growth."""
    changes = text.routing_changes
    first = changes[0]
    return (
        f"expert routing changed at {len({c.position for c in changes})} token(s), first at position "
        f"{first.position} in layer {first.layer} ({first.router}): experts {list(first.experts_batched)} "
        f"batched vs {list(first.experts_single)} single. A discrete cause, not growth: from there the "
        "token goes through other experts, so the difference jumps rather than grows"
    )


def verdict(comparison: Comparison) -> str:
    s = comparison.summary
    c = comparison.config
    setup = (
        f"{literal(c['model'])}, {c['dtype']} on {literal(c['device'])}, attn {literal(str(c['attn']))}, "
        f"batch size {c['batch_size']}, "
        f"{c['padding_side']} padding, {c['positions']} positions, atol {c['atol']:g} rtol {c['rtol']:g}"
    )
    judged = verdict_rule(c)
    if s.diverged == 0:
        return f"OK: all {s.texts} texts {judged} (max|Δ| {format_float(s.max_abs_diff)}) [{setup}]"
    return (
        f"DIVERGED: {s.diverged} of {s.texts} texts not {judged}, max|Δ| {format_float(s.max_abs_diff)}, "
        f"{counted(s.top1_flips, 'top-1 flip')} [{setup}]"
    )


def verdict_rule(config: dict) -> str:
    """What a text must be to pass, in words: `bitwise equal` with atol and rtol 0 (`--bitwise`), else `allclose`."""
    return "bitwise equal" if config.get("atol") == 0 and config.get("rtol") == 0 else "allclose"


def format_remedies(outcomes) -> str:
    """Before/after: the baseline, each remedy alone, all together; remedies that cannot act say why."""
    header, rows = remedies_table(outcomes)
    return format_columns(header, rows, left={0, 1, len(header) - 1})


def remedies_table(outcomes) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The remedies' header and rows (the CLI's table, the app's remedies screen), for comparisons (diverged,
    flips) and generation comparisons (continuations that differ, near-ties)."""
    rows = []
    # With --reference: each run's largest distance to float64, batched and single (a remedy must not pay for
    # equality with accuracy).
    reference = any(isinstance(o.comparison, Comparison) and o.comparison.config.get("reference") for o in outcomes)
    for o in outcomes:
        if o.comparison is None:
            rows.append((o.name, "no", "-", "-", "-", "-", *(("-",) * reference), o.note))
            continue
        result = o.comparison
        applied = "baseline" if o.name == "none" else "yes"
        parted, events = _parted_and_events(result)
        bitwise = sum(t.bitwise_equal for t in result.texts)
        numbers = [f"{parted}/{len(result.texts)}", f"{bitwise}/{len(result.texts)}"]
        numbers += [format_float(result.summary.max_abs_diff), str(events)]
        if reference:
            numbers.append(_reference_cell(result))
        rows.append((o.name, applied, *numbers, o.note))
    generation = not isinstance(outcomes[0].comparison, Comparison)
    header = ["differ", "bitwise", "max|Δ|", "near-ties"] if generation else ["diverged", "bitwise", "max|Δ|", "flips"]
    if reference:
        header.append("B/S-f64")
    return ("remedy", "applied", *header, "note"), rows


def _reference_cell(result: Comparison) -> str:
    measured = [t.reference for t in result.texts if t.reference is not None]
    if not measured:
        return "-"
    batched, single = max(r.batched for r in measured), max(r.single for r in measured)
    return f"{format_float(batched)}/{format_float(single)}"


def invariant_tally(result) -> str:
    """The invariant mode's verdict in a few words, for a status line: `all 6 texts bitwise`, `5/6 texts bitwise`."""
    bitwise, total = sum(t.bitwise_equal for t in result.texts), len(result.texts)
    return f"all {total} texts bitwise" if bitwise == total else f"{bitwise}/{total} texts bitwise"


def invariant_verdict(result) -> str:
    """Whether the batch-invariant mode kept its promise on a comparison or a generation comparison: every
    text bitwise equal to its single run, or how many are and where the first other one parts."""
    parted = [t for t in result.texts if not t.bitwise_equal]
    total = len(result.texts)
    if not parted:
        return f"bitwise: all {total} texts equal their single runs"
    return f"bitwise on {total - len(parted)}/{total} texts; text {parted[0].line} parts {parted[0].where_it_parts}"


def _parted_and_events(result) -> tuple[int, int]:
    """(texts that part, flips) for a comparison; (continuations that differ, near-ties) for a generation."""
    s = result.summary
    return (s.diverged, s.top1_flips) if isinstance(result, Comparison) else (s.differ, s.near_ties)


SWEEP_HEADER = ("dtype", "batch", "attn", "padding", "diverged", "max|Δ|", "flips", "error")
GENERATE_SWEEP_HEADER = ("dtype", "batch", "attn", "padding", "differ", "max|Δ|", "near-ties", "error")


def sweep_row(cell) -> tuple[str, ...]:
    """One sweep cell as the CLI table and the app's sweep screen show it ('-' where it could not run)."""
    return (
        cell.dtype,
        str(cell.batch_size),
        cell.attn,
        cell.padding_side,
        _out_of(cell.differ if cell.differ is not None else cell.diverged, cell.texts),
        "-" if cell.max_abs_diff is None else format_float(cell.max_abs_diff),
        _out_of(cell.near_ties if cell.differ is not None else cell.top1_flips),
        cell.error or "",
    )


def _out_of(count: int | None, total: int | None = None) -> str:
    if count is None:
        return "-"
    return str(count) if total is None else f"{count}/{total}"
