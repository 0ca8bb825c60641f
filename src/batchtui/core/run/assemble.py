"""Measured logits and hidden states of a group of texts (of one chunk or several), turned into one `TextResult`
each, in three steps: `group_rows` gathers the group's real rows, `group_stats` computes their numbers and
`group_results` builds the results.

The texts of a group are measured together: their real rows make one set of rows (the logits read where they
lie, the hidden states concatenated), so each metric is one set of device ops per group instead of per text, and
results reach the host in one copy. The engine closes a group once its rows fill a metrics block, so short texts
share ops (across chunks too) while long texts over a large vocabulary never hold more than one text's extra
logits at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from ..models.loading import LoadedModel
from ..numbers.comparison import (
    Decomposition,
    DeferredColumns,
    ModuleMetrics,
    PositionColumns,
    ReferenceErrors,
    RoutingChange,
    TextResult,
)
from ..numbers.logit_rows import LogitRows
from ..numbers.metrics import HiddenRows, LayerStats, PositionStats, layer_stats, position_stats
from ..settings import Settings
from .backend import BatchedChunk, PassOutput, Recording


@dataclass
class MeasuredText:
    """A text of a chunk with its own passes run, waiting for its numbers."""

    index: int  # among all texts
    line: int  # the line it came from
    text: str
    token_ids: list[int]
    truncated: bool
    padding: int  # padded positions in its batched row
    routing_changes: tuple[RoutingChange, ...]
    decomposition: Decomposition | None = None
    reference: ReferenceErrors | None = None


@dataclass
class GroupRows:
    """A group's batched and single rows at the real positions, in text order: the tensors its numbers are
    computed from (the logits where they lie, the hidden states concatenated)."""

    batched_logits: LogitRows  # [N, V], where they lie
    single_logits: LogitRows
    hidden: list[HiddenRows]  # the recorded modules' hidden states, stacked by width
    lengths: list[int]  # each text's real positions


@dataclass
class GroupStats:
    """A group's numbers, on the host."""

    positions: PositionStats
    modules: LayerStats
    logits_rel_l2: list[float]


def group_rows(parts: list[tuple[BatchedChunk, list[int]]], singles: list[PassOutput]) -> GroupRows:
    """The real positions of the group's batched rows (each chunk's `rows` of it, in text order) and of their single
    runs: the logits as views where they lie, the hidden states gathered, one gather per tensor and chunk."""
    real = [_real_positions(chunk, rows) for chunk, rows in parts]
    ends = list(accumulate(r.numel() for r in real))  # where each part's rows end among the group's
    return GroupRows(
        batched_logits=LogitRows([chunk.real_rows(chunk.output.logits, row) for chunk, rows in parts for row in rows]),
        single_logits=LogitRows([s.logits[0] for s in singles]),
        hidden=_hidden_rows([chunk.output.hidden for chunk, _ in parts], real, ends, singles),
        lengths=[s.logits.shape[1] for s in singles],
    )


def _real_positions(chunk: BatchedChunk, rows: list[int]) -> torch.Tensor:
    """Where the real positions of the chunk's `rows` lie in its [b * T] flattened rows: found in the mask's host
    copy, so that a GPU waits for one copy of them, not for a list index and a nonzero of its own."""
    mask = chunk.host_mask
    chosen = torch.zeros(mask.shape[0], dtype=torch.bool)
    chosen[rows] = True
    real = (mask.bool() & chosen[:, None]).flatten().nonzero().flatten()
    return real.to(chunk.output.logits.device)


def _hidden_rows(
    batched: list[list[torch.Tensor]], real: list[torch.Tensor], ends: list[int], singles: list[PassOutput]
):
    """Each recorded module's real rows, batched (from each chunk's hidden states, `batched[part][module]`) and
    single, gathered straight into one [M, N, H] stack per width and dtype (the metrics reduce each stack at once)."""
    kinds: dict[tuple, list[int]] = {}
    for index, hidden in enumerate(batched[0]):
        kinds.setdefault((hidden.shape[-1], hidden.dtype), []).append(index)
    stacks = []
    for modules in kinds.values():
        first = batched[0][modules[0]]
        in_batch = first.new_empty(len(modules), ends[-1], first.shape[-1])
        for slot, module in enumerate(modules):
            for part, (positions, end) in enumerate(zip(real, ends)):
                out = in_batch[slot, end - positions.numel() : end]
                torch.index_select(batched[part][module].flatten(0, 1), 0, positions, out=out)
        # The single runs' [1, T, H] states module by module, text by text: [1, M * N, H] in one copy, read as
        # [M, N, H] (one op for all modules, which on a GPU is one launch instead of one a module).
        alone = torch.cat([s.hidden[module] for module in modules for s in singles], dim=1).view_as(in_batch)
        stacks.append(HiddenRows(modules, in_batch, alone))
    return stacks


def group_stats(rows: GroupRows, settings: Settings) -> GroupStats:
    """A group's per-position and per-module numbers."""
    positions = position_stats(rows.batched_logits, rows.single_logits, settings.top_k, settings.atol, settings.rtol)
    n_texts = len(rows.lengths)
    segments = torch.repeat_interleave(torch.arange(n_texts), torch.tensor(rows.lengths))  # each row's text
    modules = layer_stats(rows.hidden, rows.lengths)
    return GroupStats(positions, modules, _per_text_rel_l2(positions, segments, n_texts))


def group_results(
    group: list[MeasuredText], stats: GroupStats, loaded: LoadedModel, recording: Recording, settings: Settings
) -> list[TextResult]:
    """One `TextResult` per text of the group, from its numbers, with every token they name decoded."""
    positions = stats.positions
    # The distinct ids: the texts' own as a set, the top-k's from a count per id (several times faster than
    # torch.unique's sort here; a tensor of the texts' ids would cost more to build than the set).
    top_ids = torch.cat([positions.topk_batch_ids.flatten(), positions.topk_single_ids.flatten()])
    own_ids = {i for m in group for i in m.token_ids}
    loaded.decode(list(own_ids.union(torch.bincount(top_ids).nonzero().flatten().tolist())))
    columns = columns_by_text(positions, [len(m.token_ids) for m in group])
    layer_columns = [
        c.tolist() for c in (stats.modules.max_abs_diff, stats.modules.rel_l2, stats.modules.bitwise_equal)
    ]
    results = []
    for group_row, measured in enumerate(group):
        ids = measured.token_ids
        col = columns[group_row]
        max_abs = col["max_abs_diff"]
        largest = max(max_abs)
        # The logits close the curve: a divergence no hooked module shows is placed in the head.
        logits = ModuleMetrics(
            len(recording.modules), "logits", largest, stats.logits_rel_l2[group_row], largest == 0, "logits"
        )
        modules = tuple(
            ModuleMetrics(
                i,
                module.name,
                layer_columns[0][i][group_row],
                layer_columns[1][i][group_row],
                layer_columns[2][i][group_row],
                module.kind,
                module.role,
            )
            for i, module in enumerate(recording.modules)
        ) + (logits,)
        results.append(
            TextResult(
                index=measured.index,
                line=measured.line,
                text=measured.text,
                token_ids=tuple(ids),
                tokens=tuple(map(loaded.token_texts.__getitem__, ids)),
                allclose=all(col["allclose"]),
                max_abs_diff=largest,
                kl_max=max(col["kl"]),
                top1_flips=sum(col["top1_flip"]),
                worst_position=max_abs.index(largest),
                max_abs_diff_ulp=max(col["max_abs_diff_ulp"]),
                columns=PositionColumns.deferring(token_ids=tuple(ids), token_texts=loaded.token_texts, **col),
                layers=tuple(modules[i] for i in recording.layer_indices) + (logits,),
                modules=modules if settings.modules else (),
                routing_changes=measured.routing_changes,
                padding=measured.padding,
                truncated=measured.truncated,
                decomposition=measured.decomposition,
                reference=measured.reference,
            )
        )
    return results


def columns_by_text(stats, lengths: list[int]) -> list[dict]:
    """Each text's columns: the per-position numbers converted to Python once for the group and cut at the texts'
    lengths, the top-k ones deferred (`DeferredColumns`) until read; keywords of `PositionColumns.deferring`."""
    per_text: list[dict] = [{} for _ in lengths]
    top_k = {}
    for name in PositionColumns.measured():
        column = getattr(stats, name)
        if column.dim() > 1:
            top_k[name] = column
            continue
        values = column.tolist()
        offset = 0
        for text, length in zip(per_text, lengths):
            text[name] = tuple(values[offset : offset + length])
            offset += length
    offset = 0
    for text, length in zip(per_text, lengths):
        text["deferred"] = DeferredColumns(top_k, offset, offset + length)
        offset += length
    return per_text


def _per_text_rel_l2(positions: PositionStats, segments: torch.Tensor, n_texts: int) -> list[float]:
    """||B - S|| / ||S|| of each text's logits, from the per-position sums of squares, summed per text in float64."""
    squares = torch.stack([positions.squared_diff, positions.squared_single]).double()
    diff, single = squares.new_zeros(2, n_texts).index_add_(1, segments, squares)
    return torch.where(single > 0, (diff / single).sqrt(), 0.0).tolist()


def routing_changes(
    chunk: BatchedChunk, row: int, single: PassOutput, recording: Recording
) -> tuple[RoutingChange, ...]:
    """Tokens whose router picked other experts in the batched row than in the single run, per MoE layer."""
    changes = []
    for (layer, name), batched_routes, single_routes in zip(recording.routers, chunk.output.routes, single.routes):
        batched = chunk.real_rows(batched_routes, row).cpu()
        alone = single_routes[0].cpu()
        for position in (batched != alone).any(dim=-1).nonzero().flatten().tolist():
            changes.append(
                RoutingChange(position, layer, name, tuple(batched[position].tolist()), tuple(alone[position].tolist()))
            )
    return tuple(sorted(changes, key=lambda c: (c.position, c.layer)))
