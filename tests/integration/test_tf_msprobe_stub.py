"""msprobe 26.2 puts tensorboard's TensorFlow stub in ``sys.modules`` when it is imported; a
script that imports msprobe (an Ascend user's usual tool) and then dumps with opscope still
gets a dump of the real TensorFlow, and is told once what was repaired."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("msprobe")

SCRIPT = textwrap.dedent("""
    import sys
    {first}
    import numpy as np, keras
    import opscope.tensorflow as otf
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2, name="d")(inp))
    model.compile(optimizer="sgd", loss="mse")
    d = otf.dump(sys.argv[1], overwrite=True, steps="0")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=4, epochs=1, verbose=0,
              callbacks=[d.callback()])
""")


STUB = 'print("stub" if "tensorboard" in sys.modules["tensorflow"].__name__ else "real", flush=True)'
ORDERS = [f"import tensorflow, keras\nimport msprobe\n{STUB}",  # keras before msprobe: it imports
          f"import msprobe\n{STUB}\nimport opscope.tensorflow"]  # opscope before keras (keras alone fails)


@pytest.mark.parametrize("first", ORDERS)
def test_a_dump_after_importing_msprobe_records_real_tensorflow(tmp_path, first):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(first=first))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "d")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[0] == "stub"  # what msprobe left: the case under test
    assert "put the real TensorFlow back" in proc.stderr
    import opscope

    dump = opscope.load(tmp_path / "d")
    rows = dump.records(step=0).to_pandas()
    assert dump.status == "complete" and "d" in set(rows.module) and "tf.MatMul" in set(rows.op)
