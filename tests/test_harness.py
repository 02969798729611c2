"""benchmarks/harness.py's bundles of runs (together) and the child that measures one
(benchmarks/together.py): in process, no child started."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks import harness, together


def test_runs_are_bundled_per_interpreter_in_their_order_with_their_tags():
    rllib = ("/venv/bin/python", {"TF_USE_LEGACY_KERAS": "1"})
    planned = [
        harness.Run("benchmarks.learner", {"devices": 1, "threads": None}, tags={"side": "a"}),
        harness.Run("benchmarks.compare_rllib", {"workload": "learner"}, *rllib),
        harness.Run("benchmarks.inference", {"prepare_tf": False}, tags={"side": "a"}),
        harness.Run("benchmarks.compare_rllib", {"workload": "e2e", "prepare_tf": False}, *rllib),
    ]
    ours, theirs = harness.together(planned)
    assert ours.module == theirs.module == harness.TOGETHER_MODULE
    assert (ours.python, ours.env, theirs.python, theirs.env) == (None, None, *rllib)
    assert ours.spec == {
        "parts": [
            ["benchmarks.learner", {"devices": 1, "threads": None}, {"side": "a"}],
            ["benchmarks.inference", {"prepare_tf": False}, {"side": "a"}],
        ],
        "prepare_tf": True,
        "devices": 1,
        "threads": None,
    }
    # a run without prepare_tf configures TensorFlow (its default), on one device
    assert [theirs.spec[k] for k in ("prepare_tf", "devices", "threads")] == [True, 1, None]
    assert [part[1]["workload"] for part in theirs.spec["parts"]] == ["learner", "e2e"]


def test_runs_that_set_up_tensorflow_differently_get_a_child_each():
    planned = [
        harness.Run("benchmarks.learner", {"devices": 1, "engine": "ceiling"}),
        harness.Run("benchmarks.learner", {"devices": 2, "engine": "ours"}),
        harness.Run("benchmarks.learner", {"devices": 1, "threads": [1, None]}),
        harness.Run("benchmarks.e2e", {"prepare_tf": False}),  # joins the first
        harness.Run("benchmarks.learner", {"devices": 2, "engine": "ours", "model": "lstm"}),
    ]
    one, two, threads = harness.together(planned)
    assert [(b.spec["devices"], b.spec["threads"]) for b in (one, two, threads)] == [
        (1, None),
        (2, None),
        (1, [1, None]),
    ]
    assert [part[0] for part in one.spec["parts"]] == ["benchmarks.learner", "benchmarks.e2e"]
    assert [part[1] for part in two.spec["parts"]] == [planned[1].spec, planned[4].spec]
    assert [part[1] for part in threads.spec["parts"]] == [planned[2].spec]


def test_a_bundles_timeout_is_its_parts_sum():
    (bundle,) = harness.together(
        [harness.Run("m", {"max_seconds": 30}), harness.Run("m", {"max_seconds": 60})]
    )
    assert harness.timeout_of(lambda spec: spec["max_seconds"] + 300)(bundle.spec) == 690


def test_the_bundle_child_measures_each_part_and_goes_on_after_one_that_fails(monkeypatch):
    def measure(spec):
        if spec["fail"]:
            raise RuntimeError("part broke")
        yield {"bench": "fake", "round": spec["round"], "seed": spec["seed"], "n": spec["n"]}

    monkeypatch.setitem(sys.modules, "fake_bench", types.SimpleNamespace(measure=measure))
    spec = {
        "parts": [
            ["fake_bench", {"n": 1, "fail": False}, {"framework": "ours"}],
            ["fake_bench", {"n": 2, "fail": True, "workload": "e2e"}, {"framework": "x"}],
            ["fake_bench", {"n": 3, "fail": False}, {}],
        ],
        "round": 4,
        "seed": 7,
    }
    first, failed, last = together.measure(spec)
    assert first == {"framework": "ours", "bench": "fake", "round": 4, "seed": 7, "n": 1}
    assert failed["framework"] == "x" and failed["bench"] == "e2e" and failed["n"] == 2
    assert failed["error"] == "RuntimeError: part broke"
    assert "part broke" in failed["stderr_tail"]
    assert last == {"bench": "fake", "round": 4, "seed": 7, "n": 3}


LEFT_ALIVE: list = []  # actor handles a fake run leaves alive after it ends


@pytest.mark.slow  # two local Rays started, a 1 s wait: 37 s at load 37 here
def test_a_scripts_next_run_takes_its_ray_only_when_the_run_before_left_nothing(monkeypatch):
    """In a bundle child, a run of the same script with the same settings takes the Ray
    the run before left, unless that run left an actor alive (one holding no resource:
    a Serve controller would be joined by the next serve.start); the child stops its
    Ray at the end."""
    import ray

    monkeypatch.setattr(harness, "RAY_IDLE_WAIT_S", 1.0)

    @ray.remote(num_cpus=0)
    class Left:
        def ready(self) -> bool:
            return True

    def measure(spec):
        harness.ray_init(address="local", num_cpus=1, include_dashboard=False)
        try:
            if spec["leave_actor"]:
                LEFT_ALIVE.append(Left.remote())
                ray.get(LEFT_ALIVE[-1].ready.remote())
            yield {"node": ray.get_runtime_context().get_node_id()}
        finally:
            harness.ray_shutdown()

    monkeypatch.setitem(sys.modules, "fake_ray_bench", types.SimpleNamespace(measure=measure))
    parts = [["fake_ray_bench", {"leave_actor": leave}, {}] for leave in (False, True, False)]
    try:
        first, second, third = together.measure({"parts": parts, "round": 0})
    finally:
        LEFT_ALIVE.clear()
    assert first["node"] == second["node"] != third["node"]
    assert not ray.is_initialized()
