"""Write ``tests/data/mindspore/ops/``: a real MindSpore Data Dump of one forward call of a
small net that uses the common op types replay maps to torch (opscope/replay/mindspore_ops.py),
so that the table is checked against what MindSpore's own kernels computed.

MindSpore 2.10.0 (CPU, GRAPH_MODE, e2e dump of tensors), in its own environment::

    /work/ms-venv/bin/python tests/data/mindspore/make_replay_ops.py

Trimmed as make_dumps.py trims (``graphs/*.pb`` deleted, ``# In file`` IR lines dropped).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def dump(out: Path) -> None:
    """Run :func:`forward` in a child process with MindSpore's dump writing into ``out``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = {"common_dump_settings": {"dump_mode": 0, "path": str(out), "net_name": "Net", "iteration": "all",
                                       "saved_data": "tensor", "input_output": 0, "kernels": [],
                                       "support_device": [0]},
              "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    config_path = out.parent / ".ops_dump_config.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "MINDSPORE_DUMP_CONFIG": str(config_path), "GLOG_v": "3"}
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, __file__, "--forward"], check=True, env=env, cwd=scratch)
    config_path.unlink()
    for pb in out.glob("rank_*/graphs/*.pb"):
        pb.unlink()
    for ir in out.glob("rank_*/graphs/*.ir"):
        lines = ir.read_text(encoding="utf-8").splitlines(keepends=True)
        ir.write_text("".join(x for x in lines if not x.lstrip().startswith("# In file")), encoding="utf-8")


def forward() -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.bmm = ops.BatchMatMul(transpose_b=True)
            self.mean = ops.ReduceMean(keep_dims=True)
            self.total = ops.ReduceSum(keep_dims=False)
            self.top = ops.ReduceMax(keep_dims=True)
            self.log_softmax = nn.LogSoftmax(axis=-1)

        def construct(self, x, y):  # noqa: ANN001, ANN202 (MindSpore graph code)
            s = self.bmm(x, y)                                  # BatchMatMul
            s = ops.sigmoid(s) + ops.tanh(s) - ops.relu(s)      # Sigmoid, Tanh, ReLU, Add, Sub
            s = s / (ops.abs(s) + 1.5)                          # Abs, RealDiv
            m = self.mean(x, -1)                                # ReduceMean
            t = ops.transpose(x, (0, 2, 1))                     # Transpose
            r = ops.reshape(t, (2, 12)) * 1.5                   # Reshape, Mul
            e = ops.exp(m) + ops.sqrt(ops.square(x) + 1.0)      # Exp, Sqrt, Square
            h = ops.cast(e, ms.float16)                         # Cast
            return (s, self.total(r, 1), self.top(e, -1), self.log_softmax(r), ops.maximum(x, y),
                    ops.neg(h), ops.pow(ops.abs(x) + 0.5, 1.7))

    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    out = Net()(x, y)
    print([o.shape for o in out])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--forward"]:
        forward()
    else:
        dump(HERE / "ops")
