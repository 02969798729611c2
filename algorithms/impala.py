"""IMPALA (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561): asynchronous
actor-learner training with V-trace.

Read top to bottom: the config, the train batch (trajectory chunks as units of
time steps: policy_service.returns.vtrace_units), the loss (V-trace targets and
advantages against the behaviour policy's log-probabilities, on every tower),
and the training step, which is the asynchronous loop of
policy_service.distributed.async_learning: env runners sample all the time,
the learners train on each `train_batch_size` env steps as soon as they are
there, and weights go out every `broadcast_interval` updates.

    algo = IMPALA({"env": "CartPole-v1", "num_env_runners": 2, "seed": 0})
    print(algo.train()["policy_lag_mean"]); algo.stop()

Fragments cross episode boundaries; each chunk bootstraps from the learner's
value of its last new_obs, unless the episode terminated there. With `policies`, each
trained policy learns on its own rows of the same fragments (docs/multi_agent.md).
"""

from __future__ import annotations

import time

import tensorflow as tf

from algorithms.algorithm import AsyncAlgorithm
from algorithms.configs.impala import IMPALAConfig
from policy_service import LossExtras, TFPolicy, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn, TrainColumns, TrainLayout
from policy_service.data.units import LOSS_MASK
from policy_service.distributed.async_learning import AsyncLearning, AsyncSettings
from policy_service.returns.vtrace_units import bootstrap_values, sequence_units, vtrace_on_units

# ----- the policy: train batch layout and the V-trace loss --------------------------------


class ChunkedActorCriticPolicy(TFPolicy):
    """An actor-critic whose train batches are trajectory chunks, one unit each, and
    whose loss is `actor_critic_loss`: IMPALA's policy and A3C's."""

    loss_columns = {
        SampleBatch.ACTIONS: LossColumn("number", None),
        SampleBatch.REWARDS: LossColumn(),
        SampleBatch.NEXT_OBS: LossColumn("number", None),
    }

    @classmethod
    def prepare_train_batch(
        cls, batch: SampleBatch, layout: TrainLayout, fixed_seq_len: bool = False
    ) -> TrainColumns:
        """The common preparation, then one unit per trajectory chunk (V-trace's
        [T, B] layout; a recurrent batch's sequences already are units)."""
        return sequence_units(super().prepare_train_batch(batch, layout, fixed_seq_len))


class IMPALAPolicy(ChunkedActorCriticPolicy):
    """Actor-critic with V-trace targets against the behaviour policy."""

    config_class = IMPALAConfig
    loss_columns = {
        SampleBatch.ACTION_LOGP: LossColumn(),
        **ChunkedActorCriticPolicy.loss_columns,
    }

    def vtrace(self, train_batch: dict, model_out: dict, log_rhos: tf.Tensor):
        """V-trace per unit with this config's thresholds -> (vs, pg_advantages) rows."""
        cfg = self.config
        return vtrace_on_units(
            log_rhos=log_rhos,
            values=model_out[SampleBatch.VF_PREDS],
            bootstrap_value=bootstrap_values(self.model, train_batch, model_out),
            train_batch=train_batch,
            gamma=cfg.gamma,
            clip_rho_threshold=cfg.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=cfg.vtrace_clip_pg_rho_threshold,
            lambda_=cfg.vtrace_lambda,
        )

    def loss(self, model, dist_class, train_batch):
        """-logp * V-trace advantage + vf_loss_coeff * 0.5 (vs - V)^2 - entropy bonus,
        each a mean over valid rows."""
        mask = train_batch[LOSS_MASK]
        out = model(train_batch, training=True)
        curr = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        logp = curr.logp(train_batch[SampleBatch.ACTIONS])
        vs, pg_advantages = self.vtrace(
            train_batch, out, logp - train_batch[SampleBatch.ACTION_LOGP]
        )
        return actor_critic_loss(self, curr, out, logp, pg_advantages, vs, mask)


def actor_critic_loss(policy, curr, out: dict, logp, advantages, value_targets, mask):
    """-logp * advantages + vf_loss_coeff * 0.5 (value_targets - V)^2 - the scheduled
    entropy bonus, each a mean over valid rows, with its stats (IMPALA's and A3C's loss
    once their advantages and targets are computed)."""
    cfg = policy.config
    policy_loss = masked_mean(-logp * advantages, mask)
    vf_loss = 0.5 * masked_mean(tf.square(value_targets - out[SampleBatch.VF_PREDS]), mask)
    entropy = masked_mean(curr.entropy(), mask)
    entropy_coeff = policy.scheduled(cfg.entropy_coeff, cfg.entropy_coeff_schedule)
    total = policy_loss + cfg.vf_loss_coeff * vf_loss - entropy_coeff * entropy
    return total, LossExtras(
        stats={
            "policy_loss": policy_loss,
            "vf_loss": vf_loss,
            "entropy": entropy,
            "entropy_coeff": tf.cast(entropy_coeff, tf.float32),
        }
    )


# ----- the training step: the asynchronous loop --------------------------------------------


class IMPALA(AsyncAlgorithm):
    """Env runners and learners at once (AsyncLearning); an iteration lasts until
    train_batch_size steps (count_steps_by) were sampled and at least one update was made."""

    config_class = IMPALAConfig
    config: IMPALAConfig
    policy_class: type[TFPolicy] = IMPALAPolicy
    trains_policies = True  # with `policies`: each trained one on its own rows

    def __init__(self, config):
        super().__init__(config)
        cfg = self.config
        settings = AsyncSettings(
            train_batch_size=cfg.train_batch_size,
            max_requests_in_flight_per_env_runner=cfg.max_requests_in_flight_per_env_runner,
            learner_queue_size=cfg.learner_queue_size,
            num_sgd_steps=cfg.num_epochs,
            broadcast_interval=None if cfg.inference == "learners" else cfg.broadcast_interval,
            max_policy_lag=cfg.max_policy_lag,
            count_steps_by=cfg.count_steps_by,
        )
        try:
            self.async_learning = AsyncLearning(
                self.env_runner_group(),
                self.async_learners(),
                settings,
                trained=self.policy_learners.trained() if self.policy_learners.keyed else None,
            )
        except BaseException:
            self.stop()
            raise

    def inference_by_learners(self) -> bool:
        return self.config.inference == "learners"

    def training_step(self) -> dict:
        start = time.perf_counter()
        self.policy_learners.set_global_timestep(self.timesteps_total)  # what schedules read
        it = self.async_learning.run(min_steps=self.config.train_batch_size)
        report = dict(it.report)
        trained = int(report.pop("num_samples_trained", 0))
        self.count_async(it.fragment_metrics, trained, time.perf_counter() - start)
        return report

    # ----- AsyncAlgorithm: the learner version and pausing (checkpoints) --------------

    def learner_version(self) -> int:
        return self.async_learning.version

    def set_learner_version(self, version: int) -> None:
        self.async_learning.set_version(version)

    def last_gradients(self) -> dict:
        return self.async_learning.last_gradients()  # between the learner thread's updates

    def updates_held(self):
        return self.async_learning.updates_held()

    def pause_sampling(self) -> None:
        """Learning pauses too; queued fragments are dropped."""
        self.async_learning.pause()

    def resume_sampling(self) -> None:
        self.async_learning.resume(self.env_runner_group())

    def stop(self) -> None:
        try:
            if getattr(self, "async_learning", None) is not None:
                self.async_learning.stop()
        finally:
            super().stop()
