"""torch.compile under a dump: no crash, the same losses as the compiled run without
opscope, what runs recorded (not what dynamo traces), no ``_orig_mod.`` in any name, the
manifest says what was compiled.

Every run that compiles is in a subprocess: before the fix, the native observer measured
dynamo's FakeTensors and the process died of signal 11.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import opscope
from opscope.capture.torch.modules import strip_wrapped

# Trains a small model 3 steps with torch.compile(model, backend=BACKEND): once bare, then
# under a dump for each (path, level, data) case; prints one JSON line per dump.
_SCRIPT = textwrap.dedent("""
    import json, os, sys, warnings
    import torch, torch._dynamo
    import opscope
    from opscope.demo.models import mlp_task, transformer_task, train_step

    out, task_name, backend, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

    def task():
        if task_name == "mlp":
            return mlp_task(batch=8, d_in=16, hidden=16, depth=2)
        return transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)

    def run(compiled=True, **keys):
        torch._dynamo.reset()  # each dump sees its graphs compiled
        model, opt, batch = task()
        model = torch.compile(model, backend=backend) if compiled else model
        if not keys:
            return [train_step(model, opt, *batch(i)) for i in range(3)]
        with opscope.dump(overwrite=True, **keys) as d:
            losses = []
            for i in range(3):
                losses.append(train_step(model, opt, *batch(i)))
                d.step()
        return losses

    warnings.simplefilter("always")
    bare = run()
    for name, path, level, data, compiled in cases:
        os.environ["OPSCOPE_DUMP_BACKEND"] = path
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = run(compiled, path=os.path.join(out, name), level=level, data=data)
        said = [str(w.message) for w in caught if str(w.message).startswith("opscope:")]
        print(json.dumps({"name": name, "same": losses == bare or not compiled, "warnings": said}), flush=True)
""")


def _run(tmp_path, backend: str, cases: list[tuple[str, str, str, str, bool]], task: str = "mlp",
         timeout: int = 600) -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), task, backend, json.dumps(cases)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["name"] for r in lines] == [c[0] for c in cases]
    return {r["name"]: r for r in lines}


def _check_dump(path, backend: str, inner_ops: str) -> opscope.Dump:
    dump = opscope.load(path)
    assert dump.manifest["status"] == "complete"
    table = dump.records().to_pandas()
    for column in ("module", "param"):
        assert not table[column].fillna("").str.contains("_orig_mod").any(), column
    graphs = dump.manifest["compiled"]["graphs"]
    assert graphs and all(g["backend"] == backend and g["inner_ops"] == inner_ops for g in graphs)
    assert dump.manifest["compiled"]["note"]
    return dump


_LEVELS = [("aten", "statistics"), ("aten", "tensor"), ("module", "statistics"), ("api", "statistics")]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_model_every_level_both_paths(tmp_path, backend):
    cases = [(f"{path}-{level}-{data}", path, level, data, True)
             for path in ("native", "python") for level, data in _LEVELS if path == "native" or data != "tensor"]
    results = _run(tmp_path, backend, cases, task="transformer" if backend == "eager" else "mlp")
    for name, result in results.items():
        assert result["same"], f"{name}: losses differ from the compiled run without opscope"
        dump = _check_dump(tmp_path / name, backend, "recorded")
        ops = set(dump.records().to_pandas()["op"])
        level = name.split("-")[1]
        if level == "aten":  # the graph's aten ops ran eagerly and were seen
            assert "aten.addmm.default" in ops or "aten.mm.default" in ops
            assert not result["warnings"]
        else:  # the graph's inputs and outputs, at the module that called it
            assert "compiled_graph_0" in ops
        if level == "module":
            assert len(result["warnings"]) == 1 and "level='module'" in result["warnings"][0]


def test_eager_backend_keeps_module_paths_inside_the_graph(tmp_path):
    _run(tmp_path, "eager", [("aten", "native", "aten", "statistics", True)])
    dump = _check_dump(tmp_path / "aten", "eager", "recorded")
    forward = dump.records().to_pandas().query("phase == 'forward' and op == 'aten.addmm.default'")
    assert set(forward["module"]) == {"layers.0", "out"}
    assert set(forward["param"].dropna()) >= {"layers.0.bias", "out.bias"}
    assert dump.manifest["compiled"]["graphs"][0]["modules"] == ["layers.0", "act", "out"]


@pytest.mark.parametrize("level", ["aten", "module"])
def test_compare_compiled_against_uncompiled(tmp_path, level):
    """backend="eager" runs the same aten ops: a compare must find nothing (compare's own
    alignment is another module's; this checks that the capture gives it the same rows)."""
    _run(tmp_path, "eager", [("compiled", "native", level, "statistics", True),
                             ("eager", "native", level, "statistics", False)])
    result = opscope.compare(tmp_path / "compiled", tmp_path / "eager")
    assert result.verdict in ("identical", "within_tolerance"), result.verdict
    assert not result.culprits
    if level == "aten":
        assert result.verdict == "identical" and result.counts["unpaired_target"] == 0


@pytest.mark.slow
def test_inductor_records_graph_inputs_and_outputs(tmp_path):
    cases = [("aten", "native", "aten", "statistics", True), ("module", "native", "module", "statistics", True),
             ("python-aten", "python", "aten", "statistics", True)]
    results = _run(tmp_path, "inductor", cases, timeout=900)
    for name, result in results.items():
        assert result["same"], name
        dump = _check_dump(tmp_path / name, "inductor", "not recorded")
        table = dump.records().to_pandas()
        graph = table.query("op == 'compiled_graph_0'")
        assert {"input", "output"} <= set(graph["io"]) and set(graph["module"].fillna("")) == {""}
        if name.endswith("aten"):  # no op of the fused kernels; one line says so, with the fix
            forward = table.query("phase == 'forward'")
            assert not forward["op"].str.startswith("aten.addmm").any()
            assert len(result["warnings"]) == 1 and "backend='aot_eager'" in result["warnings"][0]
            assert "grad_output" in set(graph["arg"].dropna())  # the compiled backward's gradients


_FAKE = textwrap.dedent("""
    import sys, torch, opscope
    from torch._subclasses.fake_tensor import FakeTensorMode
    x = torch.randn(4, 4)
    with opscope.dump(sys.argv[1], level="aten") as d:
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(x)
            (fake @ fake).sum()
        (x @ x).sum()
""")


def test_fake_tensor_ops_are_not_recorded(tmp_path):
    """Ops traced on fake tensors never ran: not recorded, and their missing data never read."""
    proc = subprocess.run([sys.executable, "-c", _FAKE, str(tmp_path / "d")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = opscope.load(tmp_path / "d").records().to_pandas()
    assert table.query("op == 'aten.mm.default'")["call"].nunique() == 1  # the real matmul only


def test_strip_wrapped_and_graph_module_paths():
    from types import SimpleNamespace

    from opscope.capture.torch.compiled import module_of, source_of

    assert strip_wrapped("_orig_mod.layers.0._orig_mod.fc1") == "layers.0.fc1"
    assert strip_wrapped("_orig_mod") == "" and strip_wrapped("layers.0") == "layers.0"

    def node(*fqns: str) -> SimpleNamespace:
        return SimpleNamespace(meta={"nn_module_stack": {f"k{i}": (f, object) for i, f in enumerate(fqns)}})
    assert module_of(node("L['self'].layers.0", "L['self'].layers.0.fc1")) == "layers.0.fc1"
    assert module_of(node("L['self']._modules['layers']._modules['0']")) == "layers.0"
    assert module_of(node("L['model']._orig_mod.head")) == "head"
    assert module_of(SimpleNamespace(meta={})) == ""
    # a wrapper called as func(*args) (transformers' deprecation wrapper): the module is args[0]
    assert source_of(node("L['args'][0].model.layers.0")) == ("L['args'][0]", "model.layers.0")


# A model whose compiled forward graph-breaks: a data-dependent branch inside each block, an
# explicit break after the first; the blocks' graphs run once per block. Trained 3 steps compiled
# (backend="eager") and uncompiled, each under a dump of steps 0 and 1; prints the losses of both.
_BREAKS = textwrap.dedent("""
    import json, os, sys
    import torch, torch._dynamo
    from torch import nn
    import opscope

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)

        def forward(self, x):
            h = self.act(self.fc1(x))
            if h.sum() > 0:  # data-dependent: dynamo breaks the graph here
                h = h * 2
            return self.fc2(h) + x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            x = self.blocks[0](x)
            torch._dynamo.graph_break()
            x = self.blocks[1](x)  # one block's graphs, run again for the next
            x = self.blocks[2](x)
            return self.head(x)

    def run(path, compiled):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        runner = torch.compile(model, backend="eager") if compiled else model
        losses = []
        with opscope.dump(path, steps=[0, 1], level="aten", data="statistics", overwrite=True) as d:
            for i in range(3):
                x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
                opt.zero_grad()
                loss = runner(x).square().mean()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                d.step()
        return losses

    out = sys.argv[1]
    print(json.dumps({"compiled": run(os.path.join(out, "compiled"), True),
                      "eager": run(os.path.join(out, "eager"), False)}))
""")


def test_graph_breaks_keep_phases_steps_and_module_paths(tmp_path):
    """Several graphs per forward, from frames of submodules (dynamo drops their module
    hooks) and resumed frames: backward and optimizer are still recorded, steps end where
    they do, every op keeps its full module path, and a compare against the uncompiled run
    finds nothing."""
    proc = subprocess.run([sys.executable, "-c", _BREAKS, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    assert losses["compiled"] == losses["eager"]
    dump = _check_dump(tmp_path / "compiled", "eager", "recorded")
    assert len(dump.manifest["compiled"]["graphs"]) > 2  # the breaks were real
    tables = {name: opscope.load(tmp_path / name).records().to_pandas() for name in ("compiled", "eager")}
    for name, table in tables.items():
        assert set(table["step"]) == {0, 1}, name
        assert set(table["phase"]) == {"forward", "backward", "optimizer"}, name
    compiled, eager = tables["compiled"], tables["eager"]
    assert compiled.groupby(["step", "phase"]).size().to_dict() == eager.groupby(["step", "phase"]).size().to_dict()
    for phase in ("forward", "backward"):
        modules = {name: set(t[t["phase"] == phase]["module"].fillna("")) for name, t in tables.items()}
        assert modules["compiled"] == modules["eager"], phase
    assert {"blocks.0.fc1", "blocks.1.fc2", "blocks.2.act", "head"} <= set(compiled["module"])
    result = opscope.compare(tmp_path / "compiled", tmp_path / "eager")
    assert result.verdict == "identical", result.verdict
    assert not result.culprits and result.counts["unpaired_target"] == result.counts["unpaired_reference"] == 0


_TWICE = textwrap.dedent("""
    import sys, torch
    import opscope
    from opscope.demo.models import mlp_task

    def fused(gm, example_inputs):  # a backend of its own: its kernels are opaque to a dump
        return lambda *args: gm(*args)

    @torch.compile(backend=fused)  # a compiled function (Hugging Face's losses are), no module
    def loss_of(logits, targets):
        return torch.nn.functional.cross_entropy(logits, targets)

    model, opt, batch = mlp_task(batch=8, d_in=16, hidden=16, depth=2)
    for name in ("first", "second"):  # no dynamo reset between: the second dump reuses the graph
        with opscope.dump(sys.argv[1] + "/" + name, level="aten") as d:
            for i in range(2):
                inputs, targets = batch(i)
                loss_of(model(inputs), targets).backward()
                opt.step()
                opt.zero_grad()
                d.step()
""")


def test_a_graph_compiled_under_an_earlier_dump_is_recorded_by_the_next(tmp_path):
    """Dynamo keeps compiled graphs for the process: a second dump (a notebook's second cell,
    a second window) runs the graphs the first one wrapped. Before, those ran unrecorded:
    the second dump had no graph call and its loss no producer."""
    proc = subprocess.run([sys.executable, "-c", _TWICE, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = {name: opscope.load(tmp_path / name).records().to_pandas() for name in ("first", "second")}
    for name, table in tables.items():
        graph = table.query("op == 'compiled_graph_0' and phase == 'forward'")
        assert set(graph.step) == {0, 1} and {"input", "output"} <= set(graph.io), name
    first, second = (opscope.load(tmp_path / n).manifest["compiled"]["graphs"] for n in ("first", "second"))
    assert [g["graph"] for g in second] == [g["graph"] for g in first] == ["compiled_graph_0"]


# A forward that dynamo gives up on (a graph break under no_grad in a block called from a
# loop: "Failed to handle graph break gracefully"), so Net.forward runs eagerly while its
# blocks compile. Its embedding's output is 3-D: shape and device are read one after the
# other, as Hugging Face models do before torch.arange. Trained 2 steps compiled without a
# dump, then compiled and uncompiled under a dump of LEVEL on each PATH; prints losses and
# what the dumps recorded.
_FALLBACK = textwrap.dedent("""
    import json, os, sys
    import torch, torch._dynamo
    from torch import nn
    import opscope

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            with torch.no_grad():
                n = torch.nonzero(x > 0).shape[0]
            return self.lin(x) * (n > 0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.layers = nn.Embedding(10, 8), nn.ModuleList([Block(), Block()])

        def forward(self, ids):
            h = self.emb(ids)
            pos = torch.arange(h.shape[1], device=h.device)
            for layer in self.layers:
                h = layer(h)
            return h.square().mean() + pos.sum() * 0

    def run(compiled, path=None, **keys):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Net()
        runner = torch.compile(model, backend="eager") if compiled else model
        losses = []
        with opscope.dump(path, steps=[0, 1], overwrite=True, **keys) if path else open(os.devnull) as d:
            for n in (3, 5):
                loss = runner(torch.randint(0, 10, (2, n), generator=torch.Generator().manual_seed(n)))
                loss.backward()
                losses.append(loss.item())
                if path:
                    d.step()
        return losses

    out, level = sys.argv[1], sys.argv[2]
    found = {"bare": run(True)}
    for backend in ("native", "python"):
        os.environ["OPSCOPE_DUMP_BACKEND"] = backend
        for compiled in (True, False):
            name = f"{backend}-{'compiled' if compiled else 'eager'}"
            found[name] = run(compiled, os.path.join(out, name), level=level)
    print(json.dumps(found))
""")


@pytest.mark.parametrize("level", ["api", "module"])
def test_a_forward_dynamo_gives_up_on_runs_and_is_recorded(tmp_path, level):
    """Dynamo runs such a forward eagerly but compiled opscope's hooks and torch-function
    mode as frames of their own. Before: at the api level the model got ``x.device`` as a
    ``torch.Size`` (code compiled for ``x.shape``, torch 2.13 guards no ``func``) and died in
    ``torch.arange``; at the module level the forward's modules were missing (a compiled hook
    saw ``is_compiling()`` and returned). Now: the same losses, the same calls in the same
    modules as the uncompiled run; a compare finds every pair identical (the graphs' own
    rows have no counterpart in the uncompiled run)."""
    proc = subprocess.run([sys.executable, "-c", _FALLBACK, str(tmp_path), level], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    assert losses["native-compiled"] == losses["python-compiled"] == losses["bare"]
    for backend in ("native", "python"):
        tables = {kind: opscope.load(tmp_path / f"{backend}-{kind}").records().to_pandas()
                  for kind in ("compiled", "eager")}
        calls = {kind: {(m, op) for m, op in zip(t["module"].fillna(""), t["op"])
                        if not op.startswith("compiled_graph")} for kind, t in tables.items()}
        wanted = {("", "torch.arange"), ("emb", "torch.nn.functional.embedding")} if level == "api" else \
            {("", "Net"), ("emb", "Embedding"), ("layers.0", "Block"), ("layers.1", "Block")}
        assert wanted <= calls["compiled"], (backend, calls["compiled"])
        assert calls["compiled"] <= calls["eager"], backend
        result = opscope.compare(tmp_path / f"{backend}-compiled", tmp_path / f"{backend}-eager")
        counts = result.counts
        assert not result.culprits and counts["identical"] == counts["pairs"] > 0, (backend, counts)
        if level == "api":  # (module level: the blocks' Linear runs inside a graph, no hooks)
            assert counts["unpaired_reference"] == 0, (backend, counts)
