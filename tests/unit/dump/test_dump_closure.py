"""optimizer.step(closure) (Lightning, LBFGS): the closure's forward and backward ops keep
their phases, the update is the optimizer's, and the gradients it reads are recorded."""

import pytest
import torch

import opscope


def _run(path, optimizer_class, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = optimizer_class(model.parameters(), **kwargs)
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with opscope.dump(path, level="aten") as d:
        for _ in range(2):
            opt.step(closure)
            d.step()
    return opscope.load(path).records().to_pandas()


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("optimizer_class,kwargs", [(torch.optim.SGD, {"lr": 0.1}),
                                                    (torch.optim.LBFGS, {"max_iter": 3})])
def test_closure_ops_keep_their_phases(tmp_path, monkeypatch, optimizer_class, kwargs, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    df = _run(tmp_path / "d", optimizer_class, **kwargs)
    phase_of = df.groupby("op")["phase"].agg(set)
    assert phase_of["aten.tanh.default"] == {"forward"}
    assert phase_of["aten.tanh_backward.default"] == {"backward"}
    grads = df[(df.phase == "optimizer") & (df.io == "grad")]
    assert set(grads.param) >= {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert grads["norm"].notna().all() and (grads["norm"] > 0).all()  # read after the closure's backward
    assert (grads.groupby(["step", "param"]).size() == 1).all()  # once a step, also when LBFGS calls it again
