"""A copy of a non-contiguous tensor's elements (``clone``, ``contiguous()``, a copying ``to``)
takes its statistics from the input's row where that row holds the same elements in the same
row-major order, and is read where it does not (a view's row, which holds its base's).

The flash-attention backward's gradients on CPU are non-contiguous, and what follows them
copies them (``contiguous()``): the demo transformer's step read 1.6 MB of its 59.4 MB twice
(session 35).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pd = pytest.importorskip("pandas")

from dump_helpers import dump_both  # noqa: E402

from opscope.capture.torch.native import build as native  # noqa: E402

COLUMNS = ["op", "call", "io", "slot", "numel", "producer", "note", "min", "max", "mean", "std", "norm", "nan",
           "zeros", "hash"]


@pytest.fixture(scope="module")
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump observer did not build: {native.error('_opscope_dump')}"
    return module


def _both(tmp_path, monkeypatch, backend, work):
    """The native rows of ``work()``, checked equal to the Python path's, and the bytes the
    native kernel read."""
    rows, read = dump_both(tmp_path, monkeypatch, backend, work)
    native_rows, python_rows = (rows[n].sort_values("id")[COLUMNS].astype(str).values.tolist() for n in rows)
    assert native_rows == python_rows  # the Python path reads every copy: the same statistics
    return rows["native"], read["native"]


def test_a_copy_of_a_non_contiguous_tensors_elements_is_not_read_again(tmp_path, monkeypatch, backend):
    x = torch.randn(4, 12, 40)

    def work():
        a = x.permute(1, 0, 2) * 2  # non-contiguous (elementwise ops keep their strides): read in row-major order
        b = a.contiguous()  # its elements, in that order: not read
        c = a.clone()  # strides kept: the same elements in the same order, not read
        d = a.to(torch.float32, copy=True)  # not read
        e = a.to(torch.float64)  # other bytes: read
        return b, c, d, e

    rows, read = _both(tmp_path, monkeypatch, backend, work)
    assert read == 2 * x.numel() * 4 + x.numel() * 8  # x, a and the float64 copy (7 reads before session 35)
    out = rows[rows.io == "output"].set_index(["op", "call"])
    mul = out.loc[("aten.mul.Tensor", 0), "hash"]
    assert out.loc[("aten.clone.default", 0), "hash"] == out.loc[("aten.clone.default", 1), "hash"] == mul
    assert out.loc[("aten._to_copy.default", 0), "hash"] == mul


def test_a_copy_of_a_transposed_plane_is_read(tmp_path, monkeypatch, backend):
    """A tensor stored as transposed planes is read in memory order (fastats_transposed.h): its
    sums are of that order, so a copy of its elements, whose sums are of row-major order, is
    read as the Python path reads it; the hash is the same."""
    x = torch.randn(48, 40)

    def work():
        a = x.t() * 2  # a transposed plane: read in memory order
        return a.contiguous(), a.clone(memory_format=torch.contiguous_format)

    rows, read = _both(tmp_path, monkeypatch, backend, work)
    assert read == 4 * x.numel() * 4  # x, a and both copies
    out = rows[rows.io == "output"].set_index(["op", "call"])
    mul = out.loc[("aten.mul.Tensor", 0)]
    for call in (0, 1):
        copy = out.loc[("aten.clone.default", call)]
        assert (copy["hash"], copy["min"], copy["max"]) == (mul["hash"], mul["min"], mul["max"])
        assert copy["mean"] == pytest.approx(mul["mean"], rel=1e-5, abs=1e-7)


def test_a_copy_of_a_views_elements_is_read(tmp_path, monkeypatch, backend):
    """A transposed view's row holds its base's statistics, in the base's order; its copy (the
    elements in the view's order) has other sums and another hash, and is read. Before session
    35 a view lying contiguously over a transposed tensor (``a.t()`` of a transposed ``a``) gave
    its clone and its ``_unsafe_view`` the base's statistics: sums and hash of the other order,
    unlike the Python path's."""
    x = torch.randn(48, 40)

    def work():
        a = x.t() * 2  # read in its own order
        v = a.t()  # a view: its row holds a's statistics (a's order), though v lies contiguously
        w = x * 3  # contiguous, read
        u = w.t()  # a non-contiguous view of it
        return v.clone(), u.contiguous(), torch.ops.aten._unsafe_view(v, [x.numel()])

    rows, read = _both(tmp_path, monkeypatch, backend, work)
    assert read == 6 * x.numel() * 4  # x, a, w, both copies and v's memory
    out = rows[rows.io == "output"].set_index(["op", "call"])
    assert out.loc[("aten.clone.default", 0), "hash"] != out.loc[("aten.mul.Tensor", 0), "hash"]
    assert out.loc[("aten.clone.default", 1), "hash"] != out.loc[("aten.mul.Tensor", 1), "hash"]


def test_a_view_as_another_dtype_is_read(tmp_path, monkeypatch, backend):
    """``x.view(torch.int32)`` of float32 holds the same bytes as other elements: its row and its
    readers' rows have the int32 values' statistics. Before session 43 it was linked to its input
    like any view of the same length, and an int32 row carried the floats' min, max and mean.
    (The Python path also records an ``aten.detach`` of the int32 view, so the paths' rows are
    checked each on their own.)"""
    x = torch.randn(48, 40)

    def work():
        a = x * 2
        b = a.view(torch.int32)  # a view of a's bytes, as int32
        c = a.view(48, 40)  # a view as the same dtype: linked, not read
        return b + 1, c

    by_path, read = dump_both(tmp_path, monkeypatch, backend, work)
    assert read["native"] == 4 * x.numel() * 4  # x, a, its int32 view and b + 1
    ints = (x * 2).view(torch.int32)
    for rows in by_path.values():
        out = rows[rows.io == "output"].set_index(["op", "call"])
        view = out.loc[("aten.view.dtype", 0)]
        assert pd.isna(view["note"]) and pd.isna(view["producer"])
        assert (view["min"], view["max"]) == (ints.min().item(), ints.max().item())
        assert view["mean"] == pytest.approx(ints.double().mean().item(), rel=1e-9)
        add_in = rows[(rows.op == "aten.add.Tensor") & (rows.io == "input")].iloc[0]
        assert add_in["min"] == ints.min().item()
        same = out.loc[("aten.view.default", 0)]
        assert same["note"] == "view" and same["hash"] == out.loc[("aten.mul.Tensor", 0), "hash"]
