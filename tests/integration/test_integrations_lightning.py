"""Lightning's real ``Trainer`` (a tiny module, accumulate_grad_batches=2): opscope's steps are
its optimizer steps, with automatic step detection around ``trainer.fit()`` and with
``OpscopeCallback``. Lightning runs the last micro-batch's forward and backward inside
``optimizer.step(closure)``: the profile still times them as forward and backward."""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

import opscope  # noqa: E402
from opscope.integrations.lightning import OpscopeCallback  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from integration_checks import check_driven, driven_sessions  # noqa: E402

torch.set_num_threads(1)
STEPS, MICRO = 4, 2
NAP = 0.02  # seconds each forward sleeps: a floor for the forward phase that no load can lower


class _Net(torch.nn.Linear):
    """Records each forward (time, the session's step index, the Trainer's global step) on
    its ``owner``, then naps."""

    owner = None

    def forward(self, x):
        owner = self.owner
        owner.forwards.append((time.perf_counter_ns(), getattr(owner.session, "step_index", None),
                               owner.trainer.global_step))
        time.sleep(NAP)
        return super().forward(x)


class _Tiny(L.LightningModule):
    """Records each micro-batch's forward (in its net) and loss."""

    def __init__(self, session=None) -> None:
        super().__init__()
        self.net = _Net(8, 2)
        object.__setattr__(self.net, "owner", self)  # not a submodule
        self.session, self.forwards, self.losses = session, [], []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, module, callbacks=()) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(4 * STEPS * MICRO, 8), torch.randint(0, 2, (4 * STEPS * MICRO,)))
    trainer = L.Trainer(max_steps=STEPS, accumulate_grad_batches=MICRO, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(tmp_path / "pl"), callbacks=list(callbacks))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))


def _per_step() -> list[int]:
    return [i // MICRO for i in range(STEPS * MICRO)]


def test_profile_around_fit_times_each_optimizer_step(tmp_path) -> None:
    module = _Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p", steps="1-2", task_trace=True) as p:
            _fit(tmp_path, module)
    rows = p.result.steps
    assert [r.step for r in rows] == list(range(STEPS))
    assert [r.step for r in rows if r.task_trace] == [1, 2]
    for row in rows:  # step k holds micro-batches 2k and 2k+1
        start, end = p.origin + row.start_ns, p.origin + row.start_ns + row.wall_ns
        assert [i for i, f in enumerate(module.forwards) if start <= f[0] <= end] == [MICRO * row.step + j
                                                                                    for j in range(MICRO)]
        assert row.phases["forward"] > 0 and row.phases["backward"] > 0 and row.phases["optimizer"] > 0
        # the closure's forward and backward are timed as such, not swallowed by the optimizer phase
        assert row.phases["forward"] >= MICRO * NAP * 1e9
        assert row.phases["optimizer"] < NAP * 1e9 or row.step == 0  # step 0: the first step's setup


def test_dump_around_fit_names_optimizer_steps(tmp_path) -> None:
    session = opscope.dump(tmp_path / "d", level="module", data="statistics", steps="1-2")
    module = _Tiny(session)
    with session:
        _fit(tmp_path, module)
    assert [index for _, index, _ in module.forwards] == _per_step()
    assert [global_step for _, _, global_step in module.forwards] == _per_step()
    assert opscope.load(tmp_path / "d").steps() == [1, 2]


def test_callback_drives_dump_profile_and_monitor(tmp_path) -> None:
    dump, profile, monitor = driven_sessions(tmp_path)
    module = _Tiny(dump)
    _fit(tmp_path, module, [OpscopeCallback(dump=dump, profile=profile, monitor=monitor)])
    assert [index for _, index, _ in module.forwards] == _per_step()
    # the monitor's loss: the mean of each step's two micro-batch losses
    expected = [sum(module.losses[MICRO * s:MICRO * (s + 1)]) / MICRO for s in range(STEPS)]
    check_driven(tmp_path / "d", dump, profile, monitor, STEPS, expected, [0.1] * STEPS, rel=1e-5)


def test_callback_stops_its_sessions_when_fit_raises(tmp_path) -> None:
    profile = opscope.profile(tmp_path / "p")

    class _Broken(_Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("injected at batch 3")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="injected"):
        _fit(tmp_path, _Broken(), [OpscopeCallback(profile=profile)])
    assert profile.state == "stopped"
    assert [r.step for r in profile.result.steps] == [0, 1]
    assert not profile.result.steps[1].complete  # the step that raised
