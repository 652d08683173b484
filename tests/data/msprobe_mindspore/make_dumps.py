"""Write the msprobe MindSpore fixtures of this folder (msprobe 26.2.0, MindSpore 2.10 CPU,
PyNative). Run with an environment holding both (never opscope's test environment):

    /work/ms-venv/bin/python make_dumps.py [OUT_DIR]     # default: this folder

One process per dump (msprobe's debugger is a process-wide singleton). The only change to
msprobe: ``mindspore.mint.norm`` is replaced by a NumPy norm before msprobe is imported,
because MindSpore's CPU build has no ``LinalgVectorNorm`` kernel and msprobe computes every
tensor's ``Norm`` statistic with ``mint.norm`` (unpatched, the dump fails with
"The kernel LinalgVectorNorm unregistered"). Everything written is msprobe's own output.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# case -> (task, fault, fp16)
CASES = {
    "ref": ("tensor", "none", False), "rerun": ("tensor", "none", False), "fault": ("tensor", "fc", False),
    "stat_ref": ("statistics", "none", False), "stat_fault": ("statistics", "fc", False),
    "fp16": ("tensor", "none", True),
}


def run(out: str, task: str, fault: str, fp16: bool) -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import mint, nn, ops

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)

    class Block(nn.Cell):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.fc = nn.Dense(8, 8)
            if fp16:
                self.fc.to_float(ms.float16)
            self.norm = nn.LayerNorm((8,))
            self.scale = 1.01 if (fault == "fc" and i == 1) else None  # the fault: layer 1's Dense output x1.01

        def construct(self, x):
            h = self.fc(x)
            if self.scale is not None:
                h = h * self.scale
            h = ops.gelu(h) * 0.5
            return self.norm(h + x)

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.CellList([Block(i) for i in range(3)])
            self.head = nn.Dense(8, 4)

        def construct(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    # the one change: MindSpore's CPU build has no LinalgVectorNorm kernel behind mint.norm
    mint.norm = lambda t: ms.Tensor(np.float32(np.linalg.norm(t.asnumpy().astype(np.float64).ravel())))
    from msprobe.mindspore import PrecisionDebugger

    cfg = Path(tempfile.mkdtemp()) / "config.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": out, "rank": [], "step": [], "level": "mix",
                               "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                              "summary_mode": "statistics"},
                               "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}))
    debugger = PrecisionDebugger(config_path=str(cfg))
    net = Net()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    rng = np.random.default_rng(0)
    for _ in range(2):
        x = ms.Tensor(rng.standard_normal((4, 8)).astype(np.float32))
        y = ms.Tensor(rng.integers(0, 4, 4).astype(np.int32))
        debugger.start(model=net)
        _, grads = grad_fn(x, y)
        opt(grads)
        debugger.stop()
        debugger.step()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        run(sys.argv[2], *CASES[sys.argv[3]][:2], CASES[sys.argv[3]][2])
    else:
        root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
        for name in CASES:
            subprocess.run([sys.executable, __file__, "--one", str(root / name), name], check=True)
