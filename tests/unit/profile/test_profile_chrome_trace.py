from __future__ import annotations

import gzip
import json

from opscope.profile.chrome_trace import TraceWriter, merge, span


def read_trace(path):
    with gzip.open(path, "rt") as handle:
        return json.load(handle)



def test_writer_and_merge_produce_valid_trace(tmp_path) -> None:
    paths = []
    for rank in (0, 1):
        writer = TraceWriter(tmp_path / f"t{rank}.json.gz", rank)
        writer.event(span("forward", rank, 2, 0.0, 10.0, {"step": 1, "name": "</script>"}))
        paths.append(writer.finish({"rank": rank}))
    merged = merge(paths, tmp_path / "all.json.gz")
    data = read_trace(merged)
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["pid"] for e in spans) == [0, 1]
    assert not (tmp_path / "all.json.gz.partial").exists()


def test_abort_leaves_a_partial_file_that_says_so(tmp_path) -> None:
    writer = TraceWriter(tmp_path / "t.json.gz", 0)
    writer.event(span("step 0", 0, 1, 0.0, 1.0))
    partial = writer.abort("step 3 raised")
    assert partial.name.endswith(".partial") and not (tmp_path / "t.json.gz").exists()
    data = read_trace(partial)
    assert data["otherData"]["status"] == "partial"
