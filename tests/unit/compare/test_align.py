from opscope.compare.align import align_partition


class Rows:
    """Rows of one side: op calls with one input (the previous output) and one output."""

    def __init__(self):
        self.rows, self.next_id, self.seq, self.last = [], 0, 0, None

    def op(self, op, norm, module="m", shape=(4,)):
        call = sum(1 for r in self.rows if r["op"] == op and r["io"] == "output" and r["module"] == module)
        common = dict(rank=0, step=0, seq=self.seq, phase="forward", module=module, op=op, call=call)
        if self.last is not None:
            self.rows.append(dict(id=self.next_id, io="input", slot=0, producer=self.last, numel=4,
                                  shape=list(shape), norm=None, **common))
            self.next_id += 1
        self.rows.append(dict(id=self.next_id, io="output", slot=0, producer=None, numel=4, shape=list(shape),
                              norm=norm, **common))
        self.last = self.next_id
        self.next_id += 1
        self.seq += 1
        return self


def _pairs_by_seq(pairs):
    return {(p.t["seq"], p.r["seq"]) for p in pairs if p.t is not None and p.r is not None
            and p.kind != "identity" and p.t["io"] == "output"}


def test_identical_sequences_pair_by_position():
    t = Rows().op("mm", 1).op("mul", 2).op("add", 3)
    r = Rows().op("mm", 1).op("mul", 2).op("add", 3)
    pairs = align_partition(t.rows, r.rows)
    assert _pairs_by_seq(pairs) == {(0, 0), (1, 1), (2, 2)}
    assert {p.kind for p in pairs} == {"exact"}


def test_inserted_op_with_the_same_name_does_not_shift_pairs():
    # target: mm, mul (inserted, keeps the norm), mul, add; reference: mm, mul, add
    t = Rows().op("mm", 1.0).op("mul", 1.0).op("mul", 5.0).op("add", 6.0)
    r = Rows().op("mm", 1.0).op("mul", 5.0).op("add", 6.0)
    pairs = align_partition(t.rows, r.rows)
    assert _pairs_by_seq(pairs) == {(0, 0), (2, 1), (3, 2)}
    identity = [p for p in pairs if p.kind == "identity"]
    assert len(identity) == 1 and identity[0].t["seq"] == 1 and identity[0].r["seq"] == 0
    assert not [p for p in pairs if p.kind == "unpaired" and p.t is not None and p.t["io"] == "output"]


def test_inserted_op_on_the_reference_side_is_judged_there():
    t = Rows().op("mm", 1).op("add", 3)
    r = Rows().op("mm", 1).op("_to_copy", 1).op("add", 3)
    pairs = align_partition(t.rows, r.rows)
    identity = [p for p in pairs if p.kind == "identity"]
    assert len(identity) == 1 and identity[0].side == "reference" and identity[0].r["op"] == "_to_copy"
    assert identity[0].t["op"] == "mm"


def test_fused_versus_decomposed_pairs_the_region_output_by_data_flow():
    t = Rows().op("mm", 1).op("gelu", 2).op("add", 3)
    r = Rows().op("mm", 1).op("div", 9).op("erf", 8).op("mul", 2).op("add", 3)
    pairs = align_partition(t.rows, r.rows)
    flow = [p for p in pairs if p.kind == "flow"]
    assert [(p.t["op"], p.r["op"]) for p in flow] == [("gelu", "mul")]
    assert not [p for p in pairs if p.kind == "identity"]
    unpaired_ref_ops = {p.r["op"] for p in pairs if p.kind == "unpaired" and p.r is not None}
    assert unpaired_ref_ops == {"div", "erf", "mul"}


def test_reordered_ops_of_different_sizes_do_not_pair_by_name():
    t = Rows().op("detach", 1, shape=(4,)).op("detach", 2, shape=(8,))
    r = Rows().op("detach", 2, shape=(8,)).op("detach", 1, shape=(4,))
    for row in t.rows + r.rows:
        row["numel"] = row["shape"][0]
    pairs = align_partition(t.rows, r.rows)
    for p in pairs:
        if p.t is not None and p.r is not None and p.t["io"] == "output":
            assert p.t["numel"] == p.r["numel"]


def test_a_long_group_is_checked_once_not_once_a_call(monkeypatch):
    """A module's calls that match one to one are checked once (each check walks the whole
    group: once a call made a real model's compare quadratic, 334,756 checks for 5,120 pairs)."""
    import opscope.compare.align as align
    import opscope.compare.call_match as call_match

    checks = []
    real = call_match.matchable
    for module in (align, call_match):
        monkeypatch.setattr(module, "matchable", lambda a, b: checks.append(1) or real(a, b))
    t, r = Rows(), Rows()
    for i in range(300):
        t.op("add" if i % 2 else "mul", float(i))
        r.op("add" if i % 2 else "mul", float(i))
    pairs = align_partition(t.rows, r.rows)
    assert len(_pairs_by_seq(pairs)) == 300 and {p.kind for p in pairs} == {"exact"}
    assert len(checks) == 300


def _attention_call(keywords):
    """One module call's input rows: hidden states by position, then tensors by keyword."""
    common = dict(rank=0, step=0, seq=0, phase="forward", module="layers.0.self_attn", op="LlamaAttention",
                  call=0, producer=None, numel=4, shape=[4], norm=1.0)
    rows = [dict(id=0, io="input", slot=0, arg=None, **common)]
    rows += [dict(id=i + 1, io="input", slot=i + 1, arg=k, **common) for i, k in enumerate(keywords)]
    rows.append(dict(id=len(rows), io="output", slot=0, arg=None, **{**common, "seq": 1}))
    return rows


def _keyword_pairs(pairs):
    return {(p.t.get("arg"), p.r.get("arg")) for p in pairs
            if p.t is not None and p.r is not None and p.t["io"] == "input"}


def test_keyword_inputs_pair_by_keyword_where_one_side_passes_none():
    """Eager attention gets a mask tensor, sdpa's gets attention_mask=None (no tensor, no row):
    by slot, the eager mask paired with sdpa's position_ids and each cos/sin with the next."""
    eager = _attention_call(["attention_mask", "position_ids", "position_embeddings", "position_embeddings"])
    sdpa = _attention_call(["position_ids", "position_embeddings", "position_embeddings"])
    pairs = align_partition(eager, sdpa)
    assert _keyword_pairs(pairs) == {(None, None), ("position_ids", "position_ids"),
                                     ("position_embeddings", "position_embeddings")}
    by_slot = {(p.t["slot"], p.r["slot"]) for p in pairs if p.t is not None and p.r is not None
               and p.t["io"] == "input"}
    assert by_slot == {(0, 0), (2, 1), (3, 2), (4, 3)}  # cos with cos, sin with sin
    mask = [p for p in pairs if p.t is not None and p.t.get("arg") == "attention_mask"]
    assert len(mask) == 1 and mask[0].r is None, "the eager side's mask has no partner"


def test_an_unnamed_row_still_pairs_by_slot_with_a_named_one():
    """A peer tool's dump may name no argument: slot pairing stays for it."""
    named = _attention_call(["attention_mask"])
    unnamed = _attention_call(["attention_mask"])
    for r in unnamed:
        r["arg"] = None
    pairs = align_partition(named, unnamed)
    assert {(p.t["slot"], p.r["slot"]) for p in pairs if p.t is not None and p.r is not None
            and p.t["io"] == "input"} == {(0, 0), (1, 1)}


def test_a_module_call_returning_one_more_tensor_still_pairs():
    """Eager attention returns its weights too; under sdpa they are None: the call's inputs and
    first output pair, the weights stay one-sided (before, nothing of the call paired)."""
    eager = _attention_call(["attention_mask"])
    sdpa = _attention_call(["attention_mask"])
    weights = dict(eager[-1], id=len(eager), slot=1, shape=[4, 4], numel=16)
    pairs = align_partition([*eager, weights], sdpa)
    paired = {(p.t["io"], p.t["slot"]) for p in pairs if p.t is not None and p.r is not None}
    assert paired == {("input", 0), ("input", 1), ("output", 0)}
    assert [p.t["slot"] for p in pairs if p.kind == "unpaired" and p.t is not None] == [1]


def test_an_aten_op_returning_another_count_of_tensors_does_not_pair():
    t = Rows().op("aten.max.dim", 1.0)
    r = Rows().op("aten.max.dim", 1.0)
    t.rows.append(dict(t.rows[-1], id=99, slot=1))
    pairs = align_partition(t.rows, r.rows)
    assert not [p for p in pairs if p.t is not None and p.r is not None and p.kind != "identity"]


def test_an_op_pairs_with_its_in_place_form():
    """The autograd engine sums two gradients with add_ where it may reuse the buffer, add where
    not (a fault elsewhere in the graph changes which): the same values, paired as one op."""
    t = Rows().op("aten.mm.default", 1.0).op("aten.add_.Tensor", 2.0).op("aten.mul.Tensor", 3.0)
    r = Rows().op("aten.mm.default", 1.0).op("aten.add.Tensor", 2.0).op("aten.mul.Tensor", 3.0)
    pairs = align_partition(t.rows, r.rows)
    assert _pairs_by_seq(pairs) == {(0, 0), (1, 1), (2, 2)}
    add_input = [p for p in pairs if p.t is not None and p.t["op"] == "aten.add_.Tensor" and p.t["io"] == "input"]
    assert len(add_input) == 1 and add_input[0].r is not None and add_input[0].r["op"] == "aten.add.Tensor", \
        "its inputs pair too (what it read: before, only its output paired, by data flow)"
    t = Rows().op("aten.mm.default", 1.0).op("aten.add_.Tensor", 2.0)
    r = Rows().op("aten.mm.default", 1.0).op("aten.sub.Tensor", 2.0)
    assert _pairs_by_seq(align_partition(t.rows, r.rows)) == {(0, 0)}, "another op is no in-place form"


def _reads(side, order):
    """Calls of one module each reading one buffer (ModernBERT's rotary module, once per
    attention type), in ``order``."""
    rows = []
    for seq, name in enumerate(order):
        common = dict(rank=0, step=0, seq=seq, phase="forward", module="rotary", op="aten.mul.Tensor", call=seq)
        rows.append(dict(id=3 * seq, io="input", slot=0, producer=None, numel=4, shape=[4], norm=1.0, **common))
        rows.append(dict(id=3 * seq + 1, io="param", slot=1, param=f"rotary.{name}_inv_freq", producer=None,
                         numel=4, shape=[4], norm=2.0, **common))
        rows.append(dict(id=3 * seq + 2, io="output", slot=0, producer=None, numel=4, shape=[4], norm=3.0, **common))
    return rows


def test_calls_reading_parameters_in_another_order_pair_by_the_names_they_read():
    pairs = align_partition(_reads("target", ["full", "sliding"]), _reads("reference", ["sliding", "full"]))
    params = [(p.t["param"], p.r["param"]) for p in pairs if p.t is not None and p.r is not None
              and p.t["io"] == "param"]
    assert sorted(params) == [("rotary.full_inv_freq", "rotary.full_inv_freq"),
                              ("rotary.sliding_inv_freq", "rotary.sliding_inv_freq")]
    same = align_partition(_reads("target", ["full", "sliding"]), _reads("reference", ["full", "sliding"]))
    assert {p.kind for p in same} == {"exact"}, "the same order pairs by position, as before"


def _chain(ops):
    """One op after another, each reading the last one's output: (op, input norm, output norm)."""
    rows = []
    for seq, (op, norm_in, norm_out) in enumerate(ops):
        common = dict(rank=0, step=0, seq=seq, phase="forward", module="", op=op, call=seq, numel=1, shape=[])
        rows.append(dict(id=2 * seq, io="input", slot=0, producer=2 * seq - 1 if seq else None, norm=norm_in,
                         **common))
        rows.append(dict(id=2 * seq + 1, io="output", slot=0, producer=None, norm=norm_out, **common))
    return rows


def test_a_tie_of_outputs_is_broken_by_the_inputs():
    # CLIP's loss (a + b) / 2, then the loop's loss / 1, against a compiled graph that made the loss
    t = _chain([("compiled_graph_0", 1.0, 2.0), ("aten.div.Tensor", 2.0, 2.0)])
    r = _chain([("aten.add.Tensor", 1.0, 4.0), ("aten.div.Tensor", 4.0, 2.0), ("aten.div.Tensor", 2.0, 2.0)])
    pairs = align_partition(t, r)
    divs = [(p.t["seq"], p.r["seq"]) for p in pairs if p.t is not None and p.r is not None
            and p.t["op"] == "aten.div.Tensor" and p.t["io"] == "output"]
    assert divs == [(1, 2)], "the loop's division, which reads what the graph returned"


def test_the_matchability_table_is_matchable_cell_by_cell():
    """The alignment judges each kind of call once (op, outputs' shapes and element counts) instead
    of each cell; every cell must still say what matchable says of its two calls: in-place
    twins (add / add_), a module's call with an extra output, shapes missing on one side."""
    import random

    from opscope.compare.align import OpCall
    from opscope.compare.call_match import matchable, matchable_table

    rng = random.Random(0)
    ops = ["aten.add.Tensor", "aten.add_.Tensor", "aten.mul.Tensor", "aten.view.default", "Linear", "layer",
           "aten.__iand__.Tensor", "aten.__iand_.Tensor"]
    shapes = [[4], [2, 2], [4, 1], None]

    def call(side, seq):
        outs = [dict(io="output", shape=rng.choice(shapes), numel=rng.choice([4, 4, 8]))
                for _ in range(rng.randint(0, 2))]
        ins = [dict(io="input", shape=[4], numel=4)]
        return OpCall(side, seq, "forward", "m", rng.choice(ops), ins + outs)

    cells = []
    for _ in range(30):
        tc = [call("target", i) for i in range(rng.randint(1, 12))]
        rc = [call("reference", i) for i in range(rng.randint(1, 12))]
        table = matchable_table(tc, rc)
        assert table == [[matchable(a, b) for b in rc] for a in tc]
        cells += [cell for row in table for cell in row]
    assert 20 <= sum(cells) <= len(cells) / 2  # both answers, often
