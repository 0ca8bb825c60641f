"""Runs in several threads of one process at once share the loaded model and its tokenizer (the app starts a newer
run while an older, cancelled one finishes its pass): each must get the numbers it would get alone."""

import threading

import pytest
import torch

from batchtui.core.invariant.mode import batch_invariant
from batchtui.core.models.loading import load_model
from batchtui.core.run.engine import compare
from batchtui.core.settings import Settings

TEXTS = ["one two three", "two", "a much longer text than the two others here"]
_WAIT_S = 120


def _in_thread(work):
    """Start `work()` in a thread; the returned join gives its result or raises what it raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join(_WAIT_S)
        assert not thread.is_alive(), "the other thread did not finish"
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return join


def _logits(model, encoded) -> torch.Tensor:
    with torch.inference_mode():
        return model(**encoded).logits


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_pass_outside_the_mode_is_the_model_s_own_while_another_thread_is_in_it(attn):
    loaded = load_model(Settings(model="tiny", dtype="float32", attn=attn))
    encoded = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")
    own = _logits(loaded.model, encoded)
    entered, leave = threading.Event(), threading.Event()

    def hold_the_mode():
        with batch_invariant(loaded.model):
            entered.set()
            leave.wait(_WAIT_S)

    join = _in_thread(hold_the_mode)
    try:
        assert entered.wait(_WAIT_S)
        beside = _logits(loaded.model, encoded)  # the model routed to the mode's attention, by the other thread
    finally:
        leave.set()
        join()
    assert torch.equal(beside, own)  # the same computation: not the mode's per-row attention, nor its mask
    assert loaded.model.config._attn_implementation == attn


def test_the_mode_holds_in_a_thread_after_another_thread_left_it():
    loaded = load_model(Settings(model="tiny", dtype="float32"))
    model = loaded.model
    batch = loaded.tokenizer(TEXTS, padding=True, padding_side="right", return_tensors="pt")
    alone = loaded.tokenizer(TEXTS[1:2], return_tensors="pt")
    entered, leave = threading.Event(), threading.Event()

    def enter_and_leave_first():
        with batch_invariant(model):
            entered.set()
            leave.wait(_WAIT_S)

    join = _in_thread(enter_and_leave_first)
    with batch_invariant(model):
        assert entered.wait(_WAIT_S)
        leave.set()
        join()  # the first entry is gone; this block still routes the model
        batched, single = _logits(model, batch), _logits(model, alone)
    length = alone["input_ids"].shape[1]
    assert torch.equal(batched[1, :length], single[0])  # the mode's promise: bitwise, on every machine
    assert model.config._attn_implementation == "sdpa"


def _numbers(comparison):
    return [(t.max_abs_diff, t.padding, t.kl_max, t.layers, t.modules) for t in comparison.texts]


def test_comparisons_in_two_threads_at_once_each_give_their_own_numbers():
    base = Settings(model="tiny", dtype="float32", positions="mask")
    ours = base.with_changes(batch_size=4, padding_side="left", modules=True)
    theirs = base.with_changes(batch_size=2, padding_side="right", invariant=True)
    load_model(base)
    alone = _numbers(compare(TEXTS, ours)), _numbers(compare(TEXTS, theirs))
    rounds = 3

    join = _in_thread(lambda: [_numbers(compare(TEXTS, theirs)) for _ in range(rounds)])
    mine = [_numbers(compare(TEXTS, ours)) for _ in range(rounds)]
    others = join()
    assert mine == [alone[0]] * rounds  # its own padding side, its own hidden states, outside the mode
    assert others == [alone[1]] * rounds


def test_a_run_that_must_wait_its_turn_is_told_and_one_that_need_not_is_not():
    from batchtui.core.one_run import one_run_at_a_time

    told = []
    with one_run_at_a_time(waiting=lambda: told.append("outer")):
        with one_run_at_a_time(waiting=lambda: told.append("nested")):  # the same thread's: its own turn
            pass
        entered = threading.Event()

        def other_run():
            with one_run_at_a_time(waiting=lambda: told.append("other")):
                entered.set()

        join = _in_thread(other_run)
        assert not entered.wait(0.3)  # it waits while this turn lasts
    join()
    assert entered.is_set() and told == ["other"]
