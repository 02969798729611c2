"""algorithms/algorithm.py as an extension point: training_step(self), the steps
it is made of, samples-trained metrics, algorithm state in checkpoints, and PPO
unchanged by the loop it now runs on (against a hand-written loop)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import ray
import tensorflow as tf

import algorithms
from algorithms.algorithm import AlgorithmConfig, AlgorithmState
from algorithms.environments import env_maker
from algorithms.ppo import PPO, PPOPolicy
from policy_service.cli import commands as cli
from policy_service.config import from_dict, on_cpu
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.io.checkpoints import ALGORITHM_ARRAYS, ALGORITHM_STATE, CheckpointFileError
from policy_service.policy.exploration import Exploration
from policy_service.runs.callbacks import Callbacks

PPO_RUN = {
    "env": "CartPole-v1",
    "seed": 3,
    "num_env_runners": 0,
    "num_envs_per_env_runner": 2,
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 3,
    "lr": 1e-3,
    "model": {"fcnet_hiddens": [32, 32]},
}
LOSS_STATS = (
    "policy_loss",
    "vf_loss",
    "entropy",
    "kl",
    "kl_coeff",
    "total_loss",
    "vf_explained_var",
    "num_sgd_steps",
    "valid_rows",
)


# ----- PPO on the new loop == the old loop, written out by hand -------------------------


def hand_written_ppo(config: dict, iterations: int) -> tuple[list[dict], dict]:
    """The iteration PPO ran before training_step(self) existed, from the policy's and
    the env runners' public methods: sample >= train_batch_size, standardize
    advantages, load once, num_epochs of SGD, adapt the KL coefficient, broadcast.
    -> (per iteration: returns window and loss stats, final weights)."""
    cfg = from_dict(PPO.config_class, config)
    workers = EnvRunnerGroup(
        env_maker(cfg.env),
        PPOPolicy,
        on_cpu(cfg),
        num_env_runners=0,
        num_envs_per_env_runner=cfg.num_envs_per_env_runner,
        rollout_fragment_length=cfg.fragment_length(),
        seed=cfg.seed,
    )
    policy = PPOPolicy(workers.observation_space, workers.action_space, cfg)
    workers.sync_weights(policy.get_weights(), version=0)
    returns, rows = [], []
    for iteration in range(1, iterations + 1):
        batches, steps = [], 0
        while steps < cfg.train_batch_size:
            batch, metrics = workers.sample()
            batches.append(batch)
            steps += metrics["env_steps"]
            returns += metrics["episode_returns"]
        batch = concat_samples(batches)
        advantages = np.asarray(batch[SampleBatch.ADVANTAGES], np.float32)
        batch[SampleBatch.ADVANTAGES] = (advantages - advantages.mean()) / max(
            float(advantages.std()), 1e-4
        )
        batch.pop(SampleBatch.NEXT_OBS)
        policy.load_batch_into_buffer(batch)
        stats = policy.learn_on_loaded_epochs(cfg.num_epochs)
        policy.update_kl(stats["kl"])
        workers.sync_weights(policy.get_weights(), version=iteration)
        window = returns[-cfg.metrics_num_episodes_for_smoothing :]
        rows.append(
            {
                "episode_return_mean": float(np.mean(window)),
                "timesteps": steps,
                **{k: stats[k] for k in LOSS_STATS},
            }
        )
    workers.stop()
    return rows, policy.get_weights()


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """PPO_RUN's three iterations (metrics, weights after them) and the checkpoint it
    saved after the first: one run for the two tests that train PPO_RUN."""
    path = tmp_path_factory.mktemp("ppo_run") / "ckpt"
    algo = PPO(PPO_RUN)
    try:
        got = [algo.train()]
        algo.save(str(path))
        got += [algo.train() for _ in range(2)]
        return path, got, algo.get_policy().get_weights()
    finally:
        algo.stop()


def test_ppo_on_training_step_is_bitwise_the_hand_written_iteration(ppo_run):
    expected, expected_weights = hand_written_ppo(PPO_RUN, 3)
    _, got, weights = ppo_run  # a save after the first iteration changes nothing
    for want, have in zip(expected, got):
        assert have["episode_return_mean"] == want["episode_return_mean"]
        assert have["env_steps_this_iter"] == want["timesteps"]
        for key in LOSS_STATS:
            assert have[key] == want[key], key
    for name, value in expected_weights.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


def test_samples_trained_come_from_the_learner_not_from_epochs_times_rows():
    """An LSTM batch is padded to whole sequences: the learner counts only valid rows,
    once per epoch; the epochs' padding never counts. (The LSTM PPO's training test:
    a finite loss on valid rows each iteration.)"""
    config = dict(
        PPO_RUN,
        train_batch_size=100,
        minibatch_size=10,  # one sequence a minibatch: no short last one is dropped
        num_epochs=2,
        model={"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 10},
    )
    algo = PPO(config)
    try:
        first, second = algo.train(), algo.train()
    finally:
        algo.stop()
    for metrics in (first, second):
        assert np.isfinite(metrics["total_loss"]) and metrics["valid_rows"] > 0
        assert metrics["num_samples_trained_this_iter"] == 2 * metrics["env_steps_this_iter"]
        # padded rows were stepped over too: more rows per step than valid ones
        assert metrics["num_sgd_steps"] * 10 > metrics["num_samples_trained_this_iter"]
    assert second["num_samples_trained_total"] == (
        first["num_samples_trained_this_iter"] + second["num_samples_trained_this_iter"]
    )
    assert second["num_samples_trained_per_s"] == pytest.approx(
        second["num_samples_trained_this_iter"] / second["learn_time_s"]
    )


# ----- an off-policy-shaped algorithm with state of its own -----------------------------

REPLAY_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.ADVANTAGES,
    SampleBatch.VALUE_TARGETS,
    SampleBatch.ACTION_LOGP,
    SampleBatch.ACTION_DIST_INPUTS,
    SampleBatch.VF_PREDS,
)


class FifoReplayPPO(PPO):
    """What a replay-based algorithm does with the loop, in miniature: fragments as
    workers finish go into a FIFO of the last CAPACITY rows; each iteration is one
    SGD step on BATCH rows its own RNG draws; weights go out every second update."""

    CAPACITY, BATCH = 64, 32

    def __init__(self, config):
        self.replay: dict[str, np.ndarray] = {}
        self.size = self.next_row = self.updates = 0
        self.rng = np.random.default_rng(0)
        super().__init__(config)

    def training_step(self) -> dict:
        self.add(self.sample_ready())
        rows = self.rng.integers(0, self.size, self.BATCH)
        minibatch = SampleBatch({k: v[rows] for k, v in self.replay.items()})
        stats = self.learner_update(lambda learners: learners.update(minibatch))
        self.updates += 1
        if self.updates % 2 == 0:
            self.broadcast_weights()
        return stats

    def add(self, batch: SampleBatch) -> None:
        n = min(batch.count, self.CAPACITY)
        index = (self.next_row + np.arange(n)) % self.CAPACITY
        for name in REPLAY_COLUMNS:
            values = np.asarray(batch[name])[-n:]
            if name not in self.replay:
                self.replay[name] = np.zeros((self.CAPACITY,) + values.shape[1:], values.dtype)
            self.replay[name][index] = values
        self.next_row = int((self.next_row + n) % self.CAPACITY)
        self.size = min(self.size + n, self.CAPACITY)

    def get_algorithm_state(self) -> AlgorithmState:
        return AlgorithmState(
            {
                "size": self.size,
                "next_row": self.next_row,
                "updates": self.updates,
                "rng": self.rng.bit_generator.state,
            },
            {f"replay/{k}": v for k, v in self.replay.items()},
        )

    def check_algorithm_state(self, state: AlgorithmState) -> None:
        for key in ("size", "next_row", "updates", "rng"):
            if key not in state.values:
                raise ValueError(f"algorithm state value {key!r} missing")
        if not 0 <= state.values["size"] <= self.CAPACITY:
            raise ValueError(
                f"algorithm state value 'size' must be in [0, {self.CAPACITY}], "
                f"got {state.values['size']}"
            )
        wanted = {f"replay/{k}" for k in REPLAY_COLUMNS} if state.values["size"] else set()
        if set(state.arrays) != wanted:
            raise ValueError(
                f"algorithm arrays must be {sorted(wanted)}, got {sorted(state.arrays)}"
            )

    def set_algorithm_state(self, state: AlgorithmState) -> None:
        self.size, self.next_row, self.updates = (
            state.values[k] for k in ("size", "next_row", "updates")
        )
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state.values["rng"]
        self.replay = {k.removeprefix("replay/"): v for k, v in state.arrays.items()}


REPLAY_RUN = {
    "env": "CartPole-v1",
    "seed": 11,
    "num_envs_per_env_runner": 2,
    "rollout_fragment_length": 10,
    "lr": 1e-3,
    "model": {"fcnet_hiddens": [16]},
}


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    """Two iterations, a save, a restore of it and a third: the saved checkpoint and
    what followed the restore (every restore of it trains on alike)."""
    path = tmp_path_factory.mktemp("replay") / "ckpt"
    algo = FifoReplayPPO(REPLAY_RUN)
    try:
        algo.train(), algo.train()
        algo.save(str(path))
        algo.restore(str(path))
        third = algo.train()
        after = {
            "weights": algo.get_policy().get_weights(),
            "state": algo.get_algorithm_state(),
            "metrics": third,
        }
    finally:
        algo.stop()
    return path, after


def test_a_replay_algorithm_resumes_exactly_its_state_saved_beside_the_learner(replay_run):
    path, after = replay_run
    algo = FifoReplayPPO(REPLAY_RUN)
    try:
        algo.restore(str(path))
        assert (algo.iteration, algo.updates) == (2, 2) and 40 <= algo.size <= 42
        third = algo.train()
        weights, state = algo.get_policy().get_weights(), algo.get_algorithm_state()
    finally:
        algo.stop()
    for key in (
        "total_loss",
        "policy_loss",
        "vf_loss",
        "kl",
        "valid_rows",
        "timesteps_total",
        "env_steps_this_iter",
        "num_samples_trained_this_iter",
        "num_samples_trained_total",
    ):
        assert third[key] == after["metrics"][key], key
    assert third["num_samples_trained_total"] == 3 * FifoReplayPPO.BATCH
    for name, value in after["weights"].items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)
    assert state.values == after["state"].values
    assert sorted(state.arrays) == sorted(after["state"].arrays)
    for name, value in after["state"].arrays.items():
        np.testing.assert_array_equal(state.arrays[name], value, err_msg=name)


def test_algorithm_arrays_are_an_npz_listed_in_the_json(replay_run):
    path, _ = replay_run
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert files == [
        ALGORITHM_ARRAYS,
        ALGORITHM_STATE,
        "policy/policy_arrays.npz",
        "policy/policy_state.json",
    ]
    saved = json.loads((path / ALGORITHM_STATE).read_text())
    assert saved["algorithm_values"]["updates"] == 2
    assert saved["algorithm_arrays"]["replay/obs"] == {"dtype": "<f4", "shape": [64, 4]}
    with np.load(path / ALGORITHM_ARRAYS, allow_pickle=False) as data:
        assert sorted(data.files) == sorted(saved["algorithm_arrays"])


def corrupt_missing(path):
    (path / ALGORITHM_ARRAYS).unlink()


def corrupt_truncated(path):
    data = (path / ALGORITHM_ARRAYS).read_bytes()
    (path / ALGORITHM_ARRAYS).write_bytes(data[: len(data) // 2])


def corrupt_shape(path):
    with np.load(path / ALGORITHM_ARRAYS, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["replay/obs"] = arrays["replay/obs"][:10]
    np.savez(path / ALGORITHM_ARRAYS, **arrays)


def corrupt_manifest(path):
    saved = json.loads((path / ALGORITHM_STATE).read_text())
    saved["algorithm_arrays"]["replay/obs"]["dtype"] = "object"
    (path / ALGORITHM_STATE).write_text(json.dumps(saved))


def corrupt_values(path):
    saved = json.loads((path / ALGORITHM_STATE).read_text())
    saved["algorithm_values"]["size"] = 1000
    (path / ALGORITHM_STATE).write_text(json.dumps(saved))


@pytest.fixture(scope="module")
def untrained_replay_algo():
    """A FifoReplayPPO never trained and its initial weights, for the refused restores:
    each test checks it is still exactly that, so one refusal that changed something
    fails its own test (the next ones too), never passes."""
    algo = FifoReplayPPO(REPLAY_RUN)
    yield algo, algo.get_policy().get_weights()
    algo.stop()


@pytest.mark.parametrize(
    "corrupt, error, message",
    [
        (corrupt_missing, CheckpointFileError, r"algorithm_arrays\.npz: missing"),
        (corrupt_truncated, CheckpointFileError, r"algorithm_arrays\.npz: not a readable npz"),
        (
            corrupt_shape,
            CheckpointFileError,
            r"array 'replay/obs' is float32 \(10, 4\), expected float32 \(64, 4\)",
        ),
        (corrupt_manifest, CheckpointFileError, r"'algorithm_arrays' entry 'replay/obs' must be"),
        (corrupt_values, ValueError, r"'size' must be in \[0, 64\], got 1000"),
    ],
    ids=["missing", "truncated", "wrong_shape", "bad_manifest", "refused_by_the_algorithm"],
)
def test_a_bad_algorithm_state_is_one_line_and_changes_nothing(
    replay_run, untrained_replay_algo, tmp_path, corrupt, error, message
):
    path = tmp_path / "ckpt"
    shutil.copytree(replay_run[0], path)
    corrupt(path)
    algo, weights = untrained_replay_algo
    with pytest.raises(error, match=message) as info:
        algo.restore(str(path))
    assert "\n" not in str(info.value)
    assert (algo.iteration, algo.updates, algo.replay) == (0, 0, {})
    for name, value in algo.get_policy().get_weights().items():
        np.testing.assert_array_equal(value, weights[name])


def test_values_that_are_not_json_are_refused_at_save(tmp_path):
    class NumpyValues(FifoReplayPPO):
        def get_algorithm_state(self):
            return AlgorithmState({"size": np.int64(3)}, {})

    algo = NumpyValues(REPLAY_RUN)
    try:
        with pytest.raises(ValueError, match="NumpyValues.get_algorithm_state.*must be JSON"):
            algo.save(str(tmp_path / "ckpt"))
        assert not (tmp_path / "ckpt").exists()
    finally:
        algo.stop()


def test_a_checkpoint_from_before_algorithm_state_restores(ppo_run, tmp_path):
    """Older checkpoints have no samples-trained count and no algorithm state."""
    shutil.copytree(ppo_run[0], tmp_path / "ckpt")  # saved after one iteration
    saved = json.loads((tmp_path / "ckpt" / ALGORITHM_STATE).read_text())
    for key in ("num_samples_trained_total", "algorithm_values", "algorithm_arrays"):
        del saved[key]
    (tmp_path / "ckpt" / ALGORITHM_STATE).write_text(json.dumps(saved))
    fresh = PPO(PPO_RUN)
    try:
        fresh.restore(str(tmp_path / "ckpt"))
        assert (fresh.iteration, fresh.num_samples_trained_total) == (1, 0)
        assert fresh.train()["iteration"] == 2
    finally:
        fresh.stop()


def test_a_registered_algorithm_trains_and_resumes_through_the_command_line(
    monkeypatch, tmp_path, capsys
):
    """A new algorithm is one registry entry away from `policy-service train NAME`."""
    monkeypatch.setitem(algorithms.ALGORITHMS, "fifo_replay", f"{__name__}:FifoReplayPPO")
    run = tmp_path / "run"
    args = [
        "train",
        "fifo_replay",
        "--env",
        "CartPole-v1",
        "--seed",
        "11",
        "--output-dir",
        str(run),
        "--set",
        "rollout_fragment_length=10",
        "--set",
        "lr=0.001",
        "--set",
        "model.fcnet_hiddens=[16]",
        "--checkpoint-every",
        "2",
    ]
    assert cli.main(args + ["--stop-iters", "2"]) == 0
    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3"]) == 0
    assert "from checkpoint_000002" in capsys.readouterr().err
    progress = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    assert [p["iteration"] for p in progress] == [1, 2, 3]
    assert progress[-1]["num_samples_trained_total"] == 3 * FifoReplayPPO.BATCH
    saved = json.loads((run / "checkpoints" / "checkpoint_000003" / ALGORITHM_STATE).read_text())
    assert saved["algorithm_class"] == f"{__name__}:FifoReplayPPO"
    assert saved["algorithm_values"]["updates"] == 3


def test_an_algorithm_without_an_update_count_is_told_what_to_report():
    class CountsNothing(PPO):
        def update_on_batch(self, learners, train_batch):
            return learners.learn_on_batch(train_batch)

    algo = CountsNothing(dict(PPO_RUN, train_batch_size=64))
    try:
        with pytest.raises(KeyError, match="no 'num_samples_trained'.*LearnerGroup.update"):
            algo.train()
    finally:
        algo.stop()


@pytest.mark.slow  # a learner actor started twice: ~25 s here
def test_a_learner_actor_killed_between_iterations_is_replaced_and_the_update_retried(ray_local):
    """learner_update restarts the group from the driver's last copy and calls the
    update again: the run goes on exactly as one whose learner lives in the driver."""
    config = dict(PPO_RUN, train_batch_size=128)
    local = PPO(config)
    remote = PPO(dict(config, num_learners=1, num_cpus_per_learner=0.5))
    try:
        expected = [local.train() for _ in range(2)]
        first = remote.train()
        ray.kill(remote.learners.actors[0])
        second = remote.train()
        assert (first["num_learner_restarts"], second["num_learner_restarts"]) == (0, 1)
        for want, have in zip(expected, (first, second)):
            assert have["env_steps_this_iter"] == want["env_steps_this_iter"]
            assert have["total_loss"] == pytest.approx(want["total_loss"], rel=1e-5, abs=1e-6)
        learner_weights = remote.learners.get_weights()
        for name, value in local.get_policy().get_weights().items():
            np.testing.assert_allclose(learner_weights[name], value, rtol=1e-5, atol=1e-6)
    finally:
        local.stop()
        remote.stop()


@pytest.mark.slow  # two PPO runs
def test_a_resumed_run_continues_the_lr_schedule(tmp_path):
    from piecewise import rllib_value

    schedule = [[0, 1e-3], [300, 2e-4], [900, 1e-5]]
    config = {
        "env": "CartPole-v1",
        "seed": 0,
        "train_batch_size": 200,
        "minibatch_size": 100,
        "num_epochs": 1,
        "lr_schedule": schedule,
        "model": {"fcnet_hiddens": [8]},
    }

    def lr(algo):
        return algo.get_policy().towers.optimizers[0].learning_rate.numpy()

    algo = PPO(config)
    try:
        algo.train()
        assert lr(algo) == rllib_value(schedule, algo.timesteps_total)
        algo.save(str(tmp_path))
    finally:
        algo.stop()
    resumed = PPO(config)
    try:
        resumed.restore(str(tmp_path))
        steps_before = resumed.timesteps_total
        assert steps_before >= 200
        resumed.train()
        # the update ran at the run's timestep, counted on from the checkpoint's
        assert resumed.timesteps_total >= steps_before + 200
        assert lr(resumed) == rllib_value(schedule, resumed.timesteps_total)
    finally:
        resumed.stop()


class FirstActionWhenExploring(Exploration):
    """A user's exploration class, named by its class in the config."""

    def __init__(self, action_space, action: int = 0):
        self.action = int(action)

    def choose(self, dist, explore, timestep, seed):
        greedy = tf.cast(dist.deterministic_sample(), tf.int64)
        chosen = tf.where(explore, tf.fill(tf.shape(greedy), np.int64(self.action)), greedy)
        return chosen, tf.zeros(tf.shape(greedy), tf.float32)


def test_the_config_json_names_an_exploration_class_type_by_name():
    """The run directory and checkpoints hold the algorithm's config as JSON
    (Algorithm.config_json): a class type is written by name, as the policy's state does
    (tests/test_exploration_noise.py)."""
    algo = PPO(
        {
            "env": "CartPole-v1",
            "exploration_config": {"type": FirstActionWhenExploring, "action": 1},
        }
    )
    try:
        written = json.loads(json.dumps(algo.config_json()))
    finally:
        algo.stop()
    assert written["exploration_config"] == {
        "type": f"{__name__}.FirstActionWhenExploring",
        "action": 1,
    }


FILTERED_POLICY_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    from policy_service import TFPolicy
    policy = TFPolicy.from_checkpoint(sys.argv[1] + "/policy")
    obs = np.asarray(json.loads(sys.argv[2]), np.float32)
    actions, _, extra = policy.compute_actions(obs, explore=False)
    stats = policy.observation_filter.stats
    print(json.dumps({"actions": actions.tolist(), "count": stats.count,
                      "dist": extra["action_dist_inputs"].tolist()}))
""")


@pytest.mark.slow
def test_a_run_saves_the_merged_observation_filter_and_a_fresh_process_acts_through_it(
    tmp_path,
):
    """PPO with MeanStdFilter for one iteration on Pendulum-v1: the learner policy holds
    every observation the runner saw, and its checkpoint, restored in a fresh process,
    gives the same filtered actions (the filter: tests/test_observation_filters.py)."""
    config = {
        "model": {"fcnet_hiddens": [8]},
        "seed": 5,
        "observation_filter": "MeanStdFilter",
        "env": "Pendulum-v1",
        "train_batch_size": 200,
    }
    algo = PPO({**config, "minibatch_size": 100, "num_epochs": 1})
    try:
        algo.train()
        checkpoint = algo.save(str(tmp_path / "checkpoint"))
        policy = algo.get_policy()
    finally:
        algo.stop()
    assert policy.observation_filter.stats.count >= 200
    obs = np.random.default_rng(1).uniform([-1, -1, -8], [1, 1, 8], (6, 3)).astype(np.float32)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            FILTERED_POLICY_IN_A_FRESH_PROCESS,
            checkpoint,
            json.dumps(obs.tolist()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    actions, _, extra = policy.compute_actions(obs, explore=False)
    assert got["count"] == policy.observation_filter.stats.count
    np.testing.assert_array_equal(np.asarray(got["dist"], np.float32), extra["action_dist_inputs"])
    np.testing.assert_array_equal(np.asarray(got["actions"], np.float32), actions)


@pytest.mark.parametrize(
    "algo_name, changes",
    [
        ("PPO", {"train_batch_size": 200, "minibatch_size": 50, "num_epochs": 2}),
        (
            "DQN",
            {
                "num_steps_sampled_before_learning_starts": 50,
                "min_sample_timesteps_per_iteration": 200,
                "train_batch_size": 16,
            },
        ),
    ],
)
def test_training_on_a_masked_env_never_takes_an_illegal_action(algo_name, changes):
    """MaskedPickEnv raises on an illegal action, epsilon-greedy's random ones included
    (the masks themselves: tests/test_action_masks.py)."""
    from envs import MaskedPickEnv

    algorithms.register_env("masked_pick", lambda env_config: MaskedPickEnv(env_config))
    algo_class = algorithms.get_algorithm_class(algo_name)
    algo = algo_class(
        {"env": "masked_pick", "seed": 0, "model": {"fcnet_hiddens": [16]}, **changes}
    )
    try:
        for _ in range(2):
            result = algo.train()
        assert result["timesteps_total"] >= 400
        assert np.isfinite(result["episode_return_mean"])
    finally:
        algo.stop()


# ----- the user's callbacks at the run's moments --------------------------------------


class LearnHook(Callbacks):
    def on_learn_on_batch(self, *, policy, train_batch, result, **kwargs):
        result["hook_rows"] = train_batch.count
        result["hook_saw_policy"] = float(policy is not None)


@pytest.mark.slow  # one PPO iteration: ~10 s here
def test_on_learn_on_batch_sees_each_train_batch_and_adds_to_the_statistics():
    """The run calls the hook before each batch a learner group learns on (the
    callbacks themselves: tests/test_callbacks.py)."""
    algo = PPO(
        {
            "env": "CartPole-v1",
            "seed": 0,
            "train_batch_size": 256,
            "minibatch_size": 64,
            "num_epochs": 1,
            "callbacks": LearnHook,
        }
    )
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["hook_rows"] == result["env_steps_this_iter"] >= 256
    assert result["hook_saw_policy"] == 1.0


class MultiAgentProbe(Callbacks):
    def on_episode_start(self, *, episode, **kwargs):
        episode.user_data["steps"] = 0

    def on_episode_step(self, *, episode, **kwargs):
        episode.user_data["steps"] += 1

    def on_episode_end(self, *, episode, policies, **kwargs):
        episode.custom_metrics["total"] = episode.total_reward
        episode.custom_metrics["steps"] = episode.user_data["steps"]
        episode.hist_data["policies"] = [len(policies)]


@pytest.mark.slow  # one multi-agent PPO iteration: ~10 s here
def test_episode_hooks_run_in_multi_agent_runs_too():
    from multi_agent_envs import TwoMapsEnv
    from multi_agent_envs import two_maps_config as config

    from algorithms import register_env

    register_env("two_maps", lambda env_config: TwoMapsEnv(env_config))
    algo = PPO(config(num_epochs=1, train_batch_size=128, callbacks=MultiAgentProbe))
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["custom_metrics/total_mean"] == pytest.approx(result["episode_return_mean"])
    assert result["custom_metrics/steps_mean"] == result["episode_len_mean"]
    assert set(result["hist_stats/policies"]) == {2}


# ----- the multi-agent keys of the config, checked where the config enters -------------


def test_without_policies_the_config_is_single_agent():
    config = from_dict(AlgorithmConfig, {})
    assert config.policies is None and config.policy_mapping_fn is None
    assert config.policies_to_train is None and config.count_steps_by == "env_steps"


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"policies_to_train": ["a"]},
            r"config.policies_to_train is set but config.policies is not",
        ),
        (
            {"policies": {"a": None}, "policies_to_train": ["b"]},
            r"names 'b', which is no policy in config.policies \['a'\]",
        ),
        (
            {"policies": {"a": "PPO"}},
            r"config.policies\['a'\] must map a str id to None or a PolicySpec, got str",
        ),
        ({"policies": {}}, r"must name at least one policy"),
        ({"count_steps_by": "steps"}, r"count_steps_by"),
        (
            {"policies": {"a": None}, "policy_mapping_fn": {"agent_": "b"}},
            r"config.policy_mapping_fn maps prefix 'agent_' to 'b', which is no policy in "
            r"config.policies \['a'\]",
        ),
        (
            {"policies": {"a": None}, "policy_mapping_fn": {"": "a"}},
            r"config.policy_mapping_fn: an agent-id prefix must be a non-empty str, got ''",
        ),
        ({"policies": {"a": None}, "policy_mapping_fn": {}}, r"at least one agent-id prefix"),
    ],
)
def test_bad_multi_agent_keys_are_one_line_naming_the_key(values, message):
    with pytest.raises(ValueError, match=message) as err:
        from_dict(AlgorithmConfig, values)
    assert "\n" not in str(err.value)


def test_algorithm_compute_single_action_acts_as_its_env_runners_send():
    """PPO on Pendulum with normalize_actions: the learner policy's greedy action (its
    mean, in [-1, 1] units) unsquashed into the env's [-2, 2]; full_fetch gives
    (action, [], extra); another policy id is a KeyError naming it."""
    from algorithms.ppo import PPO

    config = {
        "env": "Pendulum-v1",
        "num_env_runners": 0,
        "normalize_actions": True,
        "train_batch_size": 64,
        "minibatch_size": 32,
        "model": {"fcnet_hiddens": [8]},
        "seed": 0,
    }
    algo = PPO(config)
    try:
        obs = np.array([0.6, 0.8, -0.5], np.float32)
        policy = algo.get_policy()
        own, _, _ = policy.compute_single_action(obs, explore=False)
        action = algo.compute_single_action(obs, explore=False)
        np.testing.assert_allclose(action, np.clip(-2.0 + (own + 1.0) * 2.0, -2.0, 2.0), rtol=1e-6)
        action, state, extra = algo.compute_single_action(obs, explore=False, full_fetch=True)
        assert state == [] and "action_dist_inputs" in extra
        with pytest.raises(KeyError, match="no policy 'other'; this run has one policy"):
            algo.compute_single_action(obs, policy_id="other")
    finally:
        algo.stop()
