"""Behaviour cloning: the logged actions' log-likelihood, maximized (MARWIL with beta 0,
as RLlib's BC is).

    loss = -mean(logp(a_t|s_t))      over the logged rows (a_t the behaviour's action)

No returns, no value loss: the policy imitates whatever logged the data, good and bad
alike (MARWIL weighs the rows by their advantage instead; marwil.py).

    algo = BC({"env": "CartPole-v1", "input": "logged/"})   # the offline `input` key
    algo.train()                                            # one train batch of rows
"""

from __future__ import annotations

from algorithms.algorithm import Algorithm
from algorithms.configs.bc import BCConfig
from policy_service import LossExtras, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn
from policy_service.data.units import LOSS_MASK
from policy_service.policy.tf_policy import TFPolicy


class BCPolicy(TFPolicy):
    """The catalog's model; its loss reads only the logged observations and actions."""

    config_class = BCConfig
    config: BCConfig
    loss_columns = {SampleBatch.ACTIONS: LossColumn("number", None)}

    def loss(self, model, dist_class, train_batch):
        """-mean(logp(a|s)) over valid rows."""
        mask = train_batch[LOSS_MASK]
        out = model(train_batch, training=True)
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
            train_batch[SampleBatch.ACTIONS]
        )
        policy_loss = -masked_mean(logp, mask)
        return policy_loss, LossExtras({"policy_loss": policy_loss})


class BC(Algorithm):
    """BC on the common iteration: a train batch of logged rows, num_epochs of
    minibatch SGD on it, broadcast."""

    config_class = BCConfig
    config: BCConfig
    policy_class = BCPolicy
