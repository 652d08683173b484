"""Write the MindSpore Data Dumps under tests/data/mindspore/ (real dumps, written by MindSpore).

MindSpore 2.10.0 (CPU, GRAPH_MODE, e2e dump of tensors), in its own environment (the wheel
is ~800 MB, so opscope's test environment does not install it)::

    python3.11 -m venv /work/ms-venv && /work/ms-venv/bin/pip install mindspore==2.10.0 numpy
    /work/ms-venv/bin/python tests/data/mindspore/make_dumps.py            # every case
    /work/ms-venv/bin/python tests/data/mindspore/make_dumps.py fault      # one case

Each case trains the same tiny transformer-like net (two blocks of softmax self-attention
without projections, residual, LayerNorm, Dense-GELU-Dense, residual, LayerNorm; a Dense
head; sparse softmax cross entropy; SGD) for two steps on the same batch, with MindSpore's
dump on, into ``<case>/``. ``reference`` and ``rerun`` dump both steps (iterations 0 and
1), the other cases step 0 only (size). Cases:

- ``reference``: the net as written.
- ``rerun``: the same run again (a separate process).
- ``fault``: ``b1.norm2``'s LayerNorm epsilon is 1e-1 instead of 1e-7 (one layer).
- ``fp16``: the LayerNorms and GELUs in float16 (``Cell.to_float``; each block casts their
  results back to the input's dtype, a no-op in float32), everything else in float32.
  Not the whole net: on CPU, MindSpore 2.10 runs MatMul in float32 even in a float16 net,
  and its dump then writes those float32 outputs under a Float16 name (half their bytes, so
  the values are garbage); the reader refuses such files (it checks each file's dtype
  against the kernel's device dtype in the IR), but a net made mostly of them would leave
  little to compare. The attention's two products are ``ops.MatMul`` primitives.
- ``inserted``: ``b1`` scales its MLP output by 1.001 (an extra Mul; ×1.0 would be folded).

Not committed (size), made on demand with ``run_case("act", Path(OUT))``: ``act``, ``b1``'s
GELU replaced by a ReLU.

To keep the fixtures small, two things MindSpore wrote are trimmed after each run: the
binary graph (``graphs/*.pb``) is deleted, and the ``# In file ...`` source-trace comment
lines of the text IR (``graphs/*.ir``) are dropped; every other byte is MindSpore's.
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
CASES = ("reference", "rerun", "fault", "fp16", "inserted")
BATCH, DIM, HIDDEN, CLASSES, STEPS = 4, 8, 16, 3, 2


def run_case(case: str, out: Path, input_output: int = 0) -> None:
    """Train two steps of the case's net with MindSpore's Data Dump writing into ``out``
    (``input_output``: the dump config's, 0 inputs and outputs, 1 inputs only, 2 outputs only)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    iterations = "all" if case in ("reference", "rerun") else "0"
    config = {"common_dump_settings": {"dump_mode": 0, "path": str(out), "net_name": "Net",
                                       "iteration": iterations, "saved_data": "tensor", "input_output": input_output,
                                       "kernels": [], "support_device": [0]},
              "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    config_path = out.parent / f".{case}_dump_config.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "MINDSPORE_DUMP_CONFIG": str(config_path), "GLOG_v": "3"}
    with tempfile.TemporaryDirectory() as scratch:  # where MindSpore leaves its compile files
        subprocess.run([sys.executable, __file__, "--train", case], check=True, env=env, cwd=scratch)
    config_path.unlink()
    for pb in out.glob("rank_*/graphs/*.pb"):
        pb.unlink()
    for ir in out.glob("rank_*/graphs/*.ir"):
        lines = ir.read_text(encoding="utf-8").splitlines(keepends=True)
        ir.chmod(0o644)
        ir.write_text("".join(x for x in lines if not x.lstrip().startswith("# In file")), encoding="utf-8")


def train(case: str) -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)

    class Block(nn.Cell):
        def __init__(self, eps: float = 1e-7, scale: float | None = None) -> None:
            super().__init__()
            self.softmax = nn.Softmax(axis=-1)
            self.scores = ops.MatMul(transpose_b=True)
            self.mix = ops.MatMul()
            self.norm1 = nn.LayerNorm((DIM,), epsilon=1e-7)
            self.fc1 = nn.Dense(DIM, HIDDEN)
            self.act = nn.GELU()
            self.fc2 = nn.Dense(HIDDEN, DIM)
            self.norm2 = nn.LayerNorm((DIM,), epsilon=eps)
            self.scale = scale

        def construct(self, x):  # noqa: ANN001, ANN202 (MindSpore graph code)
            scores = self.softmax(self.scores(x, x) * (DIM ** -0.5))
            h = self.norm1(x + self.mix(scores, x)).astype(x.dtype)
            mlp = self.fc2(self.act(self.fc1(h)).astype(x.dtype))
            if self.scale is not None:
                mlp = mlp * self.scale
            return self.norm2(h + mlp).astype(x.dtype)

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.b0 = Block()
            self.b1 = Block(eps=1e-1 if case == "fault" else 1e-7,
                            scale=1.001 if case == "inserted" else None)
            if case == "act":
                self.b1.act = nn.ReLU()
            self.head = nn.Dense(DIM, CLASSES)

        def construct(self, x):  # noqa: ANN001, ANN202
            return self.head(self.b1(self.b0(x)))

    net = Net()
    if case == "fp16":  # see the docstring: MatMul stays float32
        for block in (net.b0, net.b1):
            for cell in (block.norm1, block.act, block.norm2):
                cell.to_float(ms.float16)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    with_loss = nn.WithLossCell(net, loss)
    step = nn.TrainOneStepCell(with_loss, nn.SGD(net.trainable_params(), learning_rate=0.1))
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((BATCH, DIM)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32))
    for _ in range(STEPS):
        print(case, float(step(x, y).asnumpy()))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--train"]:
        train(argv[1])
        return 0
    for case in argv or CASES:
        if case not in CASES:
            raise SystemExit(f"unknown case {case!r}; cases: {', '.join(CASES)}")
        run_case(case, HERE / case)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
