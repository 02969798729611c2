"""Off-policy estimation: the value of a target policy from episodes another
(behaviour) policy played, logged with its action_logp. RLlib's four estimators:

    episodes = logged_episodes("logs/", policy)         # whole episodes, by eps_id
    estimates = estimate(policy, episodes, {"wis": {"type": "WeightedImportanceSampling"}},
                         gamma=0.99)
    estimates["wis"]["v_target"]        # the target policy's discounted return, estimated

With rho_t = pi(a_t|s_t) / mu(a_t|s_t) (mu: the logged behaviour probability, at least
epsilon_prob), p_t = rho_0 ... rho_t and G = sum_t gamma^t r_t per episode:

    ImportanceSampling          mean_i sum_t gamma^t p_it r_it      (per-decision; unbiased;
                                its variance over episodes is reported: v_target_var)
    WeightedImportanceSampling  mean_i sum_t gamma^t p_it / w_t r_it,  w_t = mean_i p_i,min(t,T_i-1)
                                (per-decision weighted: each step's weights normalized over
                                every episode, one that ended keeping its last p: an absorbing
                                state; RLlib normalizes over the episodes that reached t, which
                                with rewards of one per step estimates the behaviour's value)
    DirectMethod                mean_i V(s_i0), V(s) = sum_a pi(a|s) Q(s, a)
    DoublyRobust                mean_i v_i0, where v_iT = 0 and
                                v_it = V(s_t) + rho_t (r_t + gamma v_i,t+1 - Q(s_t, a_t))

Q is fitted to the target policy by fitted Q evaluation (FittedQ: an MLP, regressed
first on the logged discounted returns-to-go, then `n_iters` times on
r + gamma (1 - terminated) sum_a' pi(a'|s') Q_prev(s', a')); DM and DR take discrete
actions. pi is the policy's action distribution (compute_log_likelihoods): what it
samples when exploring. Each estimator reports v_behavior (the logged discounted
return), v_target, v_target_std, v_gain (v_target / v_behavior) and v_delta, RLlib's
names; the cost of each is measured in benchmarks/offline_ope.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.offline.batches import DEFAULT_POLICY_ID
from policy_service.offline.columns import OfflineDataError
from policy_service.offline.config_keys import Q_MODEL_OPTIONS, estimation_methods

EPSILON_PROB = 1e-6  # the smallest behaviour probability divided by (RLlib's epsilon_prob)
_CHUNK = 4096  # rows per policy call
STEPS_PER_ITER = 8  # SGD steps between two target computations of fitted Q evaluation
COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.EPS_ID,
)
NEEDS_LOGP = ("ImportanceSampling", "WeightedImportanceSampling", "DoublyRobust")
NEEDS_Q = ("DirectMethod", "DoublyRobust")
Q_MODEL_DEFAULTS = {
    "n_iters": 400,
    "lr": 1e-3,
    "minibatch_size": 1024,
    "tau": 1.0,
    "hiddens": [64, 64],
    "seed": 0,
}


@dataclass
class Episodes:
    """Logged episodes as rows ordered by episode, then step: `episode` (index of each
    row's episode), `step` (its position in it), `starts` and `lengths` per episode."""

    batch: SampleBatch
    episode: np.ndarray
    step: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    where: str  # the files, for errors

    @property
    def num_episodes(self) -> int:
        return len(self.starts)

    @classmethod
    def of(cls, batch: SampleBatch, where: str) -> Episodes:
        """Rows grouped by eps_id (stably: the rows of an episode keep their order, or
        the order of t when there is a t column)."""
        eps = np.asarray(batch[SampleBatch.EPS_ID])
        keys = [eps] if SampleBatch.T not in batch else [np.asarray(batch[SampleBatch.T]), eps]
        order = np.lexsort(keys)  # by eps_id, then t
        batch = SampleBatch.from_checked_rows({k: _rows(v, order) for k, v in batch.items()})
        eps = eps[order]
        starts = np.flatnonzero(np.r_[True, eps[1:] != eps[:-1]]) if len(eps) else np.zeros(0, int)
        lengths = np.diff(np.r_[starts, len(eps)])
        episode = np.repeat(np.arange(len(starts)), lengths)
        step = np.arange(len(eps)) - starts[episode]
        return cls(batch, episode, step, starts, lengths, where)


def _rows(value: Any, index: np.ndarray) -> Any:
    if isinstance(value, list):
        return [value[i] for i in index]
    if isinstance(value, Mapping):
        return {k: _rows(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_rows(v, index) for v in value)
    return np.asarray(value)[index]


def needed_columns(methods: Mapping[str, Mapping]) -> tuple[str, ...]:
    columns = list(COLUMNS)
    kinds = {m["type"] for m in methods.values()}
    if kinds & set(NEEDS_LOGP):
        columns.append(SampleBatch.ACTION_LOGP)
    if kinds & set(NEEDS_Q):
        columns += [SampleBatch.NEXT_OBS, SampleBatch.TERMINATEDS]
    return tuple(columns)


def logged_episodes(
    input: str | os.PathLike | Sequence,
    methods: Mapping[str, Mapping],
    *,
    spaces: tuple[gym.Space, gym.Space] | None = None,
    held_out: float | None = None,
    name: str = "input",
    max_rows: int | None = None,
) -> Episodes:
    """The episodes of `input` the estimators read (with `held_out`, only the held-out
    ones: held_out.py), checked first: a column an estimator needs missing is one line
    naming the file and the column."""
    from policy_service.offline.held_out import held_out as held_out_rows
    from policy_service.offline.offline_runner_type import training_dataset
    from policy_service.offline.reader import Experiences, PolicyDataset, open_experiences

    columns = needed_columns(methods)
    experiences = open_experiences(
        input,
        spaces=None if spaces is None else {DEFAULT_POLICY_ID: spaces},
        require=columns,
        name=name,
    )
    dataset = training_dataset(experiences, name)
    kept = [c for c in dataset.data.columns if c.path[0] in (*columns, SampleBatch.T)]
    data = type(dataset.data)(
        dataset.observation_space, dataset.action_space, kept, dataset.data.weights_version
    )
    reading = Experiences({dataset.policy_id: PolicyDataset(
        dataset.policy_id, dataset.format, dataset.files, data, dataset.num_rows
    )})  # fmt: skip

    def in_held_out(chunk: SampleBatch) -> np.ndarray:
        assert held_out is not None
        return held_out_rows(chunk[SampleBatch.EPS_ID], held_out)

    batches = []
    rows = 0
    for batch in reading.iter_batches(
        65536,
        policy_id=dataset.policy_id,
        row_filter=None if held_out is None else in_held_out,
    ):
        batches.append(batch)
        rows += batch.count
        if max_rows is not None and rows >= max_rows:
            break
    where = str(dataset.files[0].parent)
    if not batches:
        raise OfflineDataError(f"{where}: no episodes to estimate on (held out: {held_out})")
    return Episodes.of(concat_samples(batches), where)


# ----- the target policy's probabilities -------------------------------------------------


def logged_action_probs(policy: Any, batch: SampleBatch) -> np.ndarray:
    """pi(a_t|s_t) of each logged action under the policy."""
    out = []
    for start in range(0, batch.count, _CHUNK):
        rows = slice(start, start + _CHUNK)
        out.append(
            policy.compute_log_likelihoods(
                _rows(batch[SampleBatch.ACTIONS], np.arange(batch.count)[rows]),
                _rows(batch[SampleBatch.OBS], np.arange(batch.count)[rows]),
            )
        )
    return np.exp(np.concatenate(out).astype(np.float64))


def all_action_probs(policy: Any, obs: Any, count: int, n: int) -> np.ndarray:
    """<float64>[rows, n]: pi(a|s) of every action of a Discrete(n) space."""
    out = np.zeros((count, n))
    for start in range(0, count, _CHUNK):
        index = np.arange(start, min(start + _CHUNK, count))
        part = _rows(obs, index)
        for action in range(n):
            actions = np.full(len(index), action, np.int64)
            out[index, action] = np.exp(policy.compute_log_likelihoods(actions, part))
    return out


def check_policy(policy: Any, methods: Mapping[str, Mapping], where: str) -> None:
    if policy.is_recurrent():
        raise OfflineDataError(
            f"{where}: off-policy estimation takes feed-forward policies (a recurrent "
            "policy's probabilities depend on states the files do not hold)"
        )
    for name, spec in methods.items():
        if spec["type"] in NEEDS_Q and not isinstance(policy.action_space, gym.spaces.Discrete):
            raise OfflineDataError(
                f"off_policy_estimation_methods.{name}: {spec['type']} fits a Q model of "
                f"discrete actions; the action space is {policy.action_space}"
            )


# ----- the fitted Q model -----------------------------------------------------------------


class FittedQ:
    """Q(s, .) of a Discrete(n) action space: an MLP on the policy's preprocessed
    observations, fitted to the target policy by fitted Q evaluation."""

    def __init__(self, features: int, n: int, options: Mapping | None = None) -> None:
        import tensorflow as tf

        self.options = {**Q_MODEL_DEFAULTS, **dict(options or {})}
        unknown = set(self.options) - set(Q_MODEL_OPTIONS)
        if unknown:
            raise ValueError(f"q_model_config: unknown keys {sorted(unknown)}")
        tf.random.set_seed(int(self.options["seed"]))
        import keras

        layers = [keras.Input((features,))]
        layers += [keras.layers.Dense(h, activation="relu") for h in self.options["hiddens"]]
        layers.append(keras.layers.Dense(n))
        self.model = keras.Sequential(layers)
        self.optimizer = keras.optimizers.Adam(float(self.options["lr"]))
        self.n = n

        @tf.function(reduce_retracing=True)
        def train_step(x, a, y):
            with tf.GradientTape() as tape:
                q = tf.gather(self.model(x), a, batch_dims=1)
                loss = tf.reduce_mean(tf.square(q - y))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            return loss

        self._train_step = train_step

    def q_values(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [self.model(x[i : i + 65536]).numpy() for i in range(0, len(x), 65536)]
        ).astype(np.float64) if len(x) else np.zeros((0, self.n))  # fmt: skip

    def _epoch(self, x, a, y, rng, max_steps: int | None = None) -> float:
        """Minibatch SGD on (x, a) -> y: one pass, or `max_steps` minibatches of it."""
        size = int(self.options["minibatch_size"])
        order = rng.permutation(len(x))
        losses = []
        for i in range(0, len(x), size)[:max_steps]:
            rows = order[i : i + size]
            losses.append(float(self._train_step(x[rows], a[rows], y[rows].astype(np.float32))))
        return float(np.mean(losses))

    def fit(
        self,
        x: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_x: np.ndarray,
        terminated: np.ndarray,
        next_probs: np.ndarray,
        returns_to_go: np.ndarray,
        gamma: float,
    ) -> dict:
        """Fit; -> {"q_loss": the last epoch's mean squared TD error, "fit_time_s"}."""
        start = time.perf_counter()
        rng = np.random.default_rng(int(self.options["seed"]))
        a = actions.astype(np.int64)
        for _ in range(3):  # warm start: the logged returns (the behaviour's Q)
            self._epoch(x, a, returns_to_go, rng)
        loss = float("nan")
        alive = 1.0 - terminated.astype(np.float64)
        for _ in range(int(self.options["n_iters"])):  # each: new targets, a few steps
            next_v = (next_probs * self.q_values(next_x)).sum(axis=1)
            targets = rewards + gamma * alive * next_v
            loss = self._epoch(x, a, targets, rng, STEPS_PER_ITER)
        return {"q_loss": loss, "fit_time_s": time.perf_counter() - start}


# ----- the estimators ----------------------------------------------------------------------


def _per_episode(episodes: Episodes, values: np.ndarray) -> np.ndarray:
    return np.bincount(episodes.episode, weights=values, minlength=episodes.num_episodes)


def _cumulative_ratios(episodes: Episodes, ratios: np.ndarray) -> np.ndarray:
    """p_t = rho_0 ... rho_t within each episode (through logs: no overflow on the way)."""
    logs = np.log(np.maximum(ratios, 1e-300))
    total = np.cumsum(logs)
    before = np.r_[0.0, total][episodes.starts]  # the sum up to each episode's start
    return np.exp(total - before[episodes.episode])


def _summary(v_behavior: np.ndarray, v_target: np.ndarray) -> dict:
    mean_b, mean_t = float(v_behavior.mean()), float(v_target.mean())
    return {
        "v_behavior": mean_b,
        "v_behavior_std": float(v_behavior.std()),
        "v_target": mean_t,
        "v_target_std": float(v_target.std()),
        "v_gain": mean_t / mean_b if mean_b else float("nan"),
        "v_delta": mean_t - mean_b,
    }


def estimate(
    policy: Any,
    episodes: Episodes,
    methods: Mapping[str, Mapping] | Sequence[str],
    gamma: float,
) -> dict[str, dict]:
    """Each method's estimates of `policy`'s value on `episodes` (see the module doc)."""
    methods = estimation_methods(methods)
    check_policy(policy, methods, episodes.where)
    batch = episodes.batch
    rewards = np.asarray(batch[SampleBatch.REWARDS], np.float64)
    discounts = gamma ** episodes.step.astype(np.float64)
    v_behavior = _per_episode(episodes, discounts * rewards)
    timed: dict[str, float] = {}
    start = time.perf_counter()
    new_prob = logged_action_probs(policy, batch)
    timed["target_probs_time_s"] = time.perf_counter() - start
    kinds = {m["type"] for m in methods.values()}
    ratios = None
    if kinds & set(NEEDS_LOGP):
        old_prob = np.exp(np.asarray(batch[SampleBatch.ACTION_LOGP], np.float64))
        ratios = new_prob / np.maximum(old_prob, EPSILON_PROB)
    out: dict[str, dict] = {}
    fitted: dict[str, tuple] = {}
    for name, spec in methods.items():
        began = time.perf_counter()
        kind = spec["type"]
        if kind in NEEDS_LOGP and "epsilon_prob" in spec:
            old_prob = np.exp(np.asarray(batch[SampleBatch.ACTION_LOGP], np.float64))
            ratios = new_prob / np.maximum(old_prob, float(spec["epsilon_prob"]))
        if kind == "ImportanceSampling":
            assert ratios is not None
            p = _cumulative_ratios(episodes, ratios)
            v_target = _per_episode(episodes, discounts * p * rewards)
            result = _summary(v_behavior, v_target)
            result["v_target_var"] = float(v_target.var())
            result["v_target_stderr"] = float(v_target.std() / np.sqrt(len(v_target)))
        elif kind == "WeightedImportanceSampling":
            assert ratios is not None
            p = _cumulative_ratios(episodes, ratios)
            v_target = _per_episode(episodes, discounts * p / _step_weights(episodes, p) * rewards)
            result = _summary(v_behavior, v_target)
        else:
            key = repr(sorted(dict(spec.get("q_model_config", {})).items()))
            if key not in fitted:
                fitted[key] = _fit_q(policy, episodes, spec, gamma)
            q_all, v_all, fit_stats = fitted[key]
            if kind == "DirectMethod":
                v_target = v_all[episodes.starts]
            else:
                assert ratios is not None
                v_target = _doubly_robust(episodes, rewards, ratios, q_all, v_all, gamma)
            result = {**_summary(v_behavior, v_target), **fit_stats}
        result["num_episodes"] = episodes.num_episodes
        result["num_steps"] = batch.count
        result["estimate_time_s"] = time.perf_counter() - began + timed["target_probs_time_s"]
        out[name] = result
    return out


def _step_weights(episodes: Episodes, p: np.ndarray) -> np.ndarray:
    """w at each row's step: mean over all episodes of p at that step, an episode that
    ended before it counting with its last p."""
    horizon = int(episodes.lengths.max())
    at_step = np.bincount(episodes.step, weights=p, minlength=horizon)
    last = p[episodes.starts + episodes.lengths - 1]
    ended = np.cumsum(np.bincount(episodes.lengths, weights=last, minlength=horizon + 1))
    w = (at_step + ended[:horizon]) / episodes.num_episodes
    return np.maximum(w[episodes.step], 1e-300)


def _fit_q(policy: Any, episodes: Episodes, spec: Mapping, gamma: float) -> tuple:
    """(Q of the logged actions' states [rows, n], V = sum_a pi Q [rows], statistics)."""
    batch = episodes.batch
    n = int(policy.action_space.n)
    count = batch.count

    def features(obs: Any) -> np.ndarray:
        return np.asarray(policy.preprocessor.transform(obs), np.float32).reshape(count, -1)

    x, next_x = features(batch[SampleBatch.OBS]), features(batch[SampleBatch.NEXT_OBS])
    probs = all_action_probs(policy, batch[SampleBatch.OBS], count, n)
    next_probs = all_action_probs(policy, batch[SampleBatch.NEXT_OBS], count, n)
    rewards = np.asarray(batch[SampleBatch.REWARDS], np.float64)
    model = FittedQ(x.shape[1], n, spec.get("q_model_config"))
    stats = model.fit(
        x,
        np.asarray(batch[SampleBatch.ACTIONS]),
        rewards,
        next_x,
        np.asarray(batch[SampleBatch.TERMINATEDS], bool),
        next_probs,
        _returns_to_go(episodes, rewards, gamma),
        gamma,
    )
    q = model.q_values(x)
    return q, (probs * q).sum(axis=1), stats


def _returns_to_go(episodes: Episodes, rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.zeros_like(rewards)
    for start, length in zip(episodes.starts.tolist(), episodes.lengths.tolist()):
        running = 0.0
        for i in range(start + length - 1, start - 1, -1):
            running = rewards[i] + gamma * running
            out[i] = running
    return out


def _doubly_robust(episodes, rewards, ratios, q_all, v_all, gamma) -> np.ndarray:
    actions = np.asarray(episodes.batch[SampleBatch.ACTIONS]).astype(np.int64)
    q_taken = q_all[np.arange(len(actions)), actions]
    value = np.zeros(episodes.num_episodes)
    for t in range(int(episodes.lengths.max()) - 1, -1, -1):
        rows = episodes.starts[episodes.lengths > t] + t
        eps = episodes.episode[rows]
        value[eps] = v_all[rows] + ratios[rows] * (
            rewards[rows] + gamma * value[eps] - q_taken[rows]
        )
    return value


# ----- at each evaluation of a run -------------------------------------------------------

PREFIX = "evaluation/off_policy_estimation/"


class OffPolicyEstimation:
    """A run's estimates at each evaluation, on the held-out episodes of its input (read
    once, at the first evaluation): metrics evaluation/off_policy_estimation/<name>/<key>."""

    def __init__(self, config: Any, make_policy: Any) -> None:
        self.config = config
        self.methods = estimation_methods(config.off_policy_estimation_methods)
        self._make_policy = make_policy
        self._policy: Any = None
        self._episodes: Episodes | None = None

    @classmethod
    def from_config(cls, config: Any, make_policy: Any) -> OffPolicyEstimation | None:
        if not getattr(config, "off_policy_estimation_methods", None):
            return None
        return cls(config, make_policy)

    def estimate(self, state: dict) -> dict:
        if self._policy is None:
            self._policy = self._make_policy(state)
        else:
            self._policy.set_state(state)
        if self._episodes is None:
            self._episodes = logged_episodes(
                self.config.input,
                self.methods,
                held_out=self.config.off_policy_estimation_held_out,
                name=f"{self.config.key_prefix}.input",
            )
        estimates = estimate(self._policy, self._episodes, self.methods, self.config.gamma)
        return {
            f"{PREFIX}{name}/{key}": value
            for name, values in estimates.items()
            for key, value in values.items()
        }
