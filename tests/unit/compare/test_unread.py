"""Memory that holds no data yet: the output of an empty-like op, and what an op that only
fills its first argument (dropout's bernoulli_, copy_'s destination) finds there.

Dumps since session 22 record both without statistics (a note says so) and compare them as
identical on both sides; dumps from before measured whatever bytes were there, and compare
still does not judge those."""

import numpy as np
import synth

import opscope
from opscope.model.calls import overwrites_first
from opscope.model.records import COL, NO_STATS, STATS, UNINITIALIZED_NOTE, UNREAD_NOTE


def _dropout_run(path, garbage: float, *, measured: bool):
    """empty_like -> bernoulli_ (mask) -> mul, twice; ``measured``: the old dumps' rows (the
    bytes bernoulli_ overwrites measured), else today's (recorded with a note, no statistics)."""
    run = synth.Run(path)
    rng = np.random.default_rng(0)
    for _ in range(2):
        x0 = run.leaf(rng.standard_normal((4, 8)))
        (x,) = run.op("aten.mul.Tensor", [x0], [x0.value * 1.0])
        junk = np.full((4, 8), garbage)
        (buf,) = run.op("aten.empty_like.default", [x], [junk])
        mask = (np.arange(32).reshape(4, 8) % 3 > 0).astype(np.float64)
        (m,) = run.op("aten.bernoulli_.float", [buf], [mask])
        run.op("aten.mul.Tensor", [x, m], [x.value * m.value])
        for row in run.rows:  # empty_like's output: never measured
            if row[COL["op"]] == "aten.empty_like.default" and row[COL["io"]] == "output":
                row[COL["note"]], row[STATS] = UNINITIALIZED_NOTE, NO_STATS
            elif row[COL["op"]] == "aten.bernoulli_.float" and row[COL["io"]] == "input" and not measured:
                row[COL["note"]], row[STATS] = UNREAD_NOTE, NO_STATS
        run.end_step()
    run.close()
    return path


def test_rows_without_data_on_both_sides_are_identical(tmp_path):
    a = _dropout_run(tmp_path / "a", 1.0, measured=False)
    b = _dropout_run(tmp_path / "b", 7.0, measured=False)
    result = opscope.compare(a, b, workers=1)
    assert result.verdict == "identical", result.counts
    assert result.counts["skipped"] == 0


def test_garbage_measured_by_older_dumps_is_not_judged(tmp_path):
    a = _dropout_run(tmp_path / "a", 1.0, measured=True)
    b = _dropout_run(tmp_path / "b", 7.0, measured=True)
    result = opscope.compare(a, b, workers=1)
    assert result.verdict == "within_tolerance" and not result.culprits, [c.where for c in result.culprits]
    pairs = result.pairs
    drawn = pairs[(pairs.op == "aten.bernoulli_.float") & (pairs.io == "input")]
    assert len(drawn) == 2 and (drawn.note == "overwritten without being read").all()


def test_which_ops_overwrite_their_first_argument():
    assert overwrites_first("aten.copy_.default") and overwrites_first("Tensor.bernoulli_")
    assert overwrites_first("zero_") and not overwrites_first("aten.add_.Tensor")
    assert not overwrites_first("Tensor.copy") and not overwrites_first("Dropout")


def test_a_read_through_another_view_takes_the_output_with_its_bytes_as_producer():
    """Swin's pooler backward fills a zeroed buffer through a strided view (copy_) and reads
    the whole buffer back (as_strided): the capture gives that read no producer."""
    from opscope.compare.api import link_same_bytes

    def row(i, io, digest, numel=128, lo=-1.0, hi=1.0, producer=None):
        return {"id": i, "io": io, "hash": digest, "numel": numel, "dtype": "float16", "min": lo, "max": hi,
                "producer": producer}
    rows = [row(0, "output", 11), row(1, "output", 22), row(2, "input", 11), row(3, "input", 33),
            row(4, "output", 44, lo=1.0, hi=1.0), row(5, "input", 44, lo=1.0, hi=1.0), row(6, "input", 22, producer=1)]
    link_same_bytes(rows)
    assert [r["producer"] for r in rows] == [None, None, 0, None, None, None, 1]  # a constant: left alone
