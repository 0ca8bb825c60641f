"""The batch-invariant mode's kernels, one property each: a row's (or an element's) result does not depend on
how many others share the call, through the library where it was measured to keep rows and through
fixed-height tiles where not. Each property is also shown to fail without the mode on a workload where the
library's small-call kernels differ (float32, one row against many)."""

import warnings

import pytest
import torch

from batchtui.core.invariant import rows as invariant_rows
from batchtui.core.invariant.elementwise import TailFreeElementwise, tail_free_length
from batchtui.core.invariant.matmul import RowInvariantMatmuls
from batchtui.core.invariant.mode import outside_the_mode
from batchtui.core.invariant.reduction import RowInvariantReductions

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

HEIGHTS = (1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 64, 100)


@pytest.fixture(params=["measured", "tiles"])
def row_heights(request, monkeypatch):
    """Row kernels as measured on this machine, or forced to fixed-height tiles (the CUDA path)."""
    if request.param == "tiles":
        monkeypatch.setattr(invariant_rows, "_FLOORS", ())
    monkeypatch.setattr(invariant_rows, "_measured", {})
    return request.param


@pytest.fixture
def matmuls(row_heights):
    with RowInvariantMatmuls():
        yield row_heights


@pytest.fixture
def reductions(row_heights):
    with RowInvariantReductions():
        yield row_heights


def _rows_alike(product, a) -> bool:
    """Every row of `product(a[:m])`, for every height m, equals the row computed alone."""
    alone = torch.cat([product(a[i : i + 1]) for i in range(a.shape[0])])
    return all(torch.equal(product(a[:m]), alone[:m]) for m in HEIGHTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_do_not_depend_on_the_call_height(matmuls, dtype):
    torch.manual_seed(0)
    a, weight, bias = torch.randn(100, 257).to(dtype), torch.randn(67, 257).to(dtype), torch.randn(67).to(dtype)
    assert _rows_alike(lambda x: torch.nn.functional.linear(x, weight), a)  # mm
    assert _rows_alike(lambda x: torch.nn.functional.linear(x, weight, bias), a)  # addmm
    assert _rows_alike(lambda x: torch.bmm(x[None], weight.t()[None])[0], a)  # bmm


def _keeps_rows_from(height, product, a) -> bool:
    """The test's own measure: every row of calls of `height` rows or more gets the bits of an `height`-row call."""
    return all(
        torch.equal(product(a[:m])[start : start + height], product(a[start : start + height]))
        for m in range(height, 68)
        for start in (0, m - height)
    )


def _with_cancelling_terms(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`a` with, in every odd row, two large terms whose products with one column of `weight` ([out, in]) cancel
    exactly: a kernel that sums the row in another order shows it even where the result's dtype is narrow."""
    a = a.clone()
    for r in range(1, a.shape[0], 2):
        c, i, j = r % weight.shape[0], r % a.shape[1], (r + 5) % a.shape[1]
        wi, wj = weight[c, i].double().item(), weight[c, j].double().item()
        if wi and wj:
            scale = 2.0 ** (20 - max(0, int(torch.tensor(max(abs(wi), abs(wj))).log2().ceil())))
            a[r, i], a[r, j] = scale * wj, -scale * wi
    return a


def _own_height(product, a) -> int | None:
    try:
        return next((h for h in (1, 2, 4, 8, 16) if _keeps_rows_from(h, product, a)), None)
    except RuntimeError:  # a kernel this CPU lacks
        return None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_linear_layer_takes_the_path_that_keeps_rows_from_the_fewest(dtype, bias, size, monkeypatch):
    """Two ways to a linear layer's rows on CPU, the GEMM library's and oneDNN's inner product on the weight as
    stored, each measured by this test itself. A large weight (past 16 MiB) takes the one that keeps rows from fewer
    rows (the library on a tie) and pads only to that height: where the library keeps rows only from 16, as MKL's
    float32 does on the x86 CPUs measured, a decoding step's row would otherwise be a 16-row GEMM. A small weight
    (a small model's, where a call costs the kernel's fixed cost and MKL's is the least) takes the library
    wherever it keeps rows at all, rather than another kernel for less padding. The rows measured on carry terms
    that cancel, so that a narrow dtype's rounding does not hide another order of summing."""
    monkeypatch.setattr(invariant_rows, "_measured", {})
    monkeypatch.setattr(invariant_rows, "_chosen", {})
    torch.manual_seed(0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    out_features = 96 if size == "small" else (16 << 20) // (256 * itemsize) + 32
    weight = torch.randn(out_features, 256).to(dtype)
    a = _with_cancelling_terms(torch.randn(67, 256).to(dtype), weight)
    b = torch.randn(out_features).to(dtype) if bias else None
    heights = {"library": _own_height(lambda x: torch.addmm(b, x, weight.t()) if bias else torch.mm(x, weight.t()), a)}
    if dtype != torch.float64:  # oneDNN has no float64 kernels: not offered
        heights["onednn"] = _own_height(lambda x: torch.ops.mkldnn._linear_pointwise(x, weight, b, "none", [], ""), a)
    with RowInvariantMatmuls():
        inside = torch.nn.functional.linear(a[:1], weight, b)
    (chosen,) = invariant_rows.chosen_paths()
    floors = [h for h in heights.values() if h is not None]
    if size == "small" and heights["library"] is not None and heights["library"] > min(floors):
        assert (chosen.path, chosen.height) == ("library", heights["library"]), (chosen, heights)
    else:
        assert chosen.height == min(floors, default=None), (chosen, heights)
        if floors:
            assert chosen.path == next(name for name, h in heights.items() if h == min(floors)), (chosen, heights)
    # the bench's table says what was measured: each path's height, but for a path measured only below the chosen
    # one's (it could be taken only for fewer rows), which keeps rows from no fewer
    for name, height in heights.items():
        if name in chosen.unneeded:
            assert chosen.heights[name] is None and (height is None or height >= chosen.height), (name, chosen)
        else:
            assert chosen.heights[name] == height, (name, chosen, heights)
    # oneDNN sums in another order than the library: the same product, not the same bits
    close = {} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(inside, torch.nn.functional.linear(a[:1], weight, b), **close)


def test_without_the_mode_a_row_alone_differs():
    """The property above can fail: float32 GEMM gives one row other bits alone than among many here."""
    torch.manual_seed(0)
    a, weight = torch.randn(100, 257), torch.randn(67, 257)
    assert not _rows_alike(lambda x: torch.nn.functional.linear(x, weight), a)


def test_moe_experts_rows_do_not_depend_on_how_many_tokens_an_expert_got(matmuls):
    torch.manual_seed(0)
    tokens, experts = torch.randn(40, 32).to(torch.bfloat16), torch.randn(4, 32, 24).to(torch.bfloat16)
    offsets = torch.tensor([3, 20, 21, 40], dtype=torch.int32)
    together = torch._grouped_mm(tokens, experts, offs=offsets)
    starts = [0, 3, 20, 21]
    for expert, (start, end) in enumerate(zip(starts, offsets.tolist())):
        for row in range(start, end):
            alone = torch._grouped_mm(
                tokens[row : row + 1], experts, offs=torch.tensor([0] * expert + [1] * (4 - expert), dtype=torch.int32)
            )
            assert torch.equal(together[row], alone[0]), (expert, row)


def test_odd_shapes_keep_their_values_and_layout(matmuls):
    a, b = torch.randn(7, 13), torch.randn(13, 5)
    inside = torch.mm(a, b)
    assert inside.shape == (7, 5) and inside.is_contiguous()
    torch.testing.assert_close(inside, a.double().mm(b.double()).float())
    assert torch.mm(a[:0], b).shape == (0, 5)


def _rms(x):
    return x.float().pow(2).mean(-1, keepdim=True)


ROW_REDUCTIONS = (
    _rms,  # an RMSNorm's
    lambda x: x.sum(-1),
    lambda x: torch.linalg.vector_norm(x, dim=-1),
    lambda x: x.mean((-2, -1)),  # over two trailing dims
)


@pytest.mark.parametrize("width", [1536, 40000])  # 40000: past the CPU's parallel grain for a row alone
def test_reductions_over_a_row_do_not_depend_on_the_call_height(reductions, width):
    torch.manual_seed(0)
    a = torch.randn(100, width).to(torch.bfloat16)
    for reduce in ROW_REDUCTIONS[:3]:
        assert _rows_alike(reduce, a), reduce
    assert _rows_alike(ROW_REDUCTIONS[3], a.view(100, 2, width // 2))


def test_without_the_mode_a_row_s_sum_alone_differs():
    """The property above can fail: a row over the parallel grain is summed in two passes alone and split
    across threads among others."""
    torch.manual_seed(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not _rows_alike(lambda x: x.sum(-1), torch.randn(100, 40000))
    finally:
        torch.set_num_threads(saved)


def test_measuring_inside_the_mode_takes_the_library_s_kernels_and_the_mode_comes_back():
    """The metrics run inside the mode's block but measure with the library's kernels (`outside_the_mode`)."""
    torch.manual_seed(0)
    rows = torch.randn(40, 40000)
    scopes = (RowInvariantMatmuls, RowInvariantReductions, TailFreeElementwise)

    def one_by_one():
        return torch.cat([rows[i : i + 1].sum(-1) for i in range(len(rows))])

    saved = torch.get_num_threads()
    torch.set_num_threads(2)  # a row this long alone is summed otherwise than among others (the test above)
    try:
        library = one_by_one()
        with RowInvariantMatmuls(), RowInvariantReductions(), TailFreeElementwise():
            inside = one_by_one()
            with outside_the_mode():
                paused = one_by_one()
                assert not any(scope.active() for scope in scopes)
            again = one_by_one()
            assert all(scope.active() for scope in scopes)
            among_others = rows.sum(-1)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(paused, library) and torch.equal(again, inside) and torch.equal(inside, among_others)
    assert not torch.equal(inside, library)


def test_other_reductions_and_shapes_are_the_library_s_own(row_heights):
    torch.manual_seed(0)
    x, ints = torch.randn(4, 3, 50), torch.arange(24, dtype=torch.int32).view(4, 6)
    calls = (
        lambda: x.sum(),
        lambda: x.sum(0),  # over the batch
        lambda: x.mean((0, 2)),
        lambda: ints.sum(-1),
        lambda: x.sum(-1, keepdim=True),
        lambda: x.mean(-1, dtype=torch.float64),
        lambda: x.norm(dim=-1, keepdim=True),
        lambda: torch.linalg.vector_norm(x, ord=1, dim=(1, 2)),
        lambda: torch.nn.functional.normalize(x, dim=-1),
        lambda: x[:0].sum(-1),
    )
    outside = [call() for call in calls]
    with RowInvariantReductions():
        inside = [call() for call in calls]
    for got, want in zip(inside, outside):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_element_wise_functions_give_an_element_the_same_bits_wherever_it_sits(threads):
    torch.manual_seed(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # Rows of 100 elements, and of 96 (three float32 steps of two 512-bit vectors, one and a half of bfloat16's)
        for width, dtype in ((100, torch.float32), (96, torch.float32), (96, torch.bfloat16)):
            big = torch.randn(1700, width).to(dtype)
            with TailFreeElementwise():
                for fn in (torch.nn.functional.silu, torch.sigmoid, torch.rsqrt, torch.sin, torch.exp):
                    whole = fn(big.abs() + 0.1)
                    for rows, offset in ((1, 5), (3, 0), (7, 1000), (213, 31)):
                        part = big[offset : offset + rows].abs() + 0.1
                        assert torch.equal(fn(part), whole[offset : offset + rows]), (fn, width, dtype, rows, offset)
    finally:
        torch.set_num_threads(saved)


def test_gelu_is_split_across_threads_from_its_own_grain():
    """ATen splits a GELU call across threads from 16,384 elements, not the 32,768 of other element-wise kernels: a
    [1, 100, 264] float32 call at two threads runs in two shares of 13,200 elements, and a tail lands mid-row unless
    the padding knows it (Gemma 2's tanh GELU, a 100-token text)."""
    torch.manual_seed(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        big = torch.randn(4, 100, 264)
        with TailFreeElementwise():
            for approximate in ("tanh", "none"):
                whole = torch.nn.functional.gelu(big, approximate=approximate)
                for row in range(4):
                    alone = torch.nn.functional.gelu(big[row : row + 1], approximate=approximate)
                    assert torch.equal(alone, whole[row : row + 1]), (approximate, row)
    finally:
        torch.set_num_threads(saved)


def test_tail_free_lengths_cut_into_whole_vector_steps_per_thread():
    for itemsize, step in ((2, 64), (4, 32), (8, 16)):  # two 512-bit vectors of bf16, float32, float64
        for n in (1, 31, 63, 64, 65, 32768, 32769, 70000, 10**6 + 3):
            for threads in (1, 2, 3, 16):
                length = tail_free_length(n, threads, itemsize)
                used = max(1, min(threads, -(-length // 32768)))
                assert length >= n and length % step == 0 and (length // used) % step == 0 and length % used == 0
                assert length < n + step * used  # the least such length


def test_other_threads_get_the_library_s_own_results_while_the_mode_is_on():
    """Kernel registrations are process-wide; the mode's are not: a thread that did not enter it (the app's
    other workers, a baseline measured meanwhile) computes exactly what the library computes."""
    import threading

    torch.manual_seed(0)
    # a weight past 16 MiB: a row alone goes to the kernel that keeps rows from the fewest, not the library's call
    row, weight, x = torch.randn(1, 1100), torch.randn(4200, 1100), torch.randn(5, 100)
    plain = torch.nn.functional.linear(row, weight), torch.nn.functional.silu(x)
    elsewhere = []
    with RowInvariantMatmuls(), TailFreeElementwise():
        inside = torch.nn.functional.linear(row, weight)
        worker = threading.Thread(
            target=lambda: elsewhere.extend([torch.nn.functional.linear(row, weight), torch.nn.functional.silu(x)])
        )
        worker.start()
        worker.join()
    assert not torch.equal(inside, plain[0]), "float32: one row alone takes another kernel than a padded call"
    assert torch.equal(elsewhere[0], plain[0]) and torch.equal(elsewhere[1], plain[1])


def test_a_measurement_made_with_fewer_threads_is_not_used_with_more(monkeypatch):
    """The app's workers run with a core fewer than the main thread, and a library's row blocking depends on
    the thread count: what was measured in a one-thread worker must not decide a two-thread call."""
    import threading

    monkeypatch.setattr(invariant_rows, "_measured", {})
    torch.manual_seed(0)
    a, weight, bias = torch.randn(100, 128), torch.randn(128, 128), torch.randn(128)

    def linear(x):
        return torch.nn.functional.linear(x, weight, bias)

    def in_one_thread():
        torch.set_num_threads(1)
        with RowInvariantMatmuls():
            linear(a[:5])

    threads = torch.get_num_threads()
    worker = threading.Thread(target=in_one_thread)
    worker.start()
    worker.join()
    torch.set_num_threads(2)
    try:
        with RowInvariantMatmuls():
            whole = linear(a)
            assert all(torch.equal(linear(a[:m]), whole[:m]) for m in range(1, 40))
    finally:
        torch.set_num_threads(threads)


def test_a_model_s_linear_layers_compute_their_rows_themselves_in_the_mode_and_only_there():
    """In the mode each nn.Linear of the model computes its rows in its own forward (one call into a kernel, not
    two crossings into Python per product): a row alone gets the bits it gets among any number of others, another
    thread and the time after the mode get the layer's own forward, and nested entries give it back once."""
    import threading

    from batchtui.core.invariant.linear import RowInvariantLinears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(257, 67), torch.nn.Linear(67, 31, bias=False))
    model = model.to(torch.float32)
    a = torch.randn(100, 257)
    plain = model(a[:1])
    elsewhere = []
    with torch.no_grad(), RowInvariantMatmuls(), RowInvariantLinears(model):
        with RowInvariantLinears(model):  # nested: the outer entry keeps the layers' forwards
            pass
        layers = [m for m in model if isinstance(m, torch.nn.Linear)]
        assert all("forward" in vars(layer) for layer in layers)
        assert _rows_alike(model, a)
        assert all(_rows_alike(lambda x, m=m: m(x), torch.randn(100, m.in_features)) for m in layers)
        with RowInvariantMatmuls.paused():
            paused = model(a[:1])
        worker = threading.Thread(target=lambda: elsewhere.append(model(a[:1])))
        worker.start()
        worker.join()
    assert not any("forward" in vars(m) for m in model)  # the class's own forward again
    assert torch.equal(paused, plain) and torch.equal(elsewhere[0], plain) and torch.equal(model(a[:1]), plain)


@pytest.mark.parametrize("floors", [(1, 2, 4, 8, 16), ()])
def test_a_path_that_cannot_run_here_is_never_taken(floors, monkeypatch):
    """A kernel this CPU lacks (oneDNN's bf16 without AVX-512) fails when measured: it is said, and never taken,
    not even for the tiles when no path keeps rows."""
    monkeypatch.setattr(invariant_rows, "_FLOORS", floors)
    monkeypatch.setattr(invariant_rows, "_measured", {})
    monkeypatch.setattr(invariant_rows, "_chosen", {})
    torch.manual_seed(0)
    a, b = torch.randn(5, 64), torch.randn(64, 32)

    def lacking(rows):
        raise RuntimeError("could not create a primitive descriptor")

    def library(rows):
        return torch.ops.aten.mm.out(rows, b, out=rows.new_empty((rows.shape[0], 32)))

    got = invariant_rows.by_rows(a, 0, ("test",), lacking, lambda: [("library", library)], name="lacking")
    (chosen,) = invariant_rows.chosen_paths()
    assert chosen.path == "library" and chosen.failed == ("lacking",) and chosen.heights["lacking"] is None
    assert (chosen.height is None) == (floors == ())
    torch.testing.assert_close(got, a @ b)


def test_a_measurement_on_one_device_is_not_used_on_another(monkeypatch):
    """A model split across devices (--device-map) has the same shapes on CPU and on an accelerator: a height
    measured on the CPU must not be taken where the library picks kernels per shape (there: fixed-height tiles).
    The other device here is `meta`, which needs no accelerator: like CUDA, it is never measured."""
    monkeypatch.setattr(invariant_rows, "_measured", {})
    monkeypatch.setattr(invariant_rows, "_chosen", {})
    b = torch.randn(64, 32)

    def library(rows):
        return rows @ b.to(rows.device)

    invariant_rows.choose(torch.randn(5, 64), 0, ("test",), library)
    _, elsewhere, _ = invariant_rows.choose(torch.randn(5, 64, device="meta"), 0, ("test",), library)
    assert elsewhere is None  # tiles, whatever the CPU measured
    assert sorted(c.key[5] for c in invariant_rows.chosen_paths()) == ["cpu", "meta"]


def test_a_tall_call_is_made_only_at_heights_checked_its_last_piece_padded_up_where_that_wastes_little():
    heights: list[int] = []

    def twice(rows):
        heights.append(rows.shape[0])
        return rows * 2

    a = torch.randn(1200, 4)
    cases = [  # (rows, floor, ceiling) -> the calls' heights
        ((300, 2, 128), [128, 128, 48]),  # 44 left, padded to 48
        ((129, 8, 128), [128, 8]),  # the last row padded to the floor
        ((40, 4, 32), [32, 8]),  # nothing checked above 32
        ((800, 1, 1024), [768, 32]),  # 1024 would waste 224 of 800
        ((900, 1, 1024), [1024]),  # padded: 124 of 900 is under a quarter
        ((256, 2, 1024), [256]),  # a height checked: as it is
        ((60, 2, 1024), [64]),  # 4 rows of padding
        ((1200, 16, 1024), [1024, 192]),  # the last 176 padded to 192
    ]
    for (m, floor, ceiling), calls in cases:
        heights.clear()
        assert torch.equal(invariant_rows.in_rows(a[:m], 0, twice, floor, ceiling), a[:m] * 2), m
        assert heights == calls, (m, heights)
        assert all(h <= 32 or h in invariant_rows.TALL_HEIGHTS for h in heights)


def test_a_ceiling_above_the_measured_height_is_the_tallest_height_up_to_which_every_one_checked_keeps_rows(
    monkeypatch,
):
    """A path whose rows part in a call of 96 rows keeps 64 (the heights below it checked); one whose rows part only
    at 33 rows keeps every height checked, 33 never being made; one that never parts gets the tallest; a call of more
    than two dims is never made taller than 32; a kind whose checks run out of time keeps what was checked."""
    monkeypatch.setattr(invariant_rows, "_measured", {})
    probe = torch.randn(67, 8)

    def parts_at(height):
        return lambda rows: rows * 2 + (1e-3 if rows.shape[0] == height else 0.0)

    assert invariant_rows._ceiling(probe, 0, parts_at(96), 1) == 64
    assert invariant_rows._ceiling(probe, 0, parts_at(33), 1) == max(invariant_rows.TALL_HEIGHTS)
    assert invariant_rows._ceiling(probe, 0, lambda rows: rows * 2, 1) == max(invariant_rows.TALL_HEIGHTS)
    assert invariant_rows._ceiling(probe[None], 1, lambda rows: rows * 2, 1) == 32
    monkeypatch.setattr(invariant_rows, "_TALL_BUDGET_S", 0.0)
    assert invariant_rows._ceiling(probe, 0, lambda rows: rows * 2, 1) == 48  # (the first check, then time)


def test_a_kernel_registered_for_the_functional_mm_alone_is_measured_where_the_layers_call_it(monkeypatch):
    """A kernel registered for `aten::mm` only (not its out overload) that sums a row another way in calls of 24
    rows or more: where the mode leaves mm to the library (the built-in's products are made only inside its linear
    layers), the layers call that kernel, and the heights their rows are kept from are measured through it, not
    through the out overload the entry's census passes take. A text's logits alone and batched stay bitwise."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from batchtui.core import batch_invariant
    from batchtui.core.models.builtin import builtin_path

    def mm(a, b):
        out = a.new_empty((a.shape[0], b.shape[1]))
        if a.shape[0] < 24:
            return torch.ops.aten.mm.out(a, b, out=out)
        half = a.shape[1] // 2  # two half sums added: a row's rounding is another
        torch.ops.aten.mm.out(a[:, :half], b[:half], out=out)
        return out + torch.ops.aten.mm.out(a[:, half:], b[half:], out=torch.empty_like(out))

    monkeypatch.setattr(invariant_rows, "_measured", {})
    path = builtin_path("tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    texts = ["one two three " * 6, "a b", "x " * 30]
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        library.impl("mm", mm, "CPU")
    try:
        with torch.inference_mode(), batch_invariant(model):
            assert not RowInvariantMatmuls.replaces("mm", "CPU")  # left to the library: the kernel above
            batch = tokenizer(texts, return_tensors="pt", padding=True)
            positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(**batch, position_ids=positions).logits
            singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]
    finally:
        library._destroy()
    for row, single in enumerate(singles):
        assert torch.equal(logits[row, -single.shape[0] :], single), row
