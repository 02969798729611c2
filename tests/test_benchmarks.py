"""Every benchmark script runs at its --smoke size and prints valid JSON records.

Each script runs as `python -m benchmarks.<name> --smoke --out TMP` in a
subprocess (its children prepare their own devices), so this only proves
that the scripts still run against the current library and write their
results; the figures themselves are meaningless at this size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_runs import REPO, measurements, run_module, run_smoke

pytestmark = pytest.mark.slow  # minutes of child processes; CI runs them (make test-slow)


def test_learner_smoke(tmp_path):
    records = measurements(run_smoke("learner", tmp_path))
    seen = {(r["engine"], r["mode"], r["towers"]) for r in records}
    assert {
        ("ours", "minibatch", 1),
        ("ours", "epoch", 1),
        ("ours", "epoch", 2),
        ("ceiling", "minibatch", 1),
        ("ceiling", "fused", 1),
        ("ceiling", "fused_adam_kernel", 1),
    } <= seen
    assert all(r["samples_per_s"] > 0 for r in records)
    assert (tmp_path / "learner_mlp.png").exists()


def test_replica_engine_smoke(tmp_path):
    records = measurements(run_smoke("replica_engine", tmp_path))
    engines = {(r["engine"], r["replicas"]) for r in records}
    assert engines == {("bare", 1), ("mirrored", 2), ("towers", 2)}
    assert all(r["samples_per_s"] > 0 and r["samples_per_cpu_s"] > 0 for r in records)
    saved = json.loads((tmp_path / "replica_engine.json").read_text())
    assert set(saved["meta"]["recommended_threads"]) == {"2"}


def test_replica_engine_breakdown_smoke(tmp_path):
    records = measurements(
        run_smoke(
            "replica_engine",
            tmp_path,
            "--breakdown",
            "--replicas",
            "2",
            result="replica_engine_breakdown",
        )
    )
    assert {r["variant"] for r in records} == {
        "full",
        "no_result_check",
        "no_cond",
        "minimal",
        "one_device",
        "captured",
    }


def test_inference_smoke(tmp_path):
    records = measurements(run_smoke("inference", tmp_path))
    targets = {(r["target"], r.get("batching")) for r in records}
    assert {
        ("noop", None),
        ("noop_serial", None),
        ("policy", "on"),
        ("policy", "off"),
        ("in_process", None),
    } <= targets
    remote = [r for r in records if r["target"] == "policy"]
    assert all(r["calls"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in remote)


def test_sampler_smoke(tmp_path):
    records = measurements(run_smoke("sampler", tmp_path))
    assert {(r["inference"], r["num_envs"]) for r in records} == {("local", 8), ("remote", 8)}
    assert all(r["env_steps"] > 0 for r in records)


def test_e2e_smoke(tmp_path):
    records = measurements(run_smoke("e2e", tmp_path))
    assert records[0]["env_steps"] > 0 and records[0]["iterations"] >= 1


@pytest.mark.slow
def test_async_training_smoke_ours(tmp_path):
    """Our side only: RLlib's side needs torch in its own venv (a large download)."""
    records = measurements(run_smoke("async_training", tmp_path, "--sides", "ours"))
    throughput, to_target = records
    assert (throughput["workload"], throughput["side"]) == ("throughput", "ours")
    assert throughput["env_steps_sampled_per_s"] > 0 and throughput["samples_trained_per_s"] > 0
    assert 0 <= throughput["learner_idle_fraction"] <= 1
    assert 0 <= throughput["learner_queue_fill"] <= 1
    assert 0 <= throughput["env_runner_idle_fraction"] <= 1
    assert throughput["policy_lag_max"] >= throughput["policy_lag_mean"] >= 0
    assert to_target["workload"] == "to_450" and to_target["reached"]  # the smoke's target 15
    assert (tmp_path / "async_training_throughput.png").exists()


@pytest.mark.slow
def test_multi_agent_sampling_smoke_ours(tmp_path):
    """Our side only (runners acting, and the MultiPolicyActor acting): RLlib's side
    needs torch and PettingZoo in its own venv (a large download)."""
    pytest.importorskip("mpe2", reason="mpe2 is not installed: pip install -e '.[multiagent]'")
    records = measurements(
        run_smoke("multi_agent_sampling", tmp_path, "--sides", "ours,ours_remote")
    )
    assert {r["side"] for r in records} == {"ours", "ours_remote"}
    for record in records:
        assert record["sampling_phases"] >= 1 and record["env_steps_per_s"] > 0
        # simple_spread: every env step is a step of its 3 agents
        assert record["agent_steps_per_s"] == pytest.approx(3 * record["env_steps_per_s"])


def test_multi_agent_sampler_cpu_smoke(tmp_path):
    """The sampler in this checkout beside HEAD's, loaded from git (a ref the clone has)."""
    records = measurements(
        run_smoke("multi_agent_sampler_cpu", tmp_path, "--refs", "HEAD", "--envs", "1", "2")
    )
    assert [r["envs"] for r in records] == [1, 2]
    for record in records:
        assert set(record["us_per_env_step"]) == {"HEAD", "work"}
        assert all(v > 0 for v in record["us_per_env_step"].values())


@pytest.mark.slow
def test_atari_throughput_smoke(tmp_path):
    pytest.importorskip("ale_py", reason="ale-py is not installed: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="OpenCV is not installed: pip install -e '.[atari]'")
    records = run_smoke("atari_throughput", tmp_path)
    by_workload = {r["workload"]: r for r in measurements(records)}
    assert by_workload["env_step"]["cpu_s_per_frame"] > 0
    assert by_workload["train"]["obs_dtype"] == "uint8"  # 4x fewer bytes than float32
    assert by_workload["train"]["cpu_s_per_sample_pass"] > 0
    throughput = by_workload["throughput"]
    assert throughput["env_frames_sampled_per_s"] == pytest.approx(
        4 * throughput["agent_steps_sampled_per_s"]
    )
    assert throughput["samples_trained_per_s"] > 0
    (estimate,) = [r for r in records if r.get("workload") == "estimate"]
    assert estimate["frames_per_s_sampled_and_trained"] == min(
        estimate["frames_per_s_env_bound"], estimate["frames_per_s_gpu_bound"]
    )
    assert (tmp_path / "atari_throughput.png").exists()


def gpu_benchmarks(tmp_path: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    """scripts/gpu_benchmarks.sh at smoke size, as on a machine without GPUs."""
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        SMOKE="1",
        NVIDIA_SMI="false",  # nvidia-smi lists no GPU
        PYTHON=sys.executable,
        PYTHONPATH=str(REPO),
        **env_extra,
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_benchmarks.sh"), *args, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_gpu_benchmarks_script_smoke(tmp_path):
    """The learner sweeps of scripts/gpu_benchmarks.sh --fake-gpus run end to end:
    the script says it found no GPU and measures fake GPUs, and each step leaves
    its results."""
    proc = gpu_benchmarks(tmp_path, "--fake-gpus")
    assert "no GPU found" in proc.stderr and "fake GPUs" in proc.stderr
    printed = {}
    for name in ("learner_group", "learner"):
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        printed[name] = [json.loads(line) for line in lines if line.strip()]
        assert printed[name] and not [r for r in printed[name] if "error" in r], name
        assert json.loads((tmp_path / f"{name}.json").read_text())["meta"]["smoke"] is True
    assert {"mlp", "lstm", "cnn"} <= {r.get("model") for r in printed["learner"]}
    # the all-reduce probe found the step's collective tensors at its first trace
    (probe,) = [r for r in printed["learner_group"] if "per_learner" in r]
    assert probe["tensors"] > 0 and probe["elements"] > 0
    assert [p["retraced_step"] for p in probe["per_learner"]] == [False, False]


@pytest.mark.slow
def test_gpu_benchmarks_all_passes_each_script_flags_it_accepts(tmp_path):
    """--all adds the other scripts, each of which has its own smoke run above: here
    the dry run's commands are parsed by each script's own flags, so a flag the
    script no longer takes fails this test without running the script twice."""
    proc = gpu_benchmarks(tmp_path, "--fake-gpus", "--all", DRY_RUN="1")
    commands = [
        line[2:].split()
        for line in proc.stderr.splitlines()
        if line.startswith("+ ") and " -m benchmarks." in line
    ]
    scripts = [words[words.index("-m") + 1] for words in commands]
    assert scripts == [
        "benchmarks.learner",
        "benchmarks.learner",
        "benchmarks.replica_engine",
        "benchmarks.inference",
        "benchmarks.sampler",
        "benchmarks.e2e",
    ]
    for words in commands:
        module = words[words.index("-m") + 1]
        argv = words[words.index("-m") + 2 :]
        check = subprocess.run(
            [
                sys.executable,
                "-c",
                "import importlib, sys; from benchmarks import harness; "
                "m = importlib.import_module(sys.argv[1]); "
                "harness.parse_args(m.__doc__, m.add_flags, sys.argv[2:])",
                module,
                *argv,
            ],
            cwd=REPO,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert check.returncode == 0, f"{' '.join(words)}: {check.stderr[-2000:]}"


def test_serve_smoke(tmp_path):
    records = measurements(run_smoke("serve", tmp_path))
    assert {(r["target"], r["clients"]) for r in records} == {
        (t, n)
        for t in ("ceiling", "ceiling/body", "policy/batcher", "policy/serve")
        for n in (1, 16)
    }
    assert all(
        r["requests"] > 0 and r["failures"] == 0 and r["p99_ms"] >= r["p50_ms"] for r in records
    )
    assert all(r["mean_batch_size"] >= 1 for r in records if r["target"] == "policy/batcher")
    saved = json.loads((tmp_path / "serve.json").read_text())
    policy_rows = [row for row in saved["summary"] if row["target"].startswith("policy")]
    assert len(policy_rows) == 4
    assert all(row["vs_ceiling"] > 0 and row["vs_ceiling_body"] > 0 for row in policy_rows)


def test_client_local_smoke(tmp_path):
    records = measurements(run_smoke("client_local", tmp_path))
    assert {r["target"] for r in records} == {"bare", "exported"}
    assert all(r["actions_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in records)
    saved = json.loads((tmp_path / "client_local.json").read_text())
    assert {row["target"]: row["vs_bare"] > 0 for row in saved["summary"]} == {
        "bare": True,
        "exported": True,
    }


def test_pass_placement_smoke(tmp_path):
    records = measurements(run_smoke("pass_placement", tmp_path))
    assert {(r["placement"], r["callers"]) for r in records} == {
        (p, c) for p in ("thread", "loop") for c in (1, 4)
    }
    assert all(r["answers_per_s"] > 0 and r["rows_per_pass"] >= 1 for r in records)
    saved = json.loads((tmp_path / "pass_placement.json").read_text())
    assert all(row["vs_thread"] > 0 for row in saved["summary"] if row["placement"] == "loop")


def test_startup_prints_its_phases():
    """startup.py prints one JSON line (it is not a harness script: no --smoke size)."""
    proc = run_module("benchmarks.startup", "--algo", "ppo", "--runners", "1")
    phases = json.loads(proc.stdout.strip().splitlines()[-1])
    assert phases["algorithm_build_s"] > 0 and phases["learners_build_s"] > 0
    assert len(phases["runner_up_s"]) == len(phases["runner_process_start_s"]) == 1
    assert phases["runner_up_s"][0] > phases["runner_process_start_s"][0]
    assert len(phases["iteration_ends_s"]) >= 3 + phases["iterations_in_driver"]


def test_ppo_phases_prints_each_phase_in_wall_and_cpu_seconds():
    """ppo_phases.py prints one JSON line (no --smoke size: two steady iterations)."""
    proc = run_module("benchmarks.ppo_phases", "--iterations", "2")
    phases = json.loads(proc.stdout.strip().splitlines()[-1])
    for phase in ("build", "first_iteration", "second_iteration", "steady_iterations"):
        assert phases[f"{phase}_wall_s"] > 0 and phases[f"{phase}_cpu_s"] > 0, phase
    assert phases["steady_iterations"] == 2 and phases["env_steps"] > 0


def test_start_cpu_counts_the_processes_ray_started():
    """start_cpu.py ray: an embedded Ray's GCS, raylet and agents are started processes."""
    proc = run_module("benchmarks.start_cpu", "ray")
    step = json.loads(proc.stdout.strip().splitlines()[-1])
    assert step["step"] == "ray" and step["wall_s"] > 0
    assert step["started_processes"] >= 2 and step["started_processes_cpu_s"] > 0


def test_sac_step_smoke(tmp_path):
    """The bare TF SAC update and (when its virtualenv exists) SB3's are timed at k = 1
    and 8 SGD steps per call, our policy's and our loop's at k = 8 (each k compiles its
    own update), each with the update's FLOP count."""
    from benchmarks import compare_sb3

    runs = measurements(run_smoke("sac_step", tmp_path))
    seen = {(r["kind"], r["mode"], r["steps"]) for r in runs}
    assert {
        ("bare", "update", 1),
        ("bare", "update", 8),
        ("policy", "update", 8),
        ("policy", "loaded", 8),
        ("loop", "per env step", 8),
    } <= seen
    assert all(r["cpu_ms"] > 0 and r["update_flops"] > 0 for r in runs)
    python, skipped = compare_sb3.sb3_python()
    assert ({("sb3", "train", 8)} <= seen) == (python is not None), skipped
    bare = next(r for r in runs if r["kind"] == "bare")
    # the traced graph holds what the count needs, and the actor loss's unused
    # critic weight gradients
    assert bare["graph_matmul_flops"] >= bare["update_flops"]


def test_tune_overhead_smoke(tmp_path):
    """fit() and one Tune trial run the same iterations to the same return (the same
    seed), so the wall-time ratio is Tune's own cost."""
    from benchmarks import tune_overhead

    records = measurements(run_smoke("tune_overhead", tmp_path))
    by_mode = {r["mode"]: r for r in records}
    assert set(by_mode) == {"fit", "tune"}
    assert by_mode["fit"]["env_steps"] == by_mode["tune"]["env_steps"] > 0
    assert by_mode["fit"]["episode_return_mean"] == by_mode["tune"]["episode_return_mean"]
    assert all(r["wall_s"] > r["train_s"] > 0 for r in records)
    for record in records:  # every phase timed (they are consecutive: they sum to wall_s)
        phases = [record[p] for p in tune_overhead.PHASES if p in record]
        assert len(phases) == 5 and min(phases) >= 0
