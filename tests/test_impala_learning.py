"""IMPALA and APPO learn CartPole-v1 from their tuned configs with 2 remote env
runners (slow: a minute or more each on 2 cores); the gradients of 2 learner actors
equal one device's."""

import threading
from pathlib import Path

import pytest
import ray
import yaml
from fakes import assert_weights_close, weights_differ
from learning_runs import train_until

from algorithms.appo import APPO, APPOPolicy
from algorithms.impala import IMPALA, IMPALAPolicy
from policy_service import LearnerGroup
from policy_service.data.sample_batch import concat_samples
from policy_service.distributed.rollout_worker import RolloutWorker

pytestmark = pytest.mark.slow

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned"
# Env steps allowed. APPO's tuned seeds took <= 185k. IMPALA (no trust region) varies
# far more between runs, even of one seed (fragments arrive in another order): 9 runs
# took 219k-563k, and one 970k; RLlib's own tuned IMPALA example allows 2M.
MAX_STEPS = {"impala": 1_500_000, "appo": 600_000}
# The runs stop at a 100-episode mean return of 150: a uniformly random policy's mean is
# ~22 (its episodes rarely last 60 steps), so 150 takes a policy that balances the pole.
# The tuned configs' full target, 450, is recorded per seed in their yamls (each with the
# command that reproduces it) and APPO's time to it measured by benchmarks/async_training.py;
# here it cost several times the env steps (IMPALA: 219k-970k) and proved nothing more.
CARTPOLE_LEARNED = 150


@pytest.mark.parametrize(
    "algo_cls, name",
    [(IMPALA, "impala"), (APPO, "appo")],
)
def test_learns_cartpole_with_two_remote_env_runners(ray_local, algo_cls, name):
    config = yaml.safe_load((TUNED / f"cartpole_{name}.yaml").read_text())
    config.update(seed=0, num_env_runners=2)
    history, seconds = train_until(algo_cls(config), CARTPOLE_LEARNED, MAX_STEPS[name])
    last = history[-1]
    print(
        f"\n{name} CartPole-v1: {last['episode_return_mean']:.1f} after "
        f"{last['timesteps_total']} env steps, {seconds:.0f} s, "
        f"lag mean {last['policy_lag_mean']:.2f}"
    )
    assert last["episode_return_mean"] >= CARTPOLE_LEARNED


def test_appo_learns_acting_in_the_learner_actor(ray_local):
    config = yaml.safe_load((TUNED / "cartpole_appo.yaml").read_text())
    config.update(seed=0, num_env_runners=2, num_learners=1, inference="learners")
    algo = APPO(config)
    assert algo.env_runners.weights_versions() == [0, 0]  # the learner's own version
    history, seconds = train_until(algo, CARTPOLE_LEARNED, MAX_STEPS["appo"])
    last = history[-1]
    print(
        f"\nappo, inference in the learner: {last['episode_return_mean']:.1f} after "
        f"{last['timesteps_total']} env steps, {seconds:.0f} s, lag max {last['policy_lag_max']}"
    )
    assert last["episode_return_mean"] >= CARTPOLE_LEARNED


@pytest.mark.parametrize("policy_cls", [IMPALAPolicy, APPOPolicy])
def test_two_learner_actors_give_one_devices_step(ray_local, policy_cls):
    config = {
        "seed": 0,
        "lr": 1e-2,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "num_envs_per_env_runner": 2,
        "model": {"fcnet_hiddens": [16, 16]},
    }
    worker = RolloutWorker(
        "CartPole-v1", policy_cls, config, num_envs=2, rollout_fragment_length=10
    )
    fragments = [worker.sample()[0] for _ in range(4)]
    spaces = (worker.observation_space, worker.action_space)
    worker.stop()
    one = policy_cls(*spaces, config)
    group = LearnerGroup(
        policy_cls, *spaces, {**config, "num_learners": 2, "num_cpus_per_learner": 0.5}
    )
    try:
        group.set_state(one.get_state())  # the target network too
        before = one.get_weights()
        refs = [ray.put(f) for f in fragments]
        for _ in range(2):  # the second step from the combined Adam state
            group.update_on_fragments([refs[:2], refs[2:]], learner_version=0)
            one.learn_on_batch(concat_samples(fragments))
        # Adam moves every element by about lr whatever its gradient's size, so where a
        # gradient nearly cancels, the halves' summation order shows at up to ~1e-3 lr (seen on
        # another CPU). A wrong combination (3 of the 4 fragments) differs by ~4 lr.
        assert_weights_close(one.get_weights(), group.get_weights(), atol=1e-2 * config["lr"])
        assert group.weights_identical()
        assert weights_differ(before, group.get_weights())
    finally:
        group.stop()


def test_appo_learns_with_a_runner_the_policy_actor_and_the_learner_killed(ray_local):
    """One APPO run acting through its PolicyActor (inference: policy_actors) with a
    learner actor (issue 43): an env runner, the PolicyActor and the learner are each
    killed once, a few seconds apart, each replaced through the actor pool (the runner
    and the learner by the driver, the PolicyActor by Ray, with its latest weights),
    and the run still learns. It took the place of a run killing only runners."""
    config = yaml.safe_load((TUNED / "cartpole_appo.yaml").read_text())
    config.update(
        seed=1,
        num_env_runners=2,
        inference="policy_actors",
        num_learners=1,
        num_cpus_per_learner=0,  # two cores: the learner shares them with the actors
    )
    algo = APPO(config)
    stop = threading.Event()
    kills: list[str] = []

    def kill_each_once():
        # the first kill 2 s in: a quiet machine learns CARTPOLE_LEARNED within ~10 s
        # acting in the runners, and the kills are to land while the policy learns
        victims = [
            ("runner", lambda: algo.env_runners.workers[0], True),
            ("policy actor", lambda: algo.env_runners.policy_actor, False),  # Ray restarts it
            ("learner", lambda: algo.learners.actors[0], True),
        ]
        for wait_s, (name, victim, for_good) in zip((2.0, 3.0, 3.0), victims):
            if stop.wait(wait_s):
                return
            ray.kill(victim(), no_restart=for_good)
            kills.append(name)

    def repaired(last: dict) -> bool:
        restarts = ("num_worker_restarts", "num_policy_actor_restarts", "num_learner_restarts")
        return len(kills) == 3 and all(last[key] >= 1 for key in restarts)

    killer = threading.Thread(target=kill_each_once, daemon=True)
    killer.start()
    try:
        history, seconds = train_until(algo, CARTPOLE_LEARNED, MAX_STEPS["appo"], ready=repaired)
    finally:
        stop.set()
        killer.join()
    last = history[-1]
    print(
        f"\nappo, a runner, the PolicyActor and the learner killed: "
        f"{last['episode_return_mean']:.1f} after {last['timesteps_total']} env steps, "
        f"{seconds:.0f} s"
    )
    assert kills == ["runner", "policy actor", "learner"]
    assert last["episode_return_mean"] >= CARTPOLE_LEARNED
    assert last["num_worker_restarts"] == 1 and last["num_policy_actor_restarts"] == 1
    assert last["num_learner_restarts"] == 1
