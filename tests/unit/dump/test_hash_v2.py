"""wsum64-v2 tells apart what wsum64-v1 did not (a Mixtral routing mask whose top-2 experts
swap order for one token), and every implementation computes the same bits: the C kernel's
portable loops, AVX2 and AVX-512 paths, the numpy reference and the torch reductions."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from opscope.capture.torch import stats
from opscope.model.hashing import content_hash, wsum64_v1


def routing_masks() -> list[torch.Tensor]:
    """int64 one-hot [64, 2, 5] of top-2 expert indices; token 4 picks experts (1, 2) in the
    first and (2, 1) in the second: its ones move from words 82, 94 to 84, 92."""
    top = torch.randn(64, 5, generator=torch.Generator().manual_seed(0)).topk(2, dim=-1).indices
    top[4] = torch.tensor([1, 2])
    swapped = top.clone()
    swapped[4] = torch.tensor([2, 1])
    return [torch.nn.functional.one_hot(t, 5) for t in (top, swapped)]


KERNEL = "import torch\n" + inspect.getsource(routing_masks) + textwrap.dedent("""
    import json
    from opscope.capture.torch.native import _fastats
    from opscope.capture.torch.stats import CODES

    def h(t):
        return _fastats.stats(t.data_ptr(), t.numel(), CODES[t.dtype])[7]

    torch.manual_seed(0)
    masks = routing_masks()
    cases = []
    for dt in CODES:
        for n in (1, 2, 3, 5, 17, 33, 4097, 32768 * 2 + 3):
            t = torch.randn(n + 1).to(dt) if dt.is_floating_point else torch.randint(-9, 9, (n + 1,)).to(dt)
            for view in (t[:n], t[1:]):  # the second starts off any 4-byte boundary for narrow dtypes
                cases.append([str(dt), n, h(view), bytes(view.contiguous().view(torch.uint8).numpy()).hex()])
    print(json.dumps({"path": _fastats.SIMD_PATH, "mask": [h(m) for m in masks],
                      "mask_as_float32": [h(m.view(torch.float32)) for m in masks], "cases": cases}))
""")



def _kernel(path: str) -> dict:
    env = {**os.environ, "OPSCOPE_NO_SIMD": "0", "OPSCOPE_SIMD": path}
    proc = subprocess.run([sys.executable, "-c", KERNEL], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_swapped_mask_collided_in_v1_and_differs_in_v2_in_numpy_and_torch():
    a, b = routing_masks()
    words = [np.flatnonzero(m.numpy().reshape(-1).view(np.uint32)).tolist() for m in (a, b)]
    assert sorted(set(words[0]) ^ set(words[1])) == [82, 84, 92, 94]  # the case met on Mixtral
    assert wsum64_v1(a.numpy()) == wsum64_v1(b.numpy())
    ref = [content_hash(m.numpy()) for m in (a, b)]
    assert ref[0] != ref[1]
    assert [stats.materialize_one(stats.device_stats(m))[9] for m in (a, b)] == ref  # torch reductions


@pytest.mark.skipif(stats._fastats is None, reason="built without a C compiler")
@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_c_kernel_tells_the_swapped_masks_apart_and_equals_the_reference(path):
    out = _kernel(path)
    if out["path"] != path:
        pytest.skip(f"this CPU has no {path}: the {out['path']} kernels run here")
    ref = [content_hash(m.numpy()) for m in routing_masks()]
    assert out["mask"][0] != out["mask"][1]
    assert out["mask"] == out["mask_as_float32"] == ref  # int64 and the float32 path, same words
    for dtype, n, got, raw in out["cases"]:
        assert got == content_hash(np.frombuffer(bytes.fromhex(raw), dtype=np.uint8)), (dtype, n)


def test_torch_reductions_equal_the_reference_on_unaligned_views():
    base = torch.randn(203).to(torch.bfloat16)
    for view in (base[1:100], base[3:4], base[:0]):
        raw = view.contiguous().view(torch.uint8).numpy()
        assert stats.materialize_one(stats.device_stats(view))[9] == content_hash(raw)


def test_the_int64_torch_hash_for_tensors_past_2_31_words_equals_the_int32_one():
    """Word indices of 2^31 and more take int64 arithmetic; on smaller tensors both are the reference."""
    for t in (torch.randn(1001).to(torch.bfloat16)[1:], torch.randint(-9, 9, (77,)), torch.randn(64, 3)):
        words = stats._words_of(t)
        want = content_hash(t.contiguous().view(torch.uint8).numpy())
        assert int(stats._hash_words(t)) & (2**64 - 1) == int(stats._hash_words64(words)) & (2**64 - 1) == want
