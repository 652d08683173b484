"""At the API level, a call's output that is a view holding all of its first argument's elements
(``Tensor.view``, ``transpose``, ``permute``, a reshape that views) is linked to that argument's
row (``note = view``): the same statistics and hash, not read again. So is such a call's
gradient where it is a view of the gradient arriving. The aten level links view ops by their
schemas; before session 43 the API level read every view again (GPT-2's api level read 269 MB a
step against its aten level's 222, 45 MB of it ``Tensor.view`` outputs).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import opscope  # noqa: E402
from opscope.capture.torch.native import build as native  # noqa: E402

BACKENDS = ["native", "python"]
_SAME = ["seq", "phase", "op", "call", "io", "slot", "arg", "dtype", "numel", "note", "min", "max", "mean", "norm",
         "nan", "zeros", "hash"]
_BYTES = {"float32": 4, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "bool": 1, "float64": 8}


@pytest.fixture(scope="module")
def backend_module():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump module did not build: {native.error('_opscope_dump')}"
    return module


def _work(lin: torch.nn.Linear, x: torch.Tensor) -> dict[str, torch.Tensor]:
    y = lin(x)
    v = y.view(4, 8, 2, 8).transpose(1, 2)  # views holding all of y: linked
    s = v.reshape(4, 2, 64)  # v is not viewable so: a copy, in v's order, read
    a, b = y.split(8, dim=-1)  # parts of y: read
    i = y.view(torch.int32)  # y's bytes as other elements: read
    loss = s.sum() + a.sum() + v.sum() + i.float().sum() * 0
    loss.backward()
    return {"y": y, "v": v, "s": s, "a": a, "i": i}


def _dump(path, monkeypatch, backend, module=None, **keys):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(16, 16), torch.randn(4, 8, 16)
    with opscope.dump(path, level="api", **keys) as d:
        before = module.read_bytes() if module else 0
        values = _work(lin, x)
        d.step()
        read = module.read_bytes() - before if module else 0
    dump = opscope.load(path)
    return dump, dump.records().to_pandas(integer_object_nulls=True).sort_values("id"), values, read


def _row(rows, op, phase, io, call=0, slot=0):
    found = rows[(rows.op == op) & (rows.phase == phase) & (rows.io == io) & (rows.call == call) & (rows.slot == slot)]
    assert len(found) == 1, (op, phase, io, call, slot)
    return found.iloc[0]


def _cell(v):
    return "null" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_holding_all_of_a_calls_input_are_linked_to_its_row(tmp_path, monkeypatch, backend, backend_module):
    _, rows, values, read = _dump(tmp_path / "d", monkeypatch, backend, backend_module)
    by_id = rows.set_index("id")
    for op, phase in (("Tensor.view", "forward"), ("Tensor.transpose", "forward"), ("Tensor.transpose", "backward")):
        out, inp = _row(rows, op, phase, "output"), _row(rows, op, phase, "input")
        assert (out["note"], out["producer"]) == ("view", inp["id"]), (op, phase)
        assert (out["hash"], out["min"], out["max"], out["mean"]) == (inp["hash"], inp["min"], inp["max"], inp["mean"])
    assert _row(rows, "Tensor.view", "forward", "output")["hash"] == by_id.loc[
        _row(rows, "torch.nn.functional.linear", "forward", "output")["id"], "hash"]
    # a copy (the reshape of a transposed view), the parts of a split and a view as int32: read
    for op, slot, expected in (("Tensor.reshape", 0, values["s"]), ("Tensor.split", 0, values["a"]),
                               ("Tensor.view", 0, values["i"])):
        out = _row(rows, op, "forward", "output", call=1 if expected is values["i"] else 0, slot=slot)
        assert out["producer"] is None and not isinstance(out["note"], str), op
        assert (out["min"], out["max"]) == (expected.min().item(), expected.max().item()), op
    # (the copy holds v's elements in v's order: another hash than y's, which v's row carries)
    assert _row(rows, "Tensor.reshape", "forward", "output")["hash"] != _row(rows, "Tensor.reshape", "forward",
                                                                             "input")["hash"]
    if backend == "native":  # what the kernel read: the measured rows' bytes, no view among them
        measured = rows[rows.producer.isna() & ~rows.note.map(lambda n: isinstance(n, str))]
        assert read == sum(int(r.numel) * _BYTES[r.dtype] for r in measured.itertuples())


def test_the_native_and_python_paths_link_the_same_views(tmp_path, monkeypatch, backend_module):
    for mode in ("all", "output"):
        _, native_rows, _, _ = _dump(tmp_path / f"n-{mode}", monkeypatch, "native", mode=mode)
        _, python_rows, _, _ = _dump(tmp_path / f"p-{mode}", monkeypatch, "python", mode=mode)
        assert len(native_rows) == len(python_rows) > 10
        for column in _SAME:
            assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], (mode, column)
        linked = native_rows[native_rows.note == "view"]
        assert len(linked) >= 3 and linked.producer.notna().all()
        assert (python_rows.note == "view").sum() == len(linked)
        if mode == "output":  # no input rows: linked to the row that made the input
            view = _row(native_rows, "Tensor.view", "forward", "output")
            assert view["producer"] == _row(native_rows, "torch.nn.functional.linear", "forward", "output")["id"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_linked_view_with_full_tensors_reads_back_as_the_view(tmp_path, monkeypatch, backend):
    dump, rows, values, _ = _dump(tmp_path / "d", monkeypatch, backend, data="tensor")
    for op, want in (("Tensor.view", values["y"].detach().view(4, 8, 2, 8).numpy()),
                     ("Tensor.transpose", values["v"].detach().numpy())):
        out = _row(rows, op, "forward", "output")
        assert out["note"] == "view"
        got = dump.row_tensor(out.to_dict())
        assert got.shape == want.shape and np.array_equal(got, want), op


def _gpt2_steps(path, monkeypatch, backend, steps=2):
    """Training steps of a tiny random GPT-2 (SDPA attention, AdamW): the losses and, with
    ``path``, the api-level dump's rows."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = []

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())

    if path is None:
        for _ in range(steps):
            step()
        return losses, None
    with opscope.dump(path, level="api") as d:
        for _ in range(steps):
            step()
            d.step()
    return losses, opscope.load(path).records().to_pandas(integer_object_nulls=True).sort_values(["step", "id"])


def test_gpt2s_views_at_the_api_level_are_linked_on_both_paths(tmp_path, monkeypatch):
    """GPT-2's Conv1D reshapes with ``view`` (forward and backward) and its attention
    transposes: those rows carry their input's statistics; the dumped losses stay the bare ones."""
    bare, _ = _gpt2_steps(None, monkeypatch, "native")
    native_losses, native_rows = _gpt2_steps(tmp_path / "n", monkeypatch, "native")
    python_losses, python_rows = _gpt2_steps(tmp_path / "p", monkeypatch, "python")
    assert native_losses == python_losses == bare  # bit for bit
    assert len(native_rows) == len(python_rows)
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column
    linked = native_rows[native_rows.note == "view"]
    ops = set(zip(linked.op, linked.phase))
    assert {("Tensor.view", "forward"), ("Tensor.view", "backward"), ("Tensor.transpose", "forward")} <= ops
    by_id = native_rows.set_index("id")
    for row in linked.itertuples():
        source = by_id.loc[row.producer]
        assert (source["hash"], source["numel"], source["min"], source["max"]) == (row.hash, row.numel, row.min,
                                                                                    row.max)
