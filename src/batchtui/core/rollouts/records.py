"""`--records`: one JSON line per scored sequence, appended as each batch is done, and read back by `--resume`; the
first line holds the settings of the run that wrote them (`header_line`), which a resumed run must have too.

A line is written with one `write` call on a file opened for appending, so a run stopped anywhere (Ctrl+C, a killed
process) leaves whole lines and at most one cut one, which `--resume` drops. Records are written in the plan's order
(`rollouts.plan`): a resumed run checks that the file's records are the plan's first ones (by line number and the
digest of the input line) and scores only the rest, so nothing is scored twice or lost and the records and the summary
come out as an uninterrupted run's. A records file is read as any file from elsewhere: bounded and checked.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InputError
from ..numbers.importance import SequenceLogprobs
from ..untrusted import finite, open_regular
from ..visible import literal
from .rollouts_file import MAX_LINE_BYTES

RECORD_START = b'{"line": '  # how every record's line begins (`Record.as_json`)
HEADER_START = b'{"records_of": "batchtui rollouts", '  # how the first line, the run's settings, begins


def header_line(run: dict) -> bytes:
    """The records file's first line: the settings of the run whose records follow (`--resume` goes on only with
    the same)."""
    return json.dumps({"records_of": "batchtui rollouts", "run": run}, allow_nan=False).encode() + b"\n"


@dataclass(frozen=True)
class Record:
    line: int
    digest: str
    batch: int
    completion_ids: tuple[int, ...]
    logprobs: SequenceLogprobs
    entropy: tuple[float, ...]  # the trainer's distribution's entropy at each completion token (nats)
    mask: tuple[bool, ...] | None = None  # the line's: which tokens count (None: all)
    step: int | None = None  # the line's
    group: str | None = None
    top1_ids: tuple[int, ...] | None = None  # the line's: the sampler's top-1 at each step (None: it gives none)

    @property
    def counted(self) -> SequenceLogprobs:
        """The logprobs of the tokens that count (all where the line gives no mask)."""
        seq = self.logprobs
        if self.mask is None:
            return seq
        keep = [i for i, counts in enumerate(self.mask) if counts]
        top1 = None if seq.top1_disagree is None else tuple(seq.top1_disagree[i] for i in keep)
        return SequenceLogprobs(tuple(seq.trainer[i] for i in keep), tuple(seq.sampler[i] for i in keep), top1)

    def as_json(self) -> str:
        seq = self.logprobs
        return json.dumps(
            {
                "line": self.line,
                "digest": self.digest,
                "batch": self.batch,
                "completion_ids": list(self.completion_ids),
                "trainer_logprobs": list(seq.trainer),
                "sampler_logprobs": list(seq.sampler),
                "trainer_entropy": list(self.entropy),
                "mask": None if self.mask is None else [int(v) for v in self.mask],
                "step": self.step,
                "group": self.group,
                "top1_disagree": None if seq.top1_disagree is None else list(seq.top1_disagree),
                "top1_ids": None if self.top1_ids is None else list(self.top1_ids),
                "log_ratio": seq.log_ratio,
                "max_abs_diff": max(map(abs, seq.deltas)),
            },
            allow_nan=False,
        )


class RecordsFile:
    """The records file, open for appending and locked (`flock`) for as long as this run holds it: a second run on
    the same file, fresh or resumed, is refused at once instead of appending the same records again."""

    def __init__(self, path: str, resume: bool, run: dict) -> None:
        self.path = path
        self._header = header_line(run)  # written before the first record where the file is empty
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | (0 if resume else os.O_EXCL)
        try:  # (without waiting: a FIFO is refused below, never written)
            self._fd = os.open(path, flags | getattr(os, "O_NOCTTY", 0), 0o644)
        except FileExistsError:
            raise InputError(f"records file {path} exists: --resume continues it (or give another path)") from None
        except OSError as exc:
            raise InputError(f"cannot write records file {path}: {exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise InputError(f"records file {path} is not a regular file")
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(
                    f"records file {path} is being written by another run: wait for it to end, or give another path"
                ) from None
            os.set_blocking(self._fd, True)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, record: Record) -> None:
        data = (record.as_json() + "\n").encode()
        if os.fstat(self._fd).st_size == 0:  # (one write with the first record: a stop leaves both or a cut line)
            data = self._header + data
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # (a short write on a full disk: the rest, or the error)
                written += os.write(self._fd, data[written:])
        except OSError as exc:  # a full disk, a file past its size limit, a quota: what was written stays
            raise InputError(
                f"cannot write records file {self.path}: {exc.strerror or exc}; the records before stay whole "
                "(--resume goes on from them once there is room)"
            ) from None

    def close(self) -> None:
        os.close(self._fd)


def read_records(path: str, run: dict, repair: bool = True) -> Iterator[Record]:
    """The whole records of the file in order, after its first line, the settings of the run that wrote them, which
    must be `run`'s (a mismatch names the setting). With `repair`, a cut last line (a run stopped while writing it)
    is removed from the file, so that appending goes on after the last whole one; only once every whole line has
    been taken (the caller checks each against its run before asking for the next) and only where the cut line is
    the start of a record (or of the first line): a file that is not this run's records loses nothing. Without it
    (a file opened to be viewed) the file is only read."""
    if not os.path.lexists(path):
        return
    with open_regular(path, "records file", writable=repair) as handle:
        number, whole = 0, 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            start = HEADER_START if number == 1 else RECORD_START
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    raise InputError(f"records file {path} line {number}: longer than any record")
                if not (raw.startswith(start) or start.startswith(raw)):
                    raise InputError(f"records file {path} line {number}: not a record of `batchtui rollouts`")
                if repair:
                    handle.truncate(whole)  # the line a stopped run was writing
                return
            whole += len(raw)
            if number == 1:
                _check_header(raw, path, run)
                continue
            yield _record(raw, f"records file {path} line {number}")


def written_run(path: str) -> dict | None:
    """The settings a records file's first line holds (JSON scalars only), or None where the file does not begin
    as records do (another kind of file)."""
    with open_regular(path, "records file") as handle:
        raw = handle.readline(MAX_LINE_BYTES + 1)
    if not raw.startswith(HEADER_START):
        return None
    run = _header_run(raw, path)
    return {str(k)[:100]: v for k, v in run.items() if v is None or isinstance(v, (str, int, float, bool))}


def _header_run(raw: bytes, path: str) -> dict:
    try:
        written = json.loads(raw)["run"]
        if not raw.startswith(HEADER_START) or not isinstance(written, dict):
            raise TypeError
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        raise InputError(f"records file {path} line 1: not a record of `batchtui rollouts`") from None
    return written


def _check_header(raw: bytes, path: str, run: dict) -> None:
    if raw.startswith(RECORD_START):
        raise InputError(
            f"records file {path} does not say which run wrote it (an older batchtui's): --resume cannot check it "
            "is this run's; score into a new records file"
        )
    written = _header_run(raw, path)
    for name, value in run.items():
        if written.get(name) != value:
            said = literal(json.dumps(written.get(name)), 80)
            raise InputError(
                f"records file {path} was written by another run: its {name} is {said}, this run's "
                f"{literal(json.dumps(value), 80)} (--resume goes on with the same settings only)"
            )


def _record(raw: bytes, where: str) -> Record:
    try:
        entry = json.loads(raw)
        seq = SequenceLogprobs(
            tuple(_floats(entry["trainer_logprobs"])),
            tuple(_floats(entry["sampler_logprobs"])),
            None if entry["top1_disagree"] is None else tuple(_bools(entry["top1_disagree"])),
        )
        record = Record(
            _whole(entry["line"]),
            str(entry["digest"]),
            _whole(entry["batch"]),
            tuple(_ids(entry["completion_ids"])),
            seq,
            tuple(_floats(entry["trainer_entropy"])),
            None if entry["mask"] is None else tuple(bool(v) for v in _bits(entry["mask"])),
            None if entry["step"] is None else _whole(entry["step"]),
            None if entry["group"] is None else _text(entry["group"]),
            None if entry.get("top1_ids") is None else tuple(_ids(entry["top1_ids"])),
        )
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        raise InputError(f"{where}: not a record of `batchtui rollouts`") from None
    if (
        len(record.completion_ids) != len(seq.trainer)
        or len(record.entropy) != len(seq.trainer)
        or (record.mask is not None and len(record.mask) != len(seq.trainer))
        or (record.top1_ids is not None and len(record.top1_ids) != len(seq.trainer))
        or any(value < 0 for value in record.entropy)
        or not isinstance(entry["digest"], str)
    ):
        raise InputError(f"{where}: not a record of `batchtui rollouts`")
    return record


def _whole(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError
    return value


def _ids(values) -> list[int]:
    return [_whole(v) for v in values]


def _floats(values) -> list[float]:
    if not isinstance(values, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) for v in values
    ):
        raise TypeError
    return [float(v) for v in values]


def _bits(values) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int and v in (0, 1) for v in values):
        raise TypeError
    return values


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _bools(values) -> list[bool]:
    if not isinstance(values, list) or not all(isinstance(v, bool) for v in values):
        raise TypeError
    return values
