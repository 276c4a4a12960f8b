"""Autotuning: CSA's candidate plans, each correct; the fastest kept (the model's unless
clearly beaten), saved and loaded, and explained."""
import json

import numpy as np
import pytest

import csa
import cso
from cso import autotune
from microkernels import cache

from .machines import AVX2
from .reference import conv2d_reference


def test_candidates_start_with_the_model_and_differ():
    spec = csa.ConvSpec.parse("n1c64h56w56k64r3s3p1u1")
    for threads in (1, 2):
        found = csa.tuning_candidates(spec, AVX2, threads)
        assert found[0] == ({}, csa.analyze(spec, AVX2, threads=threads))
        plans = [plan for _, plan in found]
        assert 4 <= len(plans) <= csa.TUNE_CANDIDATES
        assert all(a != b for i, a in enumerate(plans) for b in plans[i + 1:])
        kinds = {(p.vectors_along, p.slab) for p in plans}
        assert {("windows", False), ("windows", True), ("filters", True)} <= kinds
        assert {p.schedule for p in plans} == {"IS", "WS"}
        if threads == 2:
            assert {(1, 1), (2, 1)} <= {p.split for p in plans}
    # a depthwise convolution: its thread splits only
    dw = csa.ConvSpec.parse("n1c32h28w28k32r3s3p1u1g32")
    assert [o for o, _ in csa.tuning_candidates(dw, AVX2, 2)] == [{}, {"split": (1, 1)}]
    assert csa.tuning_candidates(dw, AVX2, 1) == [({}, csa.analyze(dw, AVX2))]


@pytest.mark.parametrize("name", ["n2c24h13w11k20r3s3p1u1", "n1c40h9w9k36r3s3p1u2",
                                  "n1c16h10w12k24r1s1p0u1", "n1c12h7w7k18r3s3p1u1g3"])
def test_every_candidate_plan_computes_the_convolution(name, rng):
    spec = csa.ConvSpec.parse(name)
    x = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    expected = conv2d_reference(x, w, stride=spec.stride, padding=spec.padding, groups=spec.groups)
    t, b, left, right = spec.padding
    candidates = csa.tuning_candidates(spec, cso.host_machine(), 2)
    assert len(candidates) > 3
    for overrides, plan in candidates:
        conv = cso.Conv2d(w, stride=spec.stride, padding=((t, b), (left, right)),
                          groups=spec.groups, plan_overrides=overrides)
        cso.set_num_threads(2)
        try:
            np.testing.assert_allclose(conv(x), expected, rtol=1e-4, atol=1e-4,
                                       err_msg=str(overrides))
        finally:
            cso.set_num_threads(1)


def test_the_model_plan_is_kept_unless_clearly_beaten():
    assert autotune.choose([1.0, 0.99, 1.2]) == 0
    assert autotune.choose([1.0, 0.9, 0.95]) == 1
    assert autotune.choose([1.0, 1.1, 0.96]) == 2
    assert autotune.choose([1.0]) == 0


def test_tuned_plans_run_correct_explained_saved_and_loaded(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    name = "n1c32h20w20k48r3s3p1u1"
    [(spec, record)] = cso.tune([name], budget=0.05)
    assert str(spec) == name and record["spec"] == name
    timed = record["timed"]
    assert timed[0]["overrides"] == {} and len(timed) > 3
    seconds = [t["seconds"] for t in timed]
    assert record["model_seconds"] == seconds[0]
    kept = autotune.choose(seconds)
    assert (record["overrides"], record["seconds"]) == (timed[kept]["overrides"], seconds[kept])
    assert all(t["predicted"] is None or 0 < t["predicted"] < 1 for t in timed)
    # saved: the file holds the record; loading it gives the same
    [path] = tmp_path.rglob("tuned-*.json")
    assert json.loads(path.read_bytes()[32:]) == record
    assert cache.load_record(path, autotune.VERSION) == record
    # a Conv2d with tune=True runs the kept plan, correct, and says where it came from
    x = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    conv = cso.Conv2d(w, padding=1, tune=True)
    np.testing.assert_allclose(conv(x), conv2d_reference(x, w, padding=(1, 1, 1, 1)),
                               rtol=1e-4, atol=1e-4)
    plan = conv.plan_for(x.shape)
    assert plan == csa.analyze(spec, cso.host_machine(), threads=cso.get_num_threads(),
                               **record["overrides"])
    assert f"plan: tuned on this host ({record['date']}): the fastest of {len(timed)}" \
        in plan.explain()
    assert "plan: from the model" in cso.Conv2d(w, padding=1).plan_for(x.shape).explain()
    assert "tune=True" in repr(conv)


def test_tune_arguments_are_checked():
    w = np.zeros((4, 4, 3, 3), np.float32)
    with pytest.raises(ValueError, match="cannot take plan_overrides"):
        cso.Conv2d(w, tune=True, plan_overrides={"schedule": "IS"})
    with pytest.raises(TypeError, match="tune must be True or False"):
        cso.Conv2d(w, tune="yes")
    with pytest.raises(TypeError, match="tune: convolutions must be csa.ConvSpec"):
        cso.tune([3])
