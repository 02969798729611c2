"""The benchmark scripts that run a peer beside us (RLlib's and Stable-Baselines3's,
each in its own virtualenv: RLlib's built once per machine by benchmark_runs.peer_venv
and found by the script in the clone) at their --smoke size, and the peers' settings
translations. A file of its own so that pytest-xdist can run it beside
test_benchmarks.py."""

from __future__ import annotations

import json

import pytest
from benchmark_runs import measurements, peer_venv, run_smoke

pytestmark = pytest.mark.slow  # minutes of child processes and virtualenv builds


@pytest.fixture(scope="module")
def compare_rllib(tmp_path_factory) -> list[dict]:
    """compare_rllib.py --smoke with every workload, the dqn one too: one run for the
    two tests below, whose script start, RLlib venv check and children (one per side)
    each cost tens of seconds. Needs RLlib's own venv (peer_venv, which checked it: the
    script takes its python as given)."""
    from benchmarks.compare_rllib import WORKLOADS

    python = peer_venv(".venv-rllib")
    out = tmp_path_factory.mktemp("compare_rllib")
    return run_smoke(
        "compare_rllib",
        out,
        "--workloads",
        ",".join(WORKLOADS),
        "--rllib-python",
        python,
        timeout=1800,
    )


@pytest.mark.slow
def test_compare_rllib_smoke(compare_rllib):
    records = compare_rllib
    ratios = [r for r in records if r.get("summary")]
    assert {r["workload"] for r in ratios} == {"learner", "sampler", "inference", "e2e", "dqn"}
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

    from benchmarks.to_target import train_to_target

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
def test_compare_rllib_dqn_smoke(compare_rllib):
    """Both sides of the dqn workload build (RLlib's through its replay buffer patch),
    sample, learn and report; needs RLlib's venv and the tuned DQN config."""
    records = compare_rllib
    runs = [r for r in measurements(records) if r["bench"] == "dqn"]
    assert {r["framework"] for r in runs} == {"ours", "rllib"}
    from benchmarks.dqn_e2e import SMOKE_MAX_ENV_STEPS

    for run in runs:
        assert run["env_steps"] >= SMOKE_MAX_ENV_STEPS and run["iterations"] >= 1
        assert run["final_return"] > 0 and run["wall_s"] > 0
    rows = [r for r in records if r.get("summary") and r["workload"] == "dqn"]
    assert [r["seed"] for r in rows] == [0, "median"]
    assert rows[0]["ours_env_steps"] >= SMOKE_MAX_ENV_STEPS
    assert rows[0]["rllib_env_steps"] >= SMOKE_MAX_ENV_STEPS


@pytest.mark.slow
def test_ppo_parity_smoke(tmp_path):
    """Ours (and an ablation) beside RLlib's PPO at its defaults; needs RLlib's venv."""
    python = peer_venv(".venv-rllib")
    records = run_smoke(
        "ppo_parity",
        tmp_path,
        "--variants",
        "defaults,keras_init",
        "--rllib-python",
        python,
        timeout=1800,
    )
    rows = {r["variant"]: r for r in records if r.get("summary")}
    assert set(rows) == {"defaults", "keras_init", "rllib"}
    assert all(r["reached"] == "1/1" and r["env_steps"] > 0 for r in rows.values())


@pytest.mark.rllib
def test_serve_rllib_smoke(tmp_path):
    """Both training servers and the Serve ceiling serve episodes from client processes;
    needs the RLlib 2.35 venv (.venv-rllib-server, peer_venv)."""
    from benchmarks import serve_rllib

    python = peer_venv(".venv-rllib-server")
    records = measurements(
        run_smoke("serve_rllib", tmp_path, "--rllib-python", python, timeout=2400)
    )
    assert {(r["target"], r["clients"]) for r in records} == {
        (t, n) for t in serve_rllib.TARGETS for n in (1, 2)
    }
    assert all(r["per_client_min"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in records)
    saved = json.loads((tmp_path / "serve_rllib.json").read_text())
    ours = [row for row in saved["summary"] if row["target"] != "rllib"]
    assert len(ours) == 2 * (len(serve_rllib.TARGETS) - 1) and all(
        row["vs_rllib"] > 0 and row["vs_ceiling"] > 0 for row in ours
    )


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


@pytest.mark.slow
def test_tune_sweep_smoke(tmp_path):
    """Our side of the Tune sweep (2 trials x 1 iteration) runs and reports each trial.
    RLlib's side is left out for CI's ~60 s budget: both sides took 105-113 s at load
    10-19 (52 s of CPU over all their processes; RLlib's alone 59 s, 20 s of CPU, its
    venv's import check included), ours alone 47-87 s at load 10-15 (23 s of CPU).
    `python -m benchmarks.tune_sweep --smoke` runs both sides."""
    records = run_smoke("tune_sweep", tmp_path, "--sides", "ours", timeout=900)
    (sweep,) = measurements(records)
    assert sweep["side"] == "ours" and len(sweep["trials"]) == 2
    assert all(t["iterations"] == 1 and t["env_steps"] > 0 for t in sweep["trials"])
    assert sweep["wall_s"] >= sweep["fit_s"] > 0
