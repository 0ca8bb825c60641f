"""The packed layout (`rollouts --layout packed`): a batch's sequences one after another in rows, no padding between
them, each one's positions counting from 0 again, as verl and OpenRLHF train without padding.

Given position ids and no attention mask, transformers' masks find where a row's positions start again and let each
sequence attend to itself only (`masking_utils`' packed sequences). A model whose masks do not read the positions
(OPT's) would attend across sequences: `check_packs` finds that with one short forward and refuses it in one line.
Rows hold at most `width` tokens (the model's context), so a row's attention stays a sequence's size; a row shorter
than the longest is filled with padding, a sequence of its own that nothing reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compat.transformers import packed_sequences_found
from ..errors import InputError


@dataclass(frozen=True)
class PackedRows:
    ids: torch.Tensor  # [rows, longest row]
    positions: torch.Tensor  # each sequence's from 0; the padding's too
    places: tuple[tuple[int, int], ...]  # each sequence's (row, first place)


def packed_rows(prompts: list[list[int]], completions: list[list[int]], pad_id: int, width: int, device) -> PackedRows:
    """The sequences (prompt + completion) packed in order into rows of at most `width` tokens (a longer sequence is
    a row of its own)."""
    rows: list[list[int]] = [[]]
    positions: list[list[int]] = [[]]
    places = []
    for prompt, completion in zip(prompts, completions, strict=True):
        sequence = prompt + completion
        if rows[-1] and len(rows[-1]) + len(sequence) > width:
            rows.append([])
            positions.append([])
        places.append((len(rows) - 1, len(rows[-1])))
        rows[-1] += sequence
        positions[-1] += range(len(sequence))
    longest = max(map(len, rows))
    for row, places_of_row in zip(rows, positions):
        places_of_row += range(longest - len(row))
        row += [pad_id] * (longest - len(row))
    return PackedRows(torch.tensor(rows, device=device), torch.tensor(positions, device=device), tuple(places))


def completion_logits(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, width: int) -> list:
    """Each completion's [n, V] logits (those before each of its tokens) from one forward of the packed rows."""
    device = next(model.parameters()).device
    packed = packed_rows(prompts, completions, pad_id, width, device)
    logits = model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False).logits
    return [
        logits[row, start + len(prompt) - 1 : start + len(prompt) - 1 + len(completion)]
        for (row, start), prompt, completion in zip(packed.places, prompts, completions)
    ]


def check_packs(model, name: str) -> None:
    """One line (exit 2) unless `model` tells packed sequences apart by their positions: one forward of two short
    sequences in a row, where transformers' mask must find two."""
    device = next(model.parameters()).device
    with torch.inference_mode(), packed_sequences_found() as found:
        try:
            model(
                input_ids=torch.tensor([[1, 2, 3, 1, 2]], device=device),
                position_ids=torch.tensor([[0, 1, 2, 0, 1]], device=device),
                use_cache=False,
            )
        except TypeError:  # a forward that takes no position ids
            found.clear()
    if not any(found):
        raise InputError(
            f"--layout packed: {name} does not tell packed sequences apart by their positions (its masks do not "
            "read them, so each would attend to the ones before it in its row): score it in the padded layout"
        )
