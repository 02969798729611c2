"""A3C (Mnih et al. 2016, https://arxiv.org/abs/1602.01783): asynchronous advantage
actor-critic, gradients computed where the data is.

Read top to bottom: the config, the loss (GAE advantages over each trajectory chunk,
taken in the compiled step from the model's own values; policy gradient, value error
and entropy bonus), and the training step. Each env runner samples a fragment and
computes the loss's gradients on it with its own policy copy
(`RolloutWorker.sample_and_compute_gradients`); the learner applies every gradient as
it arrives (`apply_gradients`: no lock, no barrier, no batch of gradients) and sends
its weights back to the runners at once, without waiting for them. A gradient's
staleness is the number of updates applied since the weights it was computed with.

    algo = A3C({"env": "CartPole-v1", "num_env_runners": 2, "seed": 0})
    print(algo.train()["grad_staleness_mean"]); algo.stop()

As in RLlib's A3C, gradients are clipped (`grad_clip`) by the runner that computes
them; the learner's optimizer (Adam) keeps the only optimizer state. With `policies`,
a runner computes each trained policy's gradients on its own rows of the fragment and
each goes to its policy's learner (docs/multi_agent.md).
"""

from __future__ import annotations

import time

import ray
import tensorflow as tf

from algorithms.algorithm import AsyncAlgorithm
from algorithms.configs.a3c import A3CConfig
from algorithms.impala import ChunkedActorCriticPolicy, actor_critic_loss
from policy_service import TFPolicy
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK
from policy_service.distributed.fragment_stream import Fragment, FragmentStream
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
from policy_service.returns.vtrace_units import bootstrap_values, vtrace_on_units
from policy_service.runs.metrics_logger import Stat, reduce_stats, stat_values

_POLL_S = 0.01


# ----- the policy: GAE over trajectory chunks, the actor-critic loss ----------------------


class A3CPolicy(ChunkedActorCriticPolicy):
    """Actor-critic whose train batches are trajectory chunks (units), so that the
    advantages are taken in the loss from the values it computes anyway."""

    config_class = A3CConfig
    config: A3CConfig

    def advantages_and_targets(self, train_batch: dict, model_out: dict):
        """-> (GAE advantages, value targets) <float32>[rows], no gradient.

        On-policy V-trace (all rho = 1, c = lambda) over each chunk: vs - V is
        sum_k (gamma lambda)^k delta_t+k, GAE exactly, and vs = GAE + V is the value
        target. Each chunk bootstraps from V(its last new_obs) unless it terminated."""
        values = model_out[SampleBatch.VF_PREDS]
        vs, _ = vtrace_on_units(
            log_rhos=tf.zeros_like(values),
            values=values,
            bootstrap_value=bootstrap_values(self.model, train_batch, model_out),
            train_batch=train_batch,
            gamma=self.config.gamma,
            clip_rho_threshold=None,
            clip_pg_rho_threshold=None,
            lambda_=self.config.lambda_,
        )
        return tf.stop_gradient(vs - values), vs

    def loss(self, model, dist_class, train_batch):
        """-logp * advantage + vf_loss_coeff * 0.5 (target - V)^2 - entropy bonus, each a
        mean over valid rows."""
        out = model(train_batch, training=True)
        curr = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        advantages, value_targets = self.advantages_and_targets(train_batch, out)
        logp = curr.logp(train_batch[SampleBatch.ACTIONS])
        return actor_critic_loss(
            self, curr, out, logp, advantages, value_targets, train_batch[LOSS_MASK]
        )


# ----- the training step: gradients applied as they arrive ---------------------------------


class A3C(AsyncAlgorithm):
    """Every env runner keeps `max_requests_in_flight_per_env_runner` requests for a
    fragment's gradients queued; an iteration applies the gradients that arrive until
    train_batch_size steps (count_steps_by) were sampled and at least one was applied."""

    config_class = A3CConfig
    config: A3CConfig
    policy_class: type[TFPolicy] = A3CPolicy
    trains_policies = True  # with `policies`: each trained one's own gradients

    def __init__(self, config):
        super().__init__(config)
        self.version = 0  # gradients applied so far: the weights version runners act with
        self.gradients = self._gradient_stream()

    def _gradient_stream(self) -> FragmentStream:
        return FragmentStream(
            self.env_runner_group(),
            self.config.max_requests_in_flight_per_env_runner,
            request="sample_and_compute_gradients",
        )

    def training_step(self) -> dict:
        start = time.perf_counter()
        # what schedules read: the runners' losses (entropy), the learner's optimizer (lr)
        self.env_runner_group().set_global_timestep(self.timesteps_total)
        self.policy_learners.set_global_timestep(self.timesteps_total)
        arrived: list[dict] = []
        staleness: list[int] = []
        lost = self.gradients.lost_fragments
        idle = self.gradients.env_runner_idle_s
        steps = trained = 0
        while steps < self.config.train_batch_size or not staleness:
            self.gradients.top_up()
            for fragment in self.gradients.collect(_POLL_S):
                staleness.append(self.version - fragment.weights_version)
                trained += self._apply(fragment)
                arrived.append(fragment.metrics)
                steps += fragment.steps(self.config.count_steps_by)
        self.count_async(arrived, trained, time.perf_counter() - start)
        return {
            "grad_staleness_mean": sum(staleness) / len(staleness),
            "grad_staleness_max": max(staleness),
            "num_grads_applied": len(staleness),
            "learner_version": self.version,
            "num_fragments_lost": self.gradients.lost_fragments - lost,
            "env_runner_idle_time_s": self.gradients.env_runner_idle_s - idle,
            # each fragment's loss statistics (means over its rows): their mean, over
            # the fragments that have them (a policy gives none without its rows)
            **stat_values(
                reduce_stats({k: Stat(v) for k, v in m["gradient_stats"].items()} for m in arrived)
            ),
        }

    def _apply(self, fragment: Fragment) -> int:
        """The fragment's gradients applied to the learner (with `policies`: each
        trained policy's with rows in it to its learner), then the weights they changed
        (the next version) sent to every runner without waiting -> the rows trained on."""
        gradients = fragment.batch  # by policy id (RolloutWorker.sample_and_compute_gradients)
        if isinstance(gradients, ray.ObjectRef):
            gradients = ray.get(gradients)
        learners = self.policy_learners
        for policy_id, policy_gradients in gradients.items():
            learners.groups[policy_id].apply_gradients(policy_gradients)
        self._iteration_changed_state = True
        self.version += 1
        weights = {policy_id: learners.groups[policy_id].get_weights() for policy_id in gradients}
        if learners.keyed:
            rows = sum(fragment.rows(policy_id) for policy_id in gradients)
        else:  # one policy of a gymnasium env: its weights alone, every row its own
            weights, rows = weights[DEFAULT_POLICY_ID], fragment.rows(None)
        self.env_runner_group().sync_weights(weights, version=self.version, wait=False)
        return rows

    # ----- AsyncAlgorithm: the version goes on; requests in flight are dropped ---------

    def learner_version(self) -> int:
        return self.version

    def set_learner_version(self, version: int) -> None:
        self.version = version

    def pause_sampling(self) -> None:
        self.gradients.forget()

    def resume_sampling(self) -> None:
        """The runners go on with the learner's weights and version (they may have been
        rebuilt)."""
        self.env_runner_group().sync_weights(
            self.async_learners().get_weights(), version=self.version
        )
        self.gradients = self._gradient_stream()

    def stop(self) -> None:
        try:
            if getattr(self, "gradients", None) is not None:  # a failed setup has none
                self.gradients.forget(install=False)  # its requests read
        finally:
            super().stop()
