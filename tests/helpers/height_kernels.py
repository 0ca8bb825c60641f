"""Matmul kernels whose result depends on the call's height, registered through torch.library: a cause made the same
on every machine, for the tests that find where two runs part."""

import contextlib
import warnings

import torch


@contextlib.contextmanager
def height_dependent_addmm(rows: int = 8, shift: float = 2**-30):
    """aten::mm and aten::addmm on the CPU, plus `shift` on every output of a call of `rows` rows or more."""

    def shifted(out, a):
        return out + shift if a.shape[0] >= rows else out

    def mm(a, b):
        return shifted(torch.ops.aten.mm.out(a, b, out=a.new_empty((a.shape[0], b.shape[1]))), a)

    def addmm(bias, a, b, *, beta=1, alpha=1):
        out = torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1])))
        return shifted(out, a)

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        library.impl("mm", mm, "CPU")
        library.impl("addmm", addmm, "CPU")
    try:
        yield
    finally:
        library._destroy()
