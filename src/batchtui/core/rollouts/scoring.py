"""`batchtui rollouts`: a sampler's rollouts scored as a trainer does, one batch of the plan at a time.

Each batch is one forward of its prompts + completions in the trainer's layout (`run.trainer_forward`: training mode
without dropout, autograd on, logprobs = log_softmax in float32 at the chosen tokens), set against the sampler's
logprobs of the same tokens. Under torchrun the plan's batches go to the ranks in turn, a round of one batch per rank
at a time; rank 0 gathers each round, writes its records in the plan's order and adds them to the summary, so the
summary is the one a single process makes of the same batches.

The file is read twice: once to check every line before any work (a fault ends the run, or is counted with
`skip_bad`), once to score. Memory stays flat in the number of rollouts: a window of the file, a batch's forward,
the summary's sums and worst few, every token's δ on disk.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import torch

from ..errors import Cancelled, InputError
from ..invariant.compiled_kernels import build_beside_loading
from ..invariant.mode import invariant_if
from ..models.loading import LoadedModel, load_model
from ..numbers.cpu_memory import FlatHeap
from ..numbers.importance import SequenceLogprobs
from ..numbers.rollouts_summary import RolloutsSummary
from ..run.packed_layout import check_packs
from ..run.skeleton import resolved_config, run_guarded
from ..run.trainer_forward import TrainerCall, scored_in_training, trainer_call, trainer_modes, trl_parts_of
from ..settings import Settings
from .batch_noise import NOISE_SEQUENCES, batch_noise
from .job import RolloutsJob
from .plan import Batch, batches
from .ranks import Ranks, joined, rank_device
from .records import Record, RecordsFile, read_records
from .rollouts_file import Rollout, RolloutFaults, Vocabulary, read_rollouts
from .tally import RolloutsTally

ProgressFn = Callable[[int, int], None]  # (sequences done, sequences in all)
_LAYOUTS = {  # `--layout`, as the records file's first line says it
    "grpo": "prompts left-padded, completions right-padded",  # TRL's GRPO layout (`run.trainer_forward`)
    "packed": "sequences packed in rows of at most the context, positions from 0 each",  # `run.packed_layout`
}
# What decides a rollouts run's numbers, of the settings a comparison's report gives
_CONFIG = ("model", "device", "dtype", "dtype_requested", "attn", "invariant", "invariant_classes", "pad_token_id",
           "vocab_size", "trust_remote_code")  # fmt: skip


def score_rollouts(
    job: RolloutsJob, progress: ProgressFn | None = None, cancelled: Callable[[], bool] | None = None
) -> RolloutsSummary | None:
    """The summary (on rank 0; None on the other ranks of a torchrun)."""
    started = time.perf_counter()
    job = job.checked()
    settings = job.settings.validated()
    settings = settings.with_changes(device=rank_device(settings.device))
    build_beside_loading(settings)  # the mode's attention kernel (once a machine)
    loaded = load_model(settings)
    vocabulary = vocabulary_of(loaded)
    faults = RolloutFaults(job.skip_bad)
    total = sum(1 for _ in read_rollouts(job.path, vocabulary, faults))  # every line checked before any work
    if not total:
        skipped = f" ({faults.count} faulty lines skipped)" if faults.count else ""
        raise InputError(f"{job.path} holds no rollouts{skipped}")
    temperature = scoring_temperature(job, faults)
    top_p, top_k = sampled_truncation(job, faults)
    # (hashing the weights only where a records file holds them: a first run on a large checkpoint reads it all)
    run = records_run(job, settings, loaded, temperature) if job.records else {}
    with joined(settings.device, job.dist_timeout_s) as ranks:
        scored = _Scoring(job, loaded, vocabulary, ranks, progress, cancelled, faults, run, temperature)
        try:
            run_guarded(loaded, lambda: scored.all(total, settings))
            if not ranks.first:
                return None
            noise = parts = None
            if settings.invariant:  # what the mode removed: the first batch scored again, each way
                first = next(scored.plan())
                classes = settings.kernel_classes
                noise = run_guarded(loaded, lambda: batch_noise(
                    loaded.model, first, loaded.pad_token_id, temperature, classes, scored.call))  # fmt: skip
            if job.trainer == "trl":  # which of TRL's two ways moves the logprobs: the first batch scored each way
                parts = run_guarded(loaded, lambda: _trl_parts(loaded, next(scored.plan()), temperature, settings))
            config = resolved_config(settings, loaded)
            c = job.correction
            config.update(rollouts_file=job.path, batch_tokens=job.batch_tokens, records=job.records, ranks=ranks.size,
                          temperature=temperature, top_p=top_p, top_k=top_k, clip_eps=c.clip_eps, tis_cap=c.tis_cap,
                          tis_floor=c.tis_floor, max_kl=job.max_kl, trainer=job.trainer, layout=job.layout)  # fmt: skip
            return scored.tally.summary(
                loaded.tokenizer.decode,
                lambda token: _label(loaded, token),
                config=config,
                max_kl=job.max_kl,
                batch_noise=noise,
                trl_parts=parts,
                skipped=faults.count,
                faults=tuple(faults.kept),
                resumed=scored.resumed,
                elapsed_s=time.perf_counter() - started,
            )
        finally:
            scored.close()


def _trl_parts(loaded: LoadedModel, batch: Batch, temperature: float, settings: Settings):
    rollouts = batch.rollouts[:NOISE_SEQUENCES]  # (a few forwards, whatever the file's size)
    prompts, completions = [list(r.prompt_ids) for r in rollouts], [list(r.completion_ids) for r in rollouts]
    with invariant_if(settings.invariant, loaded.model, settings.kernel_classes), trainer_modes(loaded.model):
        return trl_parts_of(loaded.model, prompts, completions, loaded.pad_token_id, temperature)


def scoring_call(job: RolloutsJob, loaded: LoadedModel) -> TrainerCall:
    """How the trainer's forward calls the model: `--trainer`'s call in `--layout`'s layout (the packed layout's rows
    at most the model's context, a model that cannot tell packed sequences apart refused in one line)."""
    call = trainer_call(job.trainer)
    if job.layout != "packed":
        return call
    check_packs(loaded.model, loaded.name)
    return dataclasses.replace(call, pack_width=loaded.max_tokens)


def scoring_temperature(job: RolloutsJob, checked: RolloutFaults) -> float:
    """The temperature the logits are divided by: `--temperature`, else the one the lines give (1 where they give
    none); lines that give two are refused in one line (two distributions in one summary)."""
    if job.temperature is not None:
        return job.temperature
    given: dict[float, int] = {}  # each temperature, at its first line
    for t, line in sorted(checked.temperatures.items(), key=lambda item: item[1]):
        given.setdefault(1.0 if t is None else t, line)
    return _given_once(job, given, "at other temperatures", lambda t: f"{t:g}", ", or give --temperature", 1.0)


def sampled_truncation(job: RolloutsJob, checked: RolloutFaults) -> tuple[float, int]:
    """The (top_p, top_k) the lines were sampled with (1 and 0: the whole distribution); lines that give two are
    refused in one line (two samplers in one summary)."""
    return _given_once(job, checked.truncations, "otherwise", lambda c: f"top_p {c[0]:g} top_k {c[1]}", "", (1.0, 0))


def _given_once(job: RolloutsJob, firsts: dict, how: str, words: Callable, hint: str, default):
    """The one value of a sampling setting the lines give (`firsts`: each value at its first line; `default` where
    they give none); two are one line naming both."""
    given = sorted(firsts.items(), key=lambda item: item[1])
    if len(given) > 1:
        (first, at), (second, there) = given[:2]
        raise InputError(
            f"{job.path}'s lines were sampled {how} ({words(first)} at line {at}, {words(second)} at line {there}): "
            f"score them apart{hint}"
        )
    return given[0][0] if given else default


def records_run(job: RolloutsJob, settings: Settings, loaded: LoadedModel, temperature: float) -> dict:
    """What decides a records file's numbers, held in its first line: a resumed run with another model, weights,
    dtype, mode, batching, layout or temperature is refused, naming the setting."""
    from ..reports.environment import model_identity

    return {
        "model": settings.model,
        "weights_sha256": model_identity(settings.model)["weights_sha256"],
        "dtype": loaded.dtype,
        "invariant": settings.invariant,
        "invariant_classes": ",".join(settings.kernel_classes) if settings.invariant else "",
        "batch_tokens": job.batch_tokens,
        "layout": _LAYOUTS[job.layout],
        "trainer": job.trainer,
        "temperature": temperature,
        # (2: each token's trainer entropy kept; 3: the lines' mask, step and group; 4: the trainer's call)
        "records_format": 4,
    }


def vocabulary_of(loaded: LoadedModel) -> Vocabulary:
    """What a rollouts file's lines are checked against: the model's vocabulary, context and tokenizer."""
    tokenizer = loaded.tokenizer

    def encode(text: str, special: bool) -> list[int]:
        return tokenizer(text, add_special_tokens=special).input_ids

    return Vocabulary(loaded.vocab_size, loaded.max_tokens, encode if tokenizer is not None else None)


class _Scoring:
    def __init__(
        self, job, loaded, vocabulary, ranks: Ranks, progress, cancelled, checked: RolloutFaults, run: dict,
        temperature: float,
    ) -> None:  # fmt: skip
        self.job, self.loaded, self.vocabulary, self.ranks = job, loaded, vocabulary, ranks
        self.temperature = temperature
        self.call: TrainerCall = scoring_call(job, loaded)
        self.progress, self.cancelled = progress, cancelled
        self.checked = checked  # what the checking pass read: exactly those lines are scored
        self.run = run  # the settings the records file's first line holds
        self.tally = RolloutsTally(job.correction)
        self.flat_heap = FlatHeap() if torch.device(loaded.device).type == "cpu" else None
        # opened and locked before anything is read back or scored: another run on the file is refused here
        self.records = RecordsFile(job.records, job.resume, run) if job.records and ranks.first else None
        self.resumed = 0

    def close(self) -> None:
        self.tally.close()
        if self.records is not None:
            self.records.close()

    def plan(self) -> Iterator[Batch]:
        rollouts = read_rollouts(self.job.path, self.vocabulary, RolloutFaults(skip_bad=False), self.checked)
        return batches(rollouts, self.job.batch_tokens)

    def all(self, total: int, settings: Settings) -> None:
        done = self.ranks.from_first(self._read_back() if self.job.resume and self.ranks.first else 0)
        self.resumed = self.done = done
        self.total = total
        self._report(done, total)
        model = self.loaded.model
        with invariant_if(settings.invariant, model, settings.kernel_classes), trainer_modes(model):
            round_: list[tuple[Batch, int]] = []
            seen = 0  # rollouts of the plan before the batch at hand
            for batch in self.plan():
                if seen + len(batch.rollouts) > done:  # not all of it scored before: (it, how many of it were)
                    round_.append((batch, max(0, done - seen)))
                seen += len(batch.rollouts)
                if len(round_) == self.ranks.size:
                    self._round(round_)
                    round_ = []
            if round_:
                self._round(round_)

    def _round(self, round_: list[tuple[Batch, int]]) -> None:
        """One batch per rank scored, then written by rank 0 in the plan's order. A batch a stopped run had begun
        writing is scored whole again, as it was, and only the rest of it written."""
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("the rollouts run was stopped")
        mine = round_[self.ranks.rank][0] if self.ranks.rank < len(round_) else None
        scored = self._score(mine) if mine is not None else []
        if self.flat_heap is not None:
            self.flat_heap()  # (memory flat in the number of batches)
        gathered = self.ranks.gathered(scored)
        if gathered is None:
            return
        for (_, written), records in zip(round_, gathered):
            for record in records[written:]:
                if self.records is not None:
                    self.records.write(record)
                self.tally.add(record)
                self.done += 1
                self._report(self.done, self.total)  # (after each record: a stop's message counts the file's lines)

    def _score(self, batch: Batch) -> list[Record]:
        rollouts = batch.rollouts
        scores = scored_in_training(
            self.loaded.model,
            [list(r.prompt_ids) for r in rollouts],
            [list(r.completion_ids) for r in rollouts],
            self.loaded.pad_token_id,
            self.temperature,
            entropy=True,
            call=self.call,
        )
        return [_record(batch, rollout, score) for rollout, score in zip(rollouts, scores)]

    def _read_back(self) -> int:
        """The records file's records checked against the plan's first rollouts (line, input digest and batch) and
        added to the summary; how many."""
        plan = ((rollout, batch.index) for batch in self.plan() for rollout in batch.rollouts)
        count = 0
        for record, planned in zip(read_records(self.job.records, self.run), _padded(plan)):
            _check_record(record, planned, count + 1, self.job)
            self.tally.add(record)
            count += 1
        return count

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None and self.ranks.first:
            self.progress(done, total)


def _check_record(record: Record, planned: tuple[Rollout, int] | None, number: int, job: RolloutsJob) -> None:
    """A record read back is the one this run would write for the plan's rollout at its place: the same line, batch
    and input (its digest), the line's completion and sampler logprobs, trainer logprobs that are logprobs."""
    where = f"records file {job.records} record {number}"
    if planned is None or (record.line, record.batch) != (planned[0].line, planned[1]):
        there = "no more" if planned is None else f"line {planned[0].line} in batch {planned[1]}"
        raise InputError(
            f"records file {job.records} does not go with {job.path} and --batch-tokens {job.batch_tokens} (record "
            f"{number} is line {record.line} in batch {record.batch}, the plan has {there})"
        )
    rollout = planned[0]
    if record.digest != rollout.digest:
        raise InputError(f"{where}: line {rollout.line} of {job.path} changed since the record was written")
    if record.completion_ids != rollout.completion_ids or record.logprobs.sampler != rollout.logprobs:
        raise InputError(f"{where}: its completion or sampler logprobs are not line {rollout.line}'s: edited")
    if (record.mask, record.step, record.group) != (rollout.mask, rollout.step, rollout.group) or (
        record.top1_ids is not None and record.top1_ids != rollout.top1_ids
    ):
        raise InputError(f"{where}: its mask, step, group or top-1 ids are not line {rollout.line}'s: edited")
    if any(value > 0 for value in record.logprobs.trainer):
        raise InputError(f"{where}: a trainer logprob above 0: not a logprob, edited")


def _label(loaded: LoadedModel, token: int) -> str:
    loaded.decode([token])
    return loaded.token_texts[token]


def _padded(plan: Iterator) -> Iterator:
    yield from plan
    while True:
        yield None


def _record(batch: Batch, rollout: Rollout, score) -> Record:
    trainer = tuple(score.logprobs.tolist())
    disagree = None
    if rollout.top1_ids is not None and score.top1 is not None:  # (TRL's head gives no top-1)
        disagree = tuple((score.top1 != torch.tensor(rollout.top1_ids, device=score.top1.device)).tolist())
    logprobs = SequenceLogprobs(trainer, rollout.logprobs, disagree)
    entropy = tuple(score.entropy.clamp(min=0).tolist())  # (rounding can leave a certain token's a hair below 0)
    return Record(rollout.line, rollout.digest, batch.index, rollout.completion_ids, logprobs, entropy, rollout.mask,
                  rollout.step, rollout.group, rollout.top1_ids)  # fmt: skip
