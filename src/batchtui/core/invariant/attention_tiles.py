"""Attention in tiles of keys: each tile's scores and weighted values one GEMM of fixed shape, the tiles added one
after another. A key's place in its tile is part of how its terms are summed, so the keys must sit at the same
places in every pass (`ordered_attention` puts the first key of a query's span at place 0, and takes this way only
where each query sees one span of them); a query's rows are computed in calls of one fixed height (`rows.in_rows`),
whatever number of queries the call has (one in a decoding step, hundreds in a prefill)."""

from __future__ import annotations

import torch

from .attention_scan import sum_in_order
from .elementwise import tail_free
from .rows import in_rows

# Keys per tile: a tile's sums are one GEMM's of fixed shape; tiles are added one after another.
TILE = 32


def _tiles(t: torch.Tensor, tiles: int) -> torch.Tensor:
    """[b, hk, kv, d] keys or values, zero-padded to whole tiles: [b * hk * tiles, TILE, d]."""
    b, hk, kv, d = t.shape
    padded = t.new_zeros(b, hk, tiles * TILE, d)
    padded[:, :, :kv] = t
    return padded.view(b * hk * tiles, TILE, d)


def _tiled(t: torch.Tensor, hk: int, tiles: int, fill) -> torch.Tensor:
    """[b, h, q, kv] as [b, hk, tiles, group, q, TILE], the keys past the last tile filled with `fill`."""
    b, h, q, kv = t.shape
    padded = t.new_full((b, h, q, tiles * TILE), fill)
    padded[..., :kv] = t
    return padded.view(b, hk, h // hk, q, tiles, TILE).permute(0, 1, 4, 2, 3, 5)


def _products(rows: torch.Tensor, operand: torch.Tensor) -> torch.Tensor:
    """[n, m, k] @ [n, k, j], the m rows in calls of exactly `tile_rows` rows whatever m is (a shorter call padded,
    a taller one cut): the operands are activations, other in every call, so no height measured on one of them is
    taken for all (a measurement on one pair of operands kept rows from one row where another pair did not)."""

    def library(a: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, operand, out=a.new_empty((a.shape[0], a.shape[1], operand.shape[2])))

    return in_rows(rows, 1, library, None)


def tiled_attention(query, key, value, counts, scale, bias, softcap, sinks, work) -> torch.Tensor:
    """[b, h, q, dv] from [b, h, q, d] queries over [b, hk, kv, d] keys and values, each query seeing the first of
    them (`counts`: how many, [b, h, q]); `bias`: [b, h, q, kv] or None."""
    b, h, q, d = query.shape
    hk, kv, dv = key.shape[1], key.shape[2], value.shape[-1]
    group, tiles = h // hk, -(-kv // TILE)
    m, n = group * q, b * hk * tiles
    # the rows of one key head's GEMM: its group's queries, [b, hk, group * q, d], once per key tile
    rows = query.to(work).reshape(b, hk, m, d)[:, :, None].expand(b, hk, tiles, m, d).reshape(n, m, d)
    keys = _tiles(key.to(work), tiles).transpose(1, 2)  # [n, d, TILE]
    scores = _products(rows, keys).view(b, hk, tiles, group, q, TILE) * scale
    if softcap is not None:
        scores = tail_free(torch.tanh, scores / softcap) * softcap
    if bias is not None:
        scores = scores + _tiled(bias.to(work), hk, tiles, 0.0)
    places = torch.arange(tiles * TILE, device=scores.device).view(tiles, 1, 1, TILE)
    hidden = places >= counts.view(b, hk, 1, group, q, 1)  # [b, hk, tiles, group, q, TILE]
    scores = scores.masked_fill(hidden, float("-inf"))
    top = scores.amax(dim=(2, 5), keepdim=True)  # [b, hk, 1, group, q, 1]: a maximum is exact in any order
    extra = None if sinks is None else sinks.to(work).reshape(1, hk, 1, group, 1, 1)
    if extra is not None:
        top = torch.maximum(top, extra.expand_as(top))
    top = top.masked_fill(torch.isinf(top), 0.0)  # a query that sees nothing: exp(-inf) = 0 everywhere
    weights = tail_free(torch.exp, scores - top)
    # within a tile its one way (a row of TILE, reduced whole), then tile after tile in order (a hidden tile adds 0)
    total = sum_in_order(weights.sum(-1, keepdim=True), 2)  # [b, hk, group, q, 1]
    if extra is not None:
        total = total + tail_free(torch.exp, extra - top)[:, :, 0]
    values = _tiles(value.to(work), tiles)  # [n, TILE, dv]
    parts = _products(weights.reshape(n, m, TILE), values).view(b, hk, tiles, group, q, dv)
    summed = sum_in_order(parts, 2)  # [b, hk, group, q, dv]
    return torch.where(total > 0, summed / total, 0.0).reshape(b, h, q, dv)
