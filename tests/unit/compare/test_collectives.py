"""collectives.settle: a value a collective brought from the other ranks is explained by a
divergence any rank had before it; where none had, and every rank of the run was compared
with identical inputs to it, the collective itself is named."""

from __future__ import annotations

from opscope.compare.collectives import received_gradients, settle
from opscope.compare.result import Finding


def finding(rank: int, step: int, phase: str, seq: int, op: str, kind: str = "culprit") -> Finding:
    return Finding(kind=kind, rank=rank, step=step, phase=phase, module="", op=op, call=0, io="output",
                   slot=0, seq=seq, metrics={})


ALLREDUCE = "c10d.allreduce_.default"


def test_a_divergence_before_the_collective_explains_it():
    findings = [finding(1, 0, "forward", 200, "aten.gelu.default")]
    fed = [finding(0, 0, "backward", 640, ALLREDUCE)]
    notes = settle(findings, fed, {(0, 0, 640): True, (1, 0, 640): False}, set(), {0, 1})
    assert [f.op for f in findings] == ["aten.gelu.default"]
    assert notes == ["rank 0 first differs at step 0 (backward) where c10d.allreduce_.default brought what the "
                     "other ranks sent: rank 1 diverged before, at aten.gelu.default (step 0, forward)"]


def test_a_divergence_after_it_does_not():
    findings = [finding(1, 0, "optimizer", 900, "aten.addcdiv_.default")]
    fed = [finding(0, 0, "backward", 640, ALLREDUCE), finding(1, 0, "backward", 640, ALLREDUCE)]
    settle(findings, fed, {(0, 0, 640): True, (1, 0, 640): True}, set(), {0, 1})
    named = [f for f in findings if f.op == ALLREDUCE]
    assert len(named) == 1 and named[0].rank == 0  # one finding per collective call
    assert "inputs are identical on every rank compared (ranks 0-1)" in named[0].note


def test_inputs_that_differ_somewhere_or_a_rank_not_compared_name_nothing():
    fed = [finding(0, 0, "backward", 640, ALLREDUCE)]
    for inputs, missing in (({(0, 0, 640): True, (1, 0, 640): False}, set()), ({(0, 0, 640): True}, {1})):
        findings: list[Finding] = []
        notes = settle(findings, fed, inputs, missing, {0, 1})
        assert findings == []
        assert notes == ["rank 0 first differs at step 0 (backward) where c10d.allreduce_.default brought what "
                         "the other ranks sent; no rank compared diverged before (compare every rank to see "
                         "where it came from)"]


def test_gradients_a_rank_received_from_a_diverged_rank_are_no_roots():
    act = finding(1, 0, "forward", 52, "SiLUActivation")
    grads = [finding(0, 0, "optimizer", 103 + i, "AdamW.step", kind="root") for i in range(2)]
    for i, g in enumerate(grads):
        g.io, g.param = "grad", f"w{i}"
    own = finding(0, 1, "forward", 10, "aten.mul.Tensor")  # a later culprit of rank 0 stays
    findings = [act, *grads, own]
    notes = received_gradients(findings)
    assert findings == [act, own]
    assert notes == ["rank 0's gradients of w0, w1 differ at step 0 where the optimizer reads them, with no producer "
                     "recorded (this level does not see the gradient all-reduce): what the other ranks sent: rank 1 "
                     "diverged before, at SiLUActivation (step 0, forward)"]
    alone = [grads[0]]  # no other rank diverged before: a root stays a root
    assert received_gradients(alone) == [] and alone == [grads[0]]
