"""A view recorded in a step must not hold its memory to the step's end.

The data flow finds a view again by its storage's address and geometry (autograd wraps view
outputs in new tensor objects). It used to hold the view's storage until the step ended, so
that no other tensor took the address: every storage some view was made of lived to the
end of the step (11.6 MB of a small transformer's step, held by the dump alone; on a GPU the
caching allocator could not reuse those blocks). The storage is now held weakly, and a
tensor whose storage is another one, at the freed address, is not taken for the view.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

import opscope  # noqa: E402

BACKENDS = ["native", "python"]


@pytest.mark.parametrize("data", ["statistics", "tensor"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_views_storage_is_freed_with_its_last_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       backend: str, data: str) -> None:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    with opscope.dump(tmp_path / "d", level="aten", data=data) as d:
        a = torch.randn(64, 64)
        b = a * 2
        v = b.t()  # a view: recorded by its geometry on b's storage
        w = v.reshape(64, 64).transpose(0, 1)  # views of the view
        ref = StorageWeakRef(b.untyped_storage())
        del b, v, w
        c = torch.zeros(1)
        for _ in range(300):  # the Python path's statistics thread holds what it has not measured yet (256 jobs)
            c = c + 1.0
        freed = ref.expired()
        d.step()
    assert freed, "the dump held the storage of a view after the user's last tensor of it went"
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    assert {"aten.mul.Tensor", "aten.t.default", "aten.transpose.int"} <= set(rows.op), sorted(set(rows.op))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_storage_on_a_views_memory_is_measured_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               backend: str) -> None:
    """A view recorded on a numpy array's memory (``b.t()``), then a new tensor on that
    memory laid out as the view was, after numpy (no op) wrote 7.0 there, read by an op: it
    is another storage at the same address, so its own values are measured, not the view's
    row taken again."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    buf = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    with opscope.dump(tmp_path / "d", level="aten") as d:
        b = torch.from_numpy(buf)  # no op made it
        v = b.t() * 1.0  # aten.t's output, a view of b: recorded by its geometry
        del b
        buf[:] = 7.0  # no op wrote it
        x = torch.from_numpy(buf.T)  # a new storage on the same memory: shape (64, 64), strides (1, 64)
        y = x + 1.0
        d.step()
    assert float(y.mean()) == 8.0 and float(v.mean()) != 7.0
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    add = rows[(rows.op == "aten.add.Tensor") & (rows.io == "input") & (rows.slot == 0)]
    assert len(add) == 1, add
    assert add.iloc[0]["mean"] == 7.0 and add.iloc[0]["max"] == 7.0, add.iloc[0].to_dict()


def test_the_python_paths_statistics_thread_holds_a_bounded_number_of_bytes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python path measures CPU tensors on a native thread and keeps each alive until its
    result is collected: it collected every 256 jobs, so a step's large tensors, freed by the
    step's code, stayed alive until then (twelve of 16 MB here, 192 MB). It now collects, and
    waits for the thread if need be, once they hold 64 MB."""
    from opscope.capture.torch.worker import HELD_BYTES

    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "python")
    size = 4 << 20  # float32 elements: 16 MB
    with opscope.dump(tmp_path / "d", level="aten") as d:
        refs = []
        for i in range(12):
            t = torch.full((size,), float(i))
            refs.append(StorageWeakRef(t.untyped_storage()))
            del t
        alive = sum(not r.expired() for r in refs)
        d.step()
    assert opscope.load(tmp_path / "d").manifest["stats_backend"] != "native"
    assert alive * size * 4 <= HELD_BYTES, f"{alive} tensors of 16 MB still held by the dump"
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    full = rows[rows.op == "aten.full.default"].sort_values("id")
    assert full["mean"].tolist() == [float(i) for i in range(12)]  # each measured, as it was
