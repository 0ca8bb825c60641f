"""A `RolloutsSummary` on the terminal: the metrics, the percentiles of |δ|, histograms of δ and of the ratio
(plotext's bars, where plotext is installed: core runs without it), the worst sequences and tokens, and a verdict."""

from __future__ import annotations

from ..numbers.rollouts_summary import Histogram, RolloutsSummary, ScoredToken, WorstSequence
from ..visible import literal, shown_token
from .plain import format_columns, format_float, format_precise
from .trl_parts_text import trl_parts_words

_METRICS = (
    ("max_abs_diff", "max |δ|"),
    ("mean_abs_diff", "mean |δ|"),
    ("ratio_min", "ratio min"),
    ("ratio_max", "ratio max"),
    ("kl", "kl = mean(lr − lt)"),
    ("k3_kl", "k3_kl = mean(ratio − 1 − δ)"),
    ("chi2_token", "chi2_token = mean(ratio²) − 1"),
    ("chi2_seq", "chi2_seq = mean(exp(2 Σδ)) − 1"),
    ("training_ppl", "training_ppl"),
    ("rollout_ppl", "rollout_ppl"),
    ("log_ppl_diff", "log_ppl_diff"),
    ("ppl_ratio", "ppl_ratio = mean(exp(mean lr − mean lt))"),
    ("clip_fraction", "clip_fraction (|ratio − 1| > {clip_eps:g})"),
    ("tis_fraction", "tis_fraction (ratio > {tis_cap:g})"),
    ("tis_low_fraction", "tis_low_fraction (ratio < {tis_floor})"),
    ("masked_token_fraction", "masked_token_fraction (outside [{floor:g}, {tis_cap:g}])"),
    ("masked_seq_fraction", "masked_seq_fraction (exp(Σδ) outside [{floor:g}, {tis_cap:g}])"),
    ("seq_ratio_min", "seq_ratio min = exp(Σδ)"),
    ("seq_ratio_mean", "seq_ratio mean"),
    ("seq_ratio_max", "seq_ratio max"),
    ("ess_token", "ess_token = (Σ ratio)² / (n Σ ratio²)"),
    ("ess_seq", "ess_seq (of the sequences' ratios)"),
)
_BAND_HEADER = ("tokens", "mean |δ|", "max |δ|")
_BREAKDOWN_HEADER = ("sequences", "tokens", "kl", "max |δ|", "clipped", "over the cap")
_BREAKDOWN_ROWS = 20  # rows a breakdown shows on the terminal (the JSON report has them all)


def format_rollouts(summary: RolloutsSummary, color: bool = False, width: int = 72) -> str:
    m = summary.metrics
    parts = [
        f"{m.sequences} sequences, {m.tokens} tokens scored",
        format_columns(("metric", "value"), metric_rows(summary), {0}),
    ]
    for title, histogram in histograms(summary):
        chart = histogram_chart(histogram, title, color, width)
        if chart:
            parts.append(chart)
    for title, column, bands in band_tables(summary):
        parts.append(f"{title}\n" + format_columns((column, *_BAND_HEADER), bands, {0}))
    for title, column, rows in breakdown_tables(summary):
        parts.append(f"{title}\n" + format_columns((column, *_BREAKDOWN_HEADER), rows, {0}))
    if summary.worst_sequences:
        parts.append(
            "worst sequences (by |Σ δ|)\n" + format_columns(SEQUENCE_HEADER, worst_sequence_rows(summary), {4})
        )
    if summary.worst_tokens:
        parts.append("worst tokens (by |δ|)\n" + format_columns(WORST_TOKEN_HEADER, worst_token_rows(summary), {2}))
    if summary.faults:
        listed = "\n".join(f"  {literal(fault)}" for fault in summary.faults)
        parts.append(f"{summary.skipped} faulty lines skipped; the first:\n{listed}")
    return "\n\n".join(parts)


SEQUENCE_HEADER = ("line", "tokens", "Σ δ", "max|δ|", "completion")
TOKEN_HEADER = ("step", "token", "trainer lt", "sampler lr", "δ", "ratio", "top-1")
WORST_TOKEN_HEADER = ("line", *TOKEN_HEADER)


def metric_rows(summary: RolloutsSummary) -> list[tuple[str, str]]:
    """(name, value) of every metric and percentile, in words (the fractions' labels with the run's settings)."""
    m, config = summary.metrics, summary.config
    settings = {
        "clip_eps": config.get("clip_eps", 0.2),
        "tis_cap": config.get("tis_cap", 2.0),
        "tis_floor": config.get("tis_floor"),
        "floor": config.get("tis_floor") or 0.0,
    }
    rows = [
        (label.format(**settings), _number(getattr(m, name), name))
        for name, label in _METRICS
        if name != "tis_low_fraction" or settings["tis_floor"] is not None
    ]
    rows.append(("top1_disagree", "unknown (no top1_ids)" if m.top1_disagree is None else str(m.top1_disagree)))
    rows += [(f"|δ| {name}", format_float(value)) for name, value in summary.abs_diff_percentiles.items()]
    return rows


def band_tables(summary: RolloutsSummary) -> list[tuple[str, str, list[tuple[str, ...]]]]:
    """|δ| by the tokens' place in the completion and by the trainer's entropy there: (title, the bands' column,
    rows), each band [low, high) as `low-high` (the last `low+`)."""

    def rows(bands) -> list[tuple[str, ...]]:
        return [
            (f"{b.low:g}+" if b.high == float("inf") else f"{b.low:g}-{b.high:g}", str(b.tokens),
             format_float(b.mean_abs_diff), format_float(b.max_abs_diff))
            for b in bands
        ]  # fmt: skip

    tables = []
    if summary.by_position:
        tables.append(("|δ| by the token's step in its completion (from 0)", "steps", rows(summary.by_position)))
    if summary.by_entropy:
        tables.append(("|δ| by the trainer's entropy at the token (nats)", "entropy", rows(summary.by_entropy)))
    return tables


def breakdown_tables(summary: RolloutsSummary) -> list[tuple[str, str, list[tuple[str, ...]]]]:
    """The metrics by the lines' `step` (in order) and by their `group` (those with the largest max |δ| first), at most
    `_BREAKDOWN_ROWS` rows each: (title, the key's column, rows)."""

    def fraction(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    def row(key, m) -> tuple[str, ...]:
        return (literal(str(key), 24), str(m.sequences), str(m.tokens), _number(m.kl, "kl"),
                _number(m.max_abs_diff, "max_abs_diff"), fraction(m.clip_fraction),
                fraction(m.tis_fraction))  # fmt: skip

    def more(total: int) -> str:
        return f" ({_BREAKDOWN_ROWS} of {total} shown: --json has all)" if total > _BREAKDOWN_ROWS else ""

    tables = []
    if summary.by_step:
        steps = summary.by_step
        rows = [row(key, m) for key, m in steps[:_BREAKDOWN_ROWS]]
        tables.append((f"by step{more(len(steps))}", "step", rows))
    if summary.by_group:
        groups = sorted(summary.by_group, key=lambda item: -(item[1].max_abs_diff or 0.0))
        rows = [row(key, m) for key, m in groups[:_BREAKDOWN_ROWS]]
        tables.append((f"by group, the largest max |δ| first{more(len(groups))}", "group", rows))
    return tables


def histograms(summary: RolloutsSummary) -> list[tuple[str, Histogram]]:
    return [("δ = lt − lr", summary.delta_histogram), ("ratio = exp(δ)", summary.ratio_histogram)]


def worst_sequence_rows(summary: RolloutsSummary, width: int = 40) -> list[tuple[str, ...]]:
    return [
        (str(s.line), str(len(s.tokens)), format_float(s.log_ratio), format_float(s.max_abs_diff),
         literal(s.completion, width))
        for s in summary.worst_sequences
    ]  # fmt: skip


def worst_token_rows(summary: RolloutsSummary) -> list[tuple[str, ...]]:
    return [(str(w.line), *token_row(w.token)) for w in summary.worst_tokens]


def token_row(token: ScoredToken) -> tuple[str, ...]:
    """A token's step, text, both logprobs, δ, ratio and whether the two top-1s agree, in words (`TOKEN_HEADER`)."""
    return (str(token.step), shown_token(token.token, 16), format_precise(token.trainer), format_precise(token.sampler),
            format_float(token.delta), format_precise(token.ratio), _top1(token))  # fmt: skip


def _top1(token: ScoredToken) -> str:
    """The sampler's top-1 where the line gives it, and whether the trainer's is the same (empty where unknown)."""
    said = "" if token.sampler_top1 is None else shown_token(token.sampler_top1, 12)
    if token.top1_disagree is None:
        return said
    return f"{said} (not the trainer's)" if token.top1_disagree else f"{said} (the trainer's too)"


def token_words(sequence: WorstSequence, step: int) -> str:
    """One token of a sequence in a sentence (the app's line under its tokens)."""
    t = sequence.tokens[step]
    return (
        f"line {sequence.line}, step {t.step} of {len(sequence.tokens)}: {shown_token(t.token, 24)} · trainer "
        f"{format_precise(t.trainer)} · sampler {format_precise(t.sampler)} · δ {format_float(t.delta)} · ratio "
        f"{format_precise(t.ratio)}" + ("" if t.sampler_top1 is None else f" · sampler's top-1 {_top1(t)}")
    )


def _number(value: float | None, name: str) -> str:
    if value is None:
        return "-"
    # (values near 1 where the runs agree: a ratio, a perplexity, an effective sample size, to six decimals)
    six_decimals = ("ratio" in name or name.endswith("ppl") or name.startswith("ess")) and abs(value) < 1e4
    return format_precise(value) if six_decimals else format_float(value)


def histogram_chart(histogram: Histogram, title: str, color: bool, width: int) -> str | None:
    """`histogram`'s bars drawn by plotext (None without plotext or counts)."""
    if not histogram.counts:
        return None
    try:
        import plotext as plt
    except ImportError:
        return None
    plt.clear_figure()
    plt.bar(bar_places(histogram), list(histogram.counts), width=1)
    plt.title(f"{title}: tokens per bin")
    plt.xticks(*histogram_ticks(histogram, title.startswith("ratio")))
    plt.plotsize(width, 14)
    chart = plt.build()
    plt.clear_figure()
    return chart if color else plt.uncolorize(chart)


def bar_places(histogram: Histogram) -> list[float]:
    """Where each bin's bar stands: at its index, the edges' values only in the ticks (a ratio's range out to
    1e308 is no number a chart can place bars at)."""
    return [i + 0.5 for i in range(len(histogram.counts))]


def histogram_ticks(histogram: Histogram, ratio: bool) -> tuple[list[float], list[str]]:
    """Ticks at a histogram's ends and at its centre value (δ 0, ratio 1) where the range holds it, else its middle,
    placed by bin (as `histogram_chart` draws), in words (a ratio to six decimals, as the tables give it, but for one
    past 10,000)."""
    edges = histogram.edges
    if not edges:
        return [], []
    bins = len(edges) - 1

    def word(value: float) -> str:
        return format_precise(value) if ratio and value < 1e4 else format_float(value)

    centre = 1.0 if ratio else 0.0
    inside = next((i for i in range(bins) if edges[i] <= centre <= edges[i + 1]), None)
    if inside is None or bins == 0:
        middle, middle_word = float(bins // 2), word(edges[bins // 2])
    else:
        width = edges[inside + 1] - edges[inside]
        middle = inside + ((centre - edges[inside]) / width if width > 0 else 0.0)
        middle_word = word(centre)
    return [0.0, middle, float(bins)], [word(edges[0]), middle_word, word(edges[-1])]


def rollouts_notes(summary: RolloutsSummary) -> list[str]:
    """What a reader needs besides the numbers: what the mode removed, with `--invariant`; the temperature scored at,
    where it is not 1; a truncated sampler."""
    notes = [] if summary.batch_noise is None else [_mode_removed(summary)]
    if summary.trl_parts is not None:
        notes.append(trl_parts_words(summary.trl_parts, "the first batch's"))
    if summary.masked_tokens:
        notes.append(
            f"{summary.masked_tokens} tokens the lines' masks leave out (not the sampler's choice) were scored with "
            "the rest and not counted"
        )
    temperature = summary.config.get("temperature", 1.0)
    if temperature not in (None, 1.0):
        notes.append(
            f"scored at temperature {temperature:g}: log_softmax(logits / {temperature:g}), as TRL and verl do; vLLM's "
            "logprobs are of the logits before temperature unless it runs with --logprobs-mode processed_logprobs "
            "(with raw logprobs, score with --temperature 1)"
        )
    top_p, top_k = summary.config.get("top_p") or 1.0, summary.config.get("top_k") or 0
    cuts = ([f"top-p {top_p:g}"] if top_p != 1.0 else []) + ([f"top-k {top_k}"] if top_k else [])
    if cuts:
        cut = " and ".join(cuts)
        notes.append(
            f"sampled with {cut}: the sampler drew from the truncated distribution, the trainer scores the whole "
            "one (as TRL and verl do); vLLM's logprobs are of the whole one too unless it runs with --logprobs-mode "
            "processed_logprobs"
        )
    return notes


def rollouts_verdict(summary: RolloutsSummary) -> str:
    m = summary.metrics
    resumed = f" ({summary.resumed} read back from the records)" if summary.resumed else ""
    gate = "" if summary.max_kl is None else _gate(summary)
    if summary.bitwise:
        return f"{m.sequences} sequences{resumed}: every logprob the same bits (every ratio exactly 1, every metric 0)"
    return (
        f"{m.sequences} sequences{resumed}, {m.tokens} tokens: max|δ| {format_float(m.max_abs_diff)}, kl "
        f"{format_float(m.kl)}, ratio {format_precise(m.ratio_min)}-{format_precise(m.ratio_max)}, "
        f"clipped {m.clip_fraction:.1%}, "
        f"over the TIS cap {m.tis_fraction:.1%}{gate}"
    )


def _gate(summary: RolloutsSummary) -> str:
    """`--max-kl`'s word: within it or over it."""
    limit = format_float(summary.max_kl)
    return f"; kl within --max-kl {limit}" if summary.kl_within else f"; kl OVER --max-kl {limit}"


def _mode_removed(summary: RolloutsSummary) -> str:
    """With `--invariant`: the trainer's own batch noise the mode removed, beside what is left (the sampler's)."""
    noise, m = summary.batch_noise, summary.metrics
    assert noise is not None
    n = len(noise.lines)
    without = (
        f"without it {noise.moved} of their {noise.tokens} tokens move between their batch and alone (up to "
        f"{format_float(noise.max_abs_diff)})"
        if noise.moved
        else f"without it none of their {noise.tokens} tokens moves between their batch and alone on this machine"
    )
    with_it = "none does" if not noise.moved_in_mode else f"{noise.moved_in_mode} still do (the mode does not hold)"
    left = (
        "nothing is left: every logprob is the sampler's bits"
        if summary.bitwise
        else f"what is left (max|δ| {format_float(m.max_abs_diff)}, kl {format_float(m.kl)}) is the sampler's kernels "
        "against the trainer's: the mode makes the trainer's logprobs independent of their batch, it does not change "
        "a server's"
    )
    return (
        f"the batch-invariant mode removed the trainer's own batch noise: of the first batch's {n} sequences "
        f"scored again, {without}; with it {with_it}. {left[0].upper()}{left[1:]}"
    )
