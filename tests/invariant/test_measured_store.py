"""What the mode measures is kept on disk for the next process: the second process measures nothing and gives the
first one's logits, bitwise; a damaged, foreign or stale answer is never trusted; two writers leave a whole file;
a folder that cannot be written costs only the measuring; a kernel registered since is measured anew."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from batchtui.core.invariant import measured_store, rows
from batchtui.core.invariant.compiled_kernels import SWITCH
from batchtui.core.invariant.measured_store import Kept, MeasuredStore, machine_key

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

CHECK = ["-m", "batchtui.core", "check", "--model", "tiny", "--dtype", "bfloat16", "--invariant", "--bitwise"]


def _check(cache, report) -> subprocess.CompletedProcess:
    # (the compiled kernels off: they measure nothing, and every layer of the tiny model in bfloat16 takes them)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), SWITCH: "0"}
    return subprocess.run([sys.executable, *CHECK, "--json", str(report)], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def _logits_of(report) -> list:
    texts = json.loads(report.read_text())["texts"]
    return [(t["max_abs_diff"], t["kl_max"], t["top_k"] if "top_k" in t else None) for t in texts]


@pytest.mark.slow
def test_a_second_process_measures_nothing_and_gives_the_first_one_s_numbers(tmp_path):
    cache = tmp_path / "cache"
    first, second = _check(cache, tmp_path / "1.json"), _check(cache, tmp_path / "2.json")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "measuring the mode's kernels on this machine (once): linear" in first.stderr
    assert "kinds of call of the batch-invariant mode on this machine (kept for later)" in first.stderr
    assert "measuring" not in second.stderr and "measured" not in second.stderr, second.stderr
    (kept,) = (cache / "batchtui" / "invariant").glob("rows-*.json")
    data = json.loads(kept.read_text())
    assert data["machine"] == machine_key() and data["kinds"]
    assert _logits_of(tmp_path / "1.json") == _logits_of(tmp_path / "2.json")
    assert "bitwise: all" in first.stdout and "bitwise: all" in second.stdout


def _answer(floor=1, ceiling=32, path="library") -> Kept:
    return Kept(path, floor, ceiling, {path: floor}, ())


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"format": 1, "machine": {"cpu": "another"}, "kinds": {}}', b"", b"[1, 2]",
     b'{"format": 1, "machine": null, "kinds": {"k": {"path": 5}}}'],
    ids=["damaged", "foreign", "empty", "a-list", "wrong-fields"],
)  # fmt: skip
def test_a_damaged_or_foreign_file_is_ignored_said_once_and_written_anew(tmp_path, content):
    store = MeasuredStore(tmp_path)
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(content)
    assert store.get(("k",)) is None
    notices = store.take_notices()
    assert len(notices) == 1 and "ignored; measured again and written anew" in notices[0], notices
    assert store.get(("other",)) is None and store.take_notices() == []  # once
    store.put(("k",), _answer())
    store.flush()
    fresh = MeasuredStore(tmp_path)
    assert fresh.get(("k",)) == _answer() and fresh.take_notices() == []


def test_a_file_entry_with_a_wrong_field_is_refused_whole(tmp_path):
    store = MeasuredStore(tmp_path)
    store.put(("k",), _answer(floor=4, path="onednn"))
    store.flush()
    data = json.loads(store.path.read_text())
    data["kinds"][repr(("k",))]["floor"] = 2  # not the height its path was measured to keep rows from
    store.path.write_text(json.dumps(data))
    again = MeasuredStore(tmp_path)
    assert again.get(("k",)) is None and len(again.take_notices()) == 1


def test_a_folder_that_cannot_be_written_costs_only_the_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    store = MeasuredStore(blocker / "invariant")  # a folder under a file: never made
    store.put(("k",), _answer())
    store.flush()  # no exception
    assert store.get(("k",)) == _answer() and not (blocker / "invariant").exists()


def test_two_writers_at_once_leave_a_whole_file_with_what_both_measured(tmp_path):
    stores = [MeasuredStore(tmp_path) for _ in range(2)]

    def fill(index: int) -> None:
        for n in range(40):
            stores[index].put((index, n), _answer(floor=1 + n % 4, path=f"p{n % 3}"))
            stores[index].flush()

    threads = [threading.Thread(target=fill, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    merged = MeasuredStore(tmp_path)
    assert all(merged.get((i, n)) is not None for i in range(2) for n in range(40))
    assert merged.take_notices() == []


def test_a_kept_answer_the_kernel_no_longer_gives_is_measured_again(monkeypatch, tmp_path):
    """A file saying a path keeps rows from 1 row up to 32, for a kernel that sums rows otherwise from 24: the check
    on first use finds it out, and the answer is measured anew (and written)."""
    store = MeasuredStore(tmp_path)
    monkeypatch.setattr(rows, "store", store)
    monkeypatch.setattr(rows, "_measured", {})
    monkeypatch.setattr(rows, "_chosen", {})
    weight = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))

    def parts_from_24(a):
        if a.shape[0] < 24:
            return a @ weight
        half = a.shape[1] // 2
        return a[:, :half] @ weight[:half] + a[:, half:] @ weight[half:]

    a = torch.randn(5, 64)
    key = ("test-kept", weight.shape)
    full = (key, a.dtype, a.shape[:0], a.shape[1:], True, "cpu", torch.get_num_threads())
    store.put(rows._stored_key(full), _answer(floor=1, ceiling=32))
    _, floor, ceiling = rows.choose(a, 0, key, parts_from_24)
    assert floor is None or ceiling < 24 or floor >= 24, (floor, ceiling)  # never the stale answer
    assert MeasuredStore(tmp_path).get(rows._stored_key(full)) is None  # (not flushed yet)
    store.flush()
    assert MeasuredStore(tmp_path).get(rows._stored_key(full)).floor == floor


def test_a_kept_answer_the_kernel_still_gives_is_taken_without_measuring(monkeypatch, tmp_path):
    store = MeasuredStore(tmp_path)
    monkeypatch.setattr(rows, "store", store)
    monkeypatch.setattr(rows, "_measured", {})
    monkeypatch.setattr(rows, "_chosen", {})
    measured = []
    real = rows._measure_paths
    monkeypatch.setattr(rows, "_measure_paths", lambda *args: measured.append(1) or real(*args))
    a, b = torch.randn(5, 64), torch.randn(64, 32)
    first = rows.choose(a, 0, ("kept-ok", b.shape), lambda r: torch.mm(r, b))[1:]
    monkeypatch.setattr(rows, "_measured", {})  # another process: only the file
    second = rows.choose(a, 0, ("kept-ok", b.shape), lambda r: torch.mm(r, b))[1:]
    assert first == second and measured == [1]


def test_a_kernel_registered_after_a_first_block_is_measured_anew_and_the_logits_stay_bitwise():
    """A first block measures the library's mm; then a kernel for `aten::mm` that sums rows otherwise from 24 rows is
    registered: the next block measures through it (kept answers were the old kernel's), so a short text alone and
    in a batch of long ones still get the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from batchtui.core import batch_invariant
    from batchtui.core.models.builtin import builtin_path

    path = builtin_path("tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    texts = ["x " * 30, "a b", "one two three " * 6]

    def logits_alone_and_batched():
        with torch.inference_mode(), batch_invariant(model):
            batch = tokenizer(texts, return_tensors="pt", padding=True)
            positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(**batch, position_ids=positions).logits
            singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]
        return [torch.equal(logits[row, -single.shape[0] :], single) for row, single in enumerate(singles)]

    assert all(logits_alone_and_batched())

    def mm(a, b):
        out = a.new_empty((a.shape[0], b.shape[1]))
        if a.shape[0] < 24:
            return torch.ops.aten.mm.out(a, b, out=out)
        half = a.shape[1] // 2
        torch.ops.aten.mm.out(a[:, :half], b[:half], out=out)
        return out + torch.ops.aten.mm.out(a[:, half:], b[half:], out=torch.empty_like(out))

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        library.impl("mm", mm, "CPU")
    try:
        kernels = measured_store.registered_kernels()
        assert all(logits_alone_and_batched())
        assert measured_store.store._kernels == kernels  # the answers in use are the new kernel's
    finally:
        library._destroy()
