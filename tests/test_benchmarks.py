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

pytestmark = pytest.mark.slow  # minutes of child processes; CI runs them (make test-slow)

REPO = Path(__file__).resolve().parent.parent


def run_module(module: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository, asserted to exit 0."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_smoke(
    name: str, tmp_path: Path, *extra: str, timeout: float = 900, result: str | None = None
) -> list[dict]:
    proc = run_module(
        f"benchmarks.{name}", "--smoke", "--out", str(tmp_path), *extra, timeout=timeout
    )
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert records, f"{name} printed no records; stderr: {proc.stderr[-2000:]}"
    errors = [r for r in records if "error" in r]
    assert not errors, json.dumps(errors, indent=1)[-4000:]
    saved = json.loads((tmp_path / f"{result or name}.json").read_text())
    assert saved["meta"]["smoke"] is True
    assert len(saved["records"]) == len([r for r in records if not r.get("summary")])
    for plot in saved["meta"]["plots"]:
        assert (tmp_path / plot).stat().st_size > 0
    return records


def measurements(records: list[dict]) -> list[dict]:
    return [r for r in records if not r.get("summary")]


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
    assert {(r["inference"], r["num_envs"]) for r in records} == {
        ("local", 1),
        ("local", 8),
        ("remote", 1),
        ("remote", 8),
    }
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


@pytest.mark.slow
def test_compare_rllib_smoke(tmp_path):
    """Needs RLlib's own venv; the script creates it (pip) when missing."""
    records = run_smoke("compare_rllib", tmp_path, timeout=1800)
    ratios = [r for r in records if r.get("summary")]
    assert {r["workload"] for r in ratios} == {"learner", "sampler", "inference", "e2e"}
    # e2e with a remote rollout worker: RLlib's weight sync needs its Keras 2 setup
    e2e = [r for r in measurements(records) if r["bench"] == "e2e"]
    assert {(r["framework"], r["num_env_runners"]) for r in e2e} == {("ours", 1), ("rllib", 1)}
    assert all(r["env_steps"] > 0 for r in e2e)


@pytest.mark.parametrize(
    "intensity, rounds, env_steps_per_sgd_step",
    [
        (None, [1, 1], 4.0),  # one SGD step per 4-step fragment
        (16.0, [1, 2], 2.0),  # native ratio 32 / 4 = 8: train twice per fragment
        (4.0, [2, 1], 8.0),  # sample two fragments per SGD step
    ],
)
def test_rllib_dqn_settings_translation(intensity, rounds, env_steps_per_sgd_step):
    """Our target_network_update_freq counts SGD steps, RLlib's sampled env steps:
    RLlib's is ours x the env steps RLlib samples per SGD step."""
    from benchmarks import dqn_e2e, rllib_dqn

    ours, fragment = dqn_e2e.resolved_config(
        {
            "rollout_fragment_length": 4,
            "train_batch_size": 32,
            "training_intensity": intensity,
            "target_network_update_freq": 100,
            "prioritized_replay": False,
            "model": {"fcnet_hiddens": [64], "fcnet_activation": "relu"},
        }
    )
    settings = rllib_dqn.rllib_settings(ours, fragment)
    assert settings["notes"]["round_robin_weights"] == rounds
    assert settings["training"]["target_network_update_freq"] == round(100 * env_steps_per_sgd_step)
    assert settings["training"]["replay_buffer_config"] == {
        "type": "MultiAgentReplayBuffer",
        "capacity": 50000,
    }
    assert settings["training"]["model"] == {"fcnet_hiddens": [64], "fcnet_activation": "relu"}
    assert settings["env_runners"]["rollout_fragment_length"] == 4


@pytest.mark.parametrize(
    "returns, max_env_steps, started_s_ago, stopped_by, steps",
    [
        ([10.0, 460.0, 470.0], 10_000, 0, "target", 2000),
        ([10.0, 20.0, 30.0], 2000, 0, "max_env_steps", 2000),
        ([10.0, 20.0, 30.0], 10_000, 1e4, "max_seconds", 1000),
    ],
)
def test_dqn_train_to_target_stops_by_each_rule(
    returns, max_env_steps, started_s_ago, stopped_by, steps
):
    """Both sides of the dqn workload stop by this rule, checked after each iteration."""
    import time

    from benchmarks.dqn_e2e import train_to_target

    results = iter([(1000 * (i + 1), r) for i, r in enumerate(returns)])
    outcome = train_to_target(
        lambda: next(results), 450.0, max_env_steps, 600.0, time.perf_counter() - started_s_ago
    )
    assert (outcome["stopped_by"], outcome["env_steps"]) == (stopped_by, steps)
    assert outcome["reached"] == (stopped_by == "target")
    assert outcome["iterations"] == steps // 1000 == len(outcome["history"])
    assert outcome["best_return"] == max(returns[: steps // 1000])


@pytest.mark.slow
@pytest.mark.rllib
def test_compare_rllib_dqn_smoke(tmp_path):
    """Both sides of the dqn workload build (RLlib's through its replay buffer patch),
    sample, learn and report; needs RLlib's venv and the tuned DQN config."""
    records = run_smoke("compare_rllib", tmp_path, "--workloads", "dqn", timeout=1800)
    runs = [r for r in measurements(records) if r["bench"] == "dqn"]
    assert {r["framework"] for r in runs} == {"ours", "rllib"}
    from benchmarks.dqn_e2e import SMOKE_MAX_ENV_STEPS

    for run in runs:
        assert run["env_steps"] >= SMOKE_MAX_ENV_STEPS and run["iterations"] >= 1
        assert run["final_return"] > 0 and run["wall_s"] > 0
    rows = [r for r in records if r.get("summary")]
    assert [r["seed"] for r in rows] == [0, "median"]
    assert rows[0]["ours_env_steps"] >= SMOKE_MAX_ENV_STEPS
    assert rows[0]["rllib_env_steps"] >= SMOKE_MAX_ENV_STEPS


@pytest.mark.slow
def test_ppo_parity_smoke(tmp_path):
    """Ours (and an ablation) beside RLlib's PPO at its defaults; needs RLlib's venv."""
    records = run_smoke("ppo_parity", tmp_path, "--variants", "defaults,keras_init", timeout=1800)
    rows = {r["variant"]: r for r in records if r.get("summary")}
    assert set(rows) == {"defaults", "keras_init", "rllib"}
    assert all(r["reached"] == "1/1" and r["env_steps"] > 0 for r in rows.values())


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


@pytest.mark.rllib
def test_serve_rllib_smoke(tmp_path):
    """Both training servers and the Serve ceiling serve episodes from client processes;
    needs the RLlib 2.35 venv (.venv-rllib-server; the script makes it when missing)."""
    from benchmarks import serve_rllib

    records = measurements(run_smoke("serve_rllib", tmp_path, timeout=2400))
    assert {(r["target"], r["clients"]) for r in records} == {
        (t, n) for t in serve_rllib.TARGETS for n in (1, 4)
    }
    assert all(r["per_client_min"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in records)
    saved = json.loads((tmp_path / "serve_rllib.json").read_text())
    ours = [row for row in saved["summary"] if row["target"] != "rllib"]
    assert len(ours) == 2 * (len(serve_rllib.TARGETS) - 1) and all(
        row["vs_rllib"] > 0 and row["vs_ceiling"] > 0 for row in ours
    )


def test_client_local_smoke(tmp_path):
    records = measurements(run_smoke("client_local", tmp_path))
    assert {r["target"] for r in records} == {"bare", "exported"}
    assert all(r["actions_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in records)
    saved = json.loads((tmp_path / "client_local.json").read_text())
    assert {row["target"]: row["vs_bare"] > 0 for row in saved["summary"]} == {
        "bare": True,
        "exported": True,
    }


@pytest.mark.slow
def test_compare_sb3_smoke(tmp_path):
    """Ours and, when its virtualenv exists, Stable-Baselines3's SAC run the same
    Pendulum-v1 schedule and report env steps/s and returns at the same env steps."""
    from benchmarks import compare_sb3

    records = run_smoke("compare_sb3", tmp_path, timeout=900)
    runs = measurements(records)
    python, skipped = compare_sb3.sb3_python()
    assert {r["side"] for r in runs} == ({"ours", "sb3"} if python else {"ours"}), skipped
    for run in runs:
        assert run["env_steps"] == compare_sb3.SMOKE["env_steps"] and run["env_steps_per_s"] > 0
        assert run["sgd_steps"] > 0 and [h["env_steps"] for h in run["history"]] == [500, 1000]
    (median,) = [r for r in records if r.get("summary") and r["seed"] == "median"]
    assert median["ours f1_env_steps"] == compare_sb3.SMOKE["env_steps"]


def test_startup_prints_its_phases():
    """startup.py prints one JSON line (it is not a harness script: no --smoke size)."""
    proc = run_module("benchmarks.startup", "--algo", "ppo", "--runners", "1")
    phases = json.loads(proc.stdout.strip().splitlines()[-1])
    assert phases["algorithm_build_s"] > 0 and phases["learners_build_s"] > 0
    assert len(phases["runner_up_s"]) == len(phases["runner_process_start_s"]) == 1
    assert phases["runner_up_s"][0] > phases["runner_process_start_s"][0]
    assert len(phases["iteration_ends_s"]) >= 3 + phases["iterations_in_driver"]


def test_sac_step_smoke(tmp_path):
    """The bare TF SAC update, our policy's, our loop's and (when its virtualenv
    exists) SB3's are timed at k = 1 and 8 SGD steps per call, each with the
    update's FLOP count."""
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
