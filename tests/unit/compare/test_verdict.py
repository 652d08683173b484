"""Verdicts on synthetic dumps (numpy maths, real dump files): faults and benign differences."""

import pytest
import synth

import opscope


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return synth.mlp_run(tmp_path_factory.mktemp("ref") / "d", dtype="float64", steps=2)


def _compare(tmp_path, reference, **kw):
    target = synth.mlp_run(tmp_path / "t", steps=2, **kw)
    return opscope.compare(target, reference, workers=1)


@pytest.mark.parametrize("fault, module, op", [
    ("gelu_tanh", "act", "aten.gelu.default"),
    ("ln_eps", "norm", "aten.native_layer_norm.default"),
    ("insert_scale", "act", "aten.mul.Tensor"),
    ("nan", "fc2", "aten.mm.default"),
])
def test_fault_is_blamed_on_the_op_that_made_it(tmp_path, reference, fault, module, op):
    result = _compare(tmp_path, reference, fault=fault)
    first = result.first_divergence
    assert result.verdict == "diverged" and not result
    assert (first.kind, first.module, first.op, first.step, first.phase) == ("culprit", module, op, 0, "forward")
    # float64 reference: inputs agree to float32 rounding (times the op's conditioning: the
    # matmul's ||A||·||B|| / ||C||, ~2 here)
    assert first.metrics["input_error"] < 1e-6 * (4 if op == "aten.mm.default" else 1)


def test_changed_parameter_is_the_root(tmp_path, reference):
    result = _compare(tmp_path, reference, fault="param_row")
    first = result.first_divergence
    assert (first.kind, first.param, first.step) == ("root", "fc1.weight", 0)
    assert {c.kind for c in result.culprits} == {"root"}  # the mm after it inherits


@pytest.mark.parametrize("kw", [{}, {"dtype": "bfloat16"}, {"fault": "insert_cast"},
                                {"fault": "decompose_gelu"}, {"noise": 2e-7}])
def test_benign_differences_have_no_culprit(tmp_path, reference, kw):
    result = _compare(tmp_path, reference, **kw)
    assert result.verdict == "within_tolerance", [c.where for c in result.culprits]
    assert result.first_divergence is None and result


def test_same_run_twice_is_identical_from_hashes(tmp_path):
    a = synth.mlp_run(tmp_path / "a", steps=2)
    b = synth.mlp_run(tmp_path / "b", steps=2)
    result = opscope.compare(a, b)
    assert result.verdict == "identical"
    assert result.counts["identical"] == result.counts["pairs"] > 0
    assert set(result.pairs_table.column("mode").to_pylist()) == {"hash"}


def test_statistics_only_dumps_are_compared_and_say_the_verdict_is_weaker(tmp_path, reference):
    stats_ref = synth.mlp_run(tmp_path / "r", dtype="float64", data="statistics")
    target = synth.mlp_run(tmp_path / "t", fault="gelu_tanh", data="statistics")
    result = opscope.compare(target, stats_ref)
    assert result.statistics_only and "lower bound" in result.weaker
    assert (result.first_divergence.op, result.first_divergence.module) == ("aten.gelu.default", "act")
    healthy = opscope.compare(synth.mlp_run(tmp_path / "h", data="statistics"), stats_ref)
    assert healthy.verdict == "within_tolerance"


def test_unpaired_records_are_never_passed(tmp_path, reference):
    result = _compare(tmp_path, reference, fault="insert_cast")
    table = result.pairs_table.to_pylist()
    one_sided = [r for r in table if r["kind"] in ("unpaired", "identity")]
    assert one_sided and all(r["status"] == "unpaired" for r in one_sided)
    assert result.counts["unpaired_target"] == len(one_sided)


def test_verdict_pass_hook(tmp_path, reference):
    from opscope.compare import verdict

    seen = []

    def spy(state):
        seen.append(len(state.nodes))

    verdict.register_pass(spy)
    try:
        with pytest.raises(ValueError):
            verdict.register_pass(spy)
        _compare(tmp_path, reference)
    finally:
        verdict.VERDICT_PASSES.remove(spy)
    assert seen and seen[0] > 0
