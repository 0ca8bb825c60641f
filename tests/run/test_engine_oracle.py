"""The engine's numbers against the seed's method computed independently in the test."""

import math
from decimal import Decimal

import pytest
import torch
from conftest import MIXED_TEXTS
from helpers.oracle import seed_compare

from batchtui.core import Settings, compare

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


@pytest.mark.parametrize("positions", ["mask", "arange"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_per_text_max_abs_diff_and_allclose_equal_the_oracle(tiny_path, dtype, padding_side, positions):
    settings = Settings(
        model="tiny", dtype=dtype, padding_side=padding_side, positions=positions, batch_size=len(MIXED_TEXTS)
    )
    result = compare(MIXED_TEXTS, settings)
    oracle = seed_compare(tiny_path, MIXED_TEXTS, getattr(torch, dtype), padding_side, positions)
    assert [t.max_abs_diff for t in result.texts] == [o.max_abs_diff for o in oracle]
    assert [t.allclose for t in result.texts] == [o.allclose for o in oracle]
    assert [list(t.token_ids) for t in result.texts] == [o.token_ids for o in oracle]


def test_oracle_cases_include_real_divergence(tiny_path):
    # Guards the test above against passing on all-zero diffs: bf16 padded batches diverge on CPU.
    oracle = seed_compare(tiny_path, MIXED_TEXTS, torch.bfloat16, "left")
    assert any(not o.allclose for o in oracle)
    assert max(o.max_abs_diff for o in oracle) > 0.01


def test_position_metrics_match_direct_computation(tiny_path):
    settings = Settings(model="tiny", dtype="bfloat16", padding_side="right", batch_size=len(MIXED_TEXTS), top_k=3)
    result = compare(MIXED_TEXTS, settings)
    oracle = seed_compare(tiny_path, MIXED_TEXTS, torch.bfloat16, "right")
    text, ref = max(zip(result.texts, oracle), key=lambda pair: pair[1].max_abs_diff)
    b, s = ref.batched.float(), ref.single.float()
    p_s, p_b = torch.softmax(s, -1), torch.softmax(b, -1)
    log_ps, log_pb = torch.log_softmax(s.double(), -1), torch.log_softmax(b.double(), -1)
    kl = (log_ps.exp() * (log_ps - log_pb)).sum(-1)  # the textbook form, in float64
    top2 = s.topk(2, -1).values
    for t, pos in enumerate(text.positions):
        assert pos.max_abs_diff == (b[t] - s[t]).abs().max().item()
        assert pos.mean_abs_diff == pytest.approx((b[t] - s[t]).abs().mean().item(), rel=1e-5)
        assert pos.kl == pytest.approx(max(kl[t].item(), 0.0), rel=2e-4, abs=1e-12)
        assert pos.margin == (top2[t, 0] - top2[t, 1]).item()
        assert pos.top1_flip == (b[t].argmax() != s[t].argmax()).item()
        # Top-k by logit descending, ties by token id ascending.
        assert [tok.id for tok in pos.topk_single] == sorted(range(s.shape[1]), key=lambda i: (-s[t, i], i))[:3]
        assert [tok.id for tok in pos.topk_batch] == sorted(range(b.shape[1]), key=lambda i: (-b[t, i], i))[:3]
        for tok in pos.topk_single:
            assert tok.prob == pytest.approx(p_s[t, tok.id].item(), rel=1e-5)
            assert tok.prob_in_other == pytest.approx(p_b[t, tok.id].item(), rel=1e-5)
        assert pos.allclose == torch.allclose(ref.batched[t], ref.single[t], atol=1e-5, rtol=1e-3)
        # A flip is only possible where the single run's margin is within twice the largest change.
        if pos.top1_flip:
            assert pos.margin <= 2 * pos.max_abs_diff
    assert text.worst_position == max(range(len(text.positions)), key=lambda t: text.positions[t].max_abs_diff)
    assert text.kl_max == max(p.kl for p in text.positions)
    assert not math.isnan(text.kl_max)


def test_rank_in_other_points_at_the_same_token(tiny_path):
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16", positions="arange", top_k=5))
    for text in result.texts:
        for pos in text.positions:
            for tok in pos.topk_batch:
                if tok.rank_in_other is None:
                    assert tok.id not in [s.id for s in pos.topk_single]
                else:
                    assert pos.topk_single[tok.rank_in_other].id == tok.id


def test_kl_is_exact_far_below_float32_noise():
    """A float32-sized difference (|Δ| ~ 1e-6): KL ~ 1e-13, which float32's textbook formula buries under
    ~1e-7 of rounding. Checked against the same sum in extended precision, computed independently."""
    import numpy as np

    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(0)
    single = torch.randn(4, 512, generator=generator) * 4
    batched = single + torch.randn(4, 512, generator=generator) * 2e-6
    ours = position_stats(batched, single, top_k=2, atol=1e-5, rtol=1e-3).kl

    def log_softmax(x):
        top = x.max(-1, keepdims=True)
        return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))

    log_ps = log_softmax(single.numpy().astype(np.longdouble))
    log_pb = log_softmax(batched.numpy().astype(np.longdouble))
    exact = (np.exp(log_ps) * (log_ps - log_pb)).sum(-1)
    assert np.all((exact > 1e-14) & (exact < 1e-11))
    assert ours.tolist() == pytest.approx([float(v) for v in exact], rel=1e-3)


def _kl_in_60_digits(single_row, batched_row) -> "Decimal":
    """KL(softmax S || softmax B) of two rows of floats, each float taken exactly, in 60-digit arithmetic."""
    from decimal import Decimal, localcontext

    with localcontext() as context:
        context.prec = 60
        s = [Decimal(v) for v in single_row]
        b = [Decimal(v) for v in batched_row]
        top_s, top_b = max(s), max(b)
        es = [(v - top_s).exp() for v in s]
        eb = [(v - top_b).exp() for v in b]
        zs, zb = sum(es), sum(eb)
        return sum((e / zs) * ((v - top_s - zs.ln()) - (w - top_b - zb.ln())) for e, v, w in zip(es, s, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kl_matches_60_digit_arithmetic_at_every_position(dtype):
    """At every position of runs in each dtype, with differences from one ulp to many: relative error at most
    1e-3 wherever the true KL exceeds 1e-30, and never 0 where the two distributions differ."""
    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(1)
    single = (torch.randn(24, 64, generator=generator) * 3).to(dtype)
    noise = torch.randn(24, 64, generator=generator) * torch.logspace(-7, -1, 24)[:, None]
    batched = (single.float() + noise).to(dtype)
    batched[0] = single[0]  # identical rows: KL exactly 0
    batched[1] = single[1] + 1  # the same distribution shifted: KL 0 up to the float shift
    ours = position_stats(batched, single, top_k=2, atol=1e-5, rtol=1e-3).kl.double()
    for row in range(24):
        exact = _kl_in_60_digits(single[row].double().tolist(), batched[row].double().tolist())
        if exact > Decimal("1e-30"):
            assert abs(ours[row].item() - float(exact)) <= 1e-3 * float(exact), (row, ours[row].item(), exact)
        if not torch.equal(single[row].double().softmax(-1), batched[row].double().softmax(-1)):
            assert ours[row].item() > 0, row
    assert ours[0].item() == 0.0


def test_allclose_at_the_allowances_edge_is_torchs_for_the_right_rows():
    """A row whose difference sits exactly on torch.isclose's allowance (atol + rtol·|S|) is left to torch.isclose;
    with rows alike bitwise and a row far apart before it, that row is asked about, and no other."""
    from batchtui.core.numbers.metrics import position_stats

    single = torch.ones(5, 64, dtype=torch.bfloat16)
    batched = single.clone()
    batched[1] = 3.0  # far from close
    batched[3, 10] = 1.0078125  # the next bf16 number after 1: |B - S| = 2**-7 = rtol·|S| exactly
    batched[4, 10] = 1.015625  # two steps: past the allowance
    for rtol in (2**-7, 2**-8):
        expected = torch.isclose(batched, single, rtol=rtol, atol=0.0).all(dim=-1)
        assert position_stats(batched, single, top_k=3, atol=0.0, rtol=rtol).allclose.tolist() == expected.tolist()
    assert expected.tolist() == [True, False, True, False, False]  # rtol 2**-8: row 3 is past the allowance too


def test_rows_alike_bitwise_and_rows_that_differ_get_the_numbers_of_their_definitions():
    """One block with every kind of row: alike bitwise (with a tie at the top), one bf16 ulp apart, 0.0 against
    -0.0, and a NaN in both runs at the same place. Each row's numbers checked against their definitions,
    worked out here in float64 row by row."""
    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(3)
    single = (torch.randn(5, 64, generator=generator) * 3).bfloat16()
    single[1, 7] = single[1].max()  # a tie at the top
    single[3, 9] = 0.0
    batched = single.clone()
    batched.view(torch.int16)[2, 5] += 1  # the next bf16 number away from zero
    batched[3, 9] = -0.0
    single[4, 11] = batched[4, 11] = float("nan")
    stats = position_stats(batched, single, top_k=3, atol=1e-5, rtol=1e-3)
    for row in range(5):
        b, s = batched[row].double(), single[row].double()
        assert stats.allclose[row].item() == torch.isclose(batched[row], single[row], atol=1e-5, rtol=1e-3).all().item()
        if row == 4:
            assert stats.max_abs_diff[row].isnan() and not stats.allclose[row]
            continue
        assert stats.max_abs_diff[row].item() == (b - s).abs().max().item()
        assert stats.mean_abs_diff[row].item() == pytest.approx((b - s).abs().mean().item(), rel=1e-6)
        assert stats.top1_flip[row].item() == (_first_by_value_then_id(b, 1) != _first_by_value_then_id(s, 1))
        for ids, probs, logits, x in (
            (stats.topk_single_ids, stats.topk_single_probs, stats.topk_single_logits, s),
            (stats.topk_batch_ids, stats.topk_batch_probs, stats.topk_batch_logits, b),
        ):
            expected = _first_by_value_then_id(x, 3)
            assert ids[row].tolist() == expected
            assert logits[row].tolist() == x[expected].tolist()
            assert probs[row].tolist() == pytest.approx(x.softmax(-1)[expected].tolist(), rel=1e-6)
        assert stats.topk_single_probs_in_batch[row].tolist() == pytest.approx(
            b.softmax(-1)[stats.topk_single_ids[row]].tolist(), rel=1e-6
        )
        assert stats.kl[row].item() == pytest.approx(float(_kl_in_60_digits(s.tolist(), b.tolist())), rel=1e-3, abs=0)
    assert stats.max_abs_diff[[0, 1, 3]].tolist() == [0.0, 0.0, 0.0] and stats.max_abs_diff[2] > 0


def _first_by_value_then_id(x: torch.Tensor, k: int) -> list[int]:
    return sorted(range(len(x)), key=lambda i: (-x[i].item(), i))[:k]


def test_hidden_states_are_compared_bitwise_and_measured_where_they_differ():
    """Per (module, text), as docs/metrics.md has it: bitwise equal or not (identical NaNs alike; 0.0 and -0.0 not,
    though nothing else differs), and where values differ max|hB - hS| and ||hB - hS|| / ||hS|| over the text's
    positions, worked out here in float64."""
    from batchtui.core.numbers.metrics import HiddenRows, layer_stats

    generator = torch.Generator().manual_seed(5)
    single = torch.randn(3, 5, 8, generator=generator).bfloat16()  # 3 modules, 5 positions: text 0 has 2, text 1 has 3
    single[0, 1, 2] = float("nan")
    single[1, 3, 4] = 0.0
    batched = single.clone()
    batched[1, 3, 4] = -0.0
    batched[2, 1] += 0.25
    batched[2, 4, 0] -= 1.0
    stats = layer_stats([HiddenRows([0, 1, 2], batched, single)], [2, 3])
    assert stats.bitwise_equal.tolist() == [[True, True], [True, False], [False, False]]
    assert stats.max_abs_diff[:2].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    for text, rows in enumerate(([0, 1], [2, 3, 4])):
        b, s = batched[2, rows].double(), single[2, rows].double()
        assert stats.max_abs_diff[2, text].item() == (b - s).abs().max().item()
        assert stats.rel_l2[2, text].item() == pytest.approx(((b - s).norm() / s.norm()).item(), rel=1e-6)


def test_a_texts_hidden_state_numbers_do_not_depend_on_the_texts_measured_with_it():
    """Texts are measured in groups (as many as fill a metrics block): a text's per-module numbers are the
    same, digit for digit, beside a short text or a long one."""
    from batchtui.core.numbers.metrics import HiddenRows, layer_stats

    generator = torch.Generator().manual_seed(3)

    def states(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        single = torch.randn(2, n, 64, generator=generator) * torch.logspace(-3, 3, n)[None, :, None]
        return single + 1e-3 * torch.randn(2, n, 64, generator=generator), single

    text, short, long = states(37), states(3), states(300)
    numbers = []
    for other in (short, long):
        batched, single = (torch.cat([part, more], dim=1) for part, more in zip(text, other))
        stats = layer_stats([HiddenRows([0, 1], batched, single)], [37, other[0].shape[1]])
        numbers.append((stats.max_abs_diff[:, 0].tolist(), stats.rel_l2[:, 0].tolist()))
    assert numbers[0] == numbers[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_position_stats_leave_their_inputs_as_they_were(dtype):
    """The metrics work in place on copies of their own only: the logits handed in are the caller's."""
    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(7)
    single = (torch.randn(6, 300, generator=generator) * 4).to(dtype)
    batched = single.clone()
    batched[1:3] += 0.5
    kept = single.clone(), batched.clone()
    stats = position_stats(batched, single, top_k=3, atol=1e-5, rtol=1e-3)
    assert torch.equal(single, kept[0]) and torch.equal(batched, kept[1])
    probs = single.double().softmax(-1)
    expected = probs.gather(-1, stats.topk_single_ids)
    assert stats.topk_single_probs.double().flatten().tolist() == pytest.approx(expected.flatten().tolist(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_a_block_whose_rows_all_differ_gets_the_numbers_those_rows_get_beside_an_alike_one(dtype):
    """Where every row of a block differs, its rows are measured where they lie, not gathered first: the same
    numbers, bit for bit, as the same rows get in a block that also holds a row alike in both runs."""
    from dataclasses import fields

    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(5)
    single = (torch.randn(4, 300, generator=generator) * 4).to(dtype)
    batched = (single.double() + 0.01 * torch.randn(4, 300, generator=generator, dtype=torch.float64)).to(dtype)
    alone = position_stats(batched, single, top_k=3, atol=1e-5, rtol=1e-3)
    beside = position_stats(torch.cat([single[:1], batched]), torch.cat([single[:1], single]), 3, 1e-5, 1e-3)
    assert not alone.allclose.any() and beside.max_abs_diff[0] == 0
    for field in fields(alone):
        assert torch.equal(getattr(alone, field.name), getattr(beside, field.name)[1:]), field.name


def test_a_block_too_large_for_the_heap_to_keep_is_measured_in_halves_with_the_same_numbers():
    """On the CPU a block's widened rows (the single run's and the differing batched ones) stay under glibc's mmap
    threshold, 32 MiB: 1,024 positions over 4,096 tokens, all differing, would fill 32 MiB and are measured as two
    halves, each row with the numbers it gets in a block of its own."""
    from dataclasses import fields

    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(11)
    single = (torch.randn(1024, 4096, generator=generator) * 4).bfloat16()
    batched = (single.float() + 0.05 * torch.randn(1024, 4096, generator=generator)).bfloat16()
    whole = position_stats(batched, single, top_k=3, atol=1e-5, rtol=1e-3)
    pieces = [position_stats(batched[i : i + 100], single[i : i + 100], 3, 1e-5, 1e-3) for i in range(0, 1024, 100)]
    assert not whole.allclose.any()
    for field in fields(whole):
        joined = torch.cat([getattr(piece, field.name) for piece in pieces])
        assert torch.equal(getattr(whole, field.name), joined), field.name


def test_rows_held_in_parts_get_the_numbers_each_text_gets_alone():
    """A group's logits are read where they lie (each text's rows of its chunk, its single run's logits), never
    concatenated: texts of 30 rows over 65,536 tokens, so that blocks (64 rows on the CPU) begin and end inside a
    text and a block whose rows mostly differ is measured in halves. Every number the same, bit for bit, as each
    text's rows get measured alone, and as the concatenated rows get."""
    from dataclasses import fields

    from batchtui.core.numbers.logit_rows import LogitRows
    from batchtui.core.numbers.metrics import position_stats

    generator = torch.Generator().manual_seed(13)
    single = (torch.randn(150, 65536, generator=generator) * 4).bfloat16()
    batched = single.clone()
    batched[[3, 31, 32, 59, 61]] += 0.25  # a few rows differ in the first block, in three texts
    batched[64:128] = (single[64:128].float() * 1.01).bfloat16()  # the second block's rows all differ
    parts = list(zip(batched.split(30), single.split(30)))
    held = position_stats(LogitRows([b for b, _ in parts]), LogitRows([s for _, s in parts]), 3, 1e-5, 1e-3)
    alone = [position_stats(b, s, top_k=3, atol=1e-5, rtol=1e-3) for b, s in parts]
    together = position_stats(batched, single, top_k=3, atol=1e-5, rtol=1e-3)
    assert together.max_abs_diff[[3, 31, 32, 59, 61, 64, 127]].gt(0).all() and together.max_abs_diff[0] == 0
    for field in fields(together):
        expected = torch.cat([getattr(stats, field.name) for stats in alone])
        assert torch.equal(getattr(held, field.name), expected), field.name
        assert torch.equal(getattr(together, field.name), expected), field.name


def test_columns_packed_for_the_host_come_back_as_they_went():
    """Off the CPU a block's columns reach the host packed, their bytes in one copy: each column comes back with its
    values, shape and dtype, whatever order of element sizes they come in (checked here on the CPU, where the
    packing is otherwise skipped)."""
    from batchtui.core.numbers.metrics import packed_to_host

    generator = torch.Generator().manual_seed(17)
    columns = {
        "kl": torch.rand(7, generator=generator),
        "top1_flip": torch.rand(7, generator=generator) > 0.5,
        "topk_single_ids": torch.randint(0, 99, (7, 3), generator=generator),
        "margin": torch.rand(7, generator=generator),
        "topk_batch_ids": torch.randint(0, 99, (7, 3), generator=generator),
        "topk_batch_probs": torch.rand(7, 3, generator=generator),
        "squared_diff": torch.rand(7, generator=generator, dtype=torch.float64),
        "allclose": (torch.rand(7, 3, generator=generator) > 0.5).t()[0],  # a strided view
    }
    host = packed_to_host(columns)
    assert host.keys() == columns.keys()
    for name, values in columns.items():
        assert host[name].dtype == values.dtype and torch.equal(host[name], values), name
