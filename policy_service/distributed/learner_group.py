"""LearnerGroup: one policy trained data-parallel by N learner actors, or in the driver.

The loop it lives in (an algorithm's training step):

    learners = LearnerGroup(MyPolicy, obs_space, act_space, {"num_learners": 2,
                            "num_gpus_per_learner": 1, ...})
    stats = learners.update(train_batch, num_epochs=10)  # loaded once, 10 epochs of SGD
    stats["num_samples_trained"]                          # valid rows x passes over them
    env_runners.sync_weights(learners.get_weights())
    learners.save("learner/"); learners.restore("learner/")
    learners.stop()

`update` is the learner's one training call (Acme's `Learner.step`); the
TFPolicy-like methods under it (`learn_on_batch`, `load_batch_into_buffer`,
`learn_on_loaded_epochs`, ...) stay for finer control.

`num_learners=0`: the learner is a TFPolicy in this process (a group of one;
its towers are `num_gpus`). N: N `LearnerHost` Ray actors, reserved as one
placement group (`learner_placement_strategy`) before any starts, each a
TFPolicy on `num_gpus_per_learner` towers. The driver prepares each train
batch once (checks, preprocessing, sequences) and shards it at unit
boundaries (rows, or whole padded sequences); each learner's tower stack
all-reduces its valid-row count and count-weighted sums inside the compiled
step (engine/towers.py), so the group applies the step of the whole batch
on one device and every learner keeps identical weights. Statistics are the
group's (every learner returns the same; learner 0's are returned).

A learner actor that dies fails the call at once with `LearnerDiedError`
(the survivors may wait in a collective with it: their all-reduces have no
per-op timeout, which would hold two TF threads per all-reduce). A call that
gives no result within `learner_update_timeout_s` (a learner hung, e.g. in a
collective with a stopped peer) fails with `LearnerTimeoutError`, a
LearnerDiedError. Either way the group's collectives are lost, so
`restart(state)` replaces the whole group from the caller's last full copy
of the learner state (weights and optimizer); the caller retries its step
(algorithms/algorithm.py does, within its restart budget).

A policy subclass that overrides `train_columns` is not followed here: the
driver prepares batches with `policy_service.train_batches`.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from policy_service import models, spaces
from policy_service.config import config_for
from policy_service.distributed.learner_actor import LearnerHost
from policy_service.distributed.learner_shards import split_minibatches, split_units
from policy_service.engine.collectives import CollectivePeerError
from policy_service.errors import UserError
from policy_service.io import checkpoints
from policy_service.sample_batch import SampleBatch
from policy_service.train_batches import TrainColumns, prepare_train_columns

READY_TIMEOUT_S = 60.0  # placement group and actors up, or an error naming the resource
CONNECT_TIMEOUT_S = 180.0
NUM_SAMPLES_TRAINED = "num_samples_trained"  # update()'s count of samples trained on


class LearnerResourcesError(UserError, RuntimeError):
    """The cluster cannot hold the learners asked for."""


class LearnerDiedError(RuntimeError):
    """A learner actor died, or a collective with a dead one failed: the group
    must be restarted (`LearnerGroup.restart`)."""


class LearnerTimeoutError(LearnerDiedError):
    """A call to the learners gave no result within `learner_update_timeout_s`."""


class LearnerGroup:
    """TFPolicy's learning methods, with the same meaning, over all learners.

    call_timeout_s: the deadline of every call to the learner actors, from
    `learner_update_timeout_s` (may be changed between calls)."""

    def __init__(self, policy_cls: type, observation_space: gym.Space,
                 action_space: gym.Space, config: Any = None, *,
                 ready_timeout_s: float = READY_TIMEOUT_S):
        self.config = config_for(policy_cls, config)
        self.policy_cls = policy_cls
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_learners = int(self.config.num_learners)
        self.local_policy = None
        self._learners: list = []
        self._placement_group = None
        self._loaded_rows: dict[int, int] = {}
        self._ready_timeout_s = ready_timeout_s
        self.call_timeout_s = float(self.config.learner_update_timeout_s)
        self.num_restarts = 0
        if self.num_learners == 0:
            self.local_policy = policy_cls(observation_space, action_space, self.config)
            self.num_towers = self.local_policy.towers.num_towers
            self.devices = [self.local_policy.devices]
            return
        self._preprocessor = spaces.make_preprocessor(observation_space)
        try:
            self._start_learners(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    # ----- starting and stopping ----------------------------------------------------

    def _start_learners(self, ready_timeout_s: float) -> None:
        if not ray.is_initialized():
            raise RuntimeError(f"num_learners={self.num_learners} needs Ray: call ray.init() "
                               "(or distributed.ray_runtime.start_ray) before the LearnerGroup")
        bundle = learner_bundle(self.config)
        if bundle:
            self._placement_group = reserve_placement_group(
                bundle, self.num_learners, self.config.learner_placement_strategy,
                ready_timeout_s)
        actor_cls = ray.remote(LearnerHost)
        registry = models.custom_model_registry()
        for rank in range(self.num_learners):
            options = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0)}
            if self._placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=rank)
            self._learners.append(actor_cls.options(**options).remote(
                self.policy_cls, self.observation_space, self.action_space, self.config,
                registry))
        addresses = ray.get([learner.address.remote() for learner in self._learners],
                            timeout=CONNECT_TIMEOUT_S)
        infos = ray.get([learner.connect.remote(rank, addresses)
                         for rank, learner in enumerate(self._learners)],
                        timeout=CONNECT_TIMEOUT_S)
        self.num_towers = infos[0]["num_towers"]
        self.devices = [info["devices"] for info in infos]
        self._num_state_tensors = infos[0]["num_state_tensors"]
        if self.num_learners > 1:  # a seedless config initializes each learner differently
            # the whole state, not only the weights: a target network starts as a copy too
            state = ray.put(ray.get(self._learners[0].get_state.remote()))
            ray.get([learner.set_state.remote(state) for learner in self._learners[1:]])

    @property
    def actors(self) -> list:
        """The learner actors' handles, by rank (empty with num_learners=0)."""
        return list(self._learners)

    def restart(self, state: dict) -> None:
        """Replace every learner with a fresh one holding `state` (a `get_state()`
        copy: weights, optimizer variables, RNG, counters); loaded buffers are gone."""
        if self.local_policy is not None:
            raise RuntimeError("a learner in the driver (num_learners=0) is never restarted")
        self.stop()
        self._loaded_rows.clear()
        try:
            self._start_learners(self._ready_timeout_s)
            self.set_state(state)
        except BaseException:
            self.stop()
            raise
        self.num_restarts += 1

    def stop(self) -> None:
        """End the learner actors and free their reservation (idempotent)."""
        for learner in self._learners:
            ray.kill(learner)
        self._learners = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None

    # ----- learning -----------------------------------------------------------------

    def update(self, batch: SampleBatch, *, num_epochs: int | None = None,
               shuffle: bool = True, buffer_index: int = 0) -> dict:
        """Train on `batch` -> statistics, with "num_samples_trained": the valid
        (unpadded) rows trained on, counted once per pass over them.

        num_epochs None: one SGD step on the whole batch (`learn_on_batch`).
        N: the batch loaded onto every learner's towers once, then N epochs of
        `minibatch_size` SGD steps in one compiled call per learner
        (`load_batch_into_buffer` + `learn_on_loaded_epochs`)."""
        if num_epochs is None:
            stats = self.learn_on_batch(batch)
        else:
            if num_epochs < 1:
                raise ValueError(f"num_epochs must be None or >= 1, got {num_epochs}")
            self.load_batch_into_buffer(batch, buffer_index)
            stats = self.learn_on_loaded_epochs(num_epochs, buffer_index, shuffle)
        stats = dict(stats)
        stats[NUM_SAMPLES_TRAINED] = samples_trained(stats)
        return stats

    def learn_on_batch(self, batch: SampleBatch) -> dict:
        """One SGD step on the whole batch over all learners -> statistics."""
        if self.local_policy is not None:
            return self.local_policy.learn_on_batch(batch)
        shards = split_units(self._train_columns(batch), self.num_learners)
        return self._on_each("learn_on_train_columns", [(s,) for s in shards])[0]

    def compute_gradients(self, batch: SampleBatch):
        """-> (the group's combined, clipped gradients, statistics); no weights change."""
        if self.local_policy is not None:
            return self.local_policy.compute_gradients(batch)
        shards = split_units(self._train_columns(batch), self.num_learners)
        return self._on_each("compute_gradients_on_train_columns", [(s,) for s in shards])[0]

    def apply_gradients(self, gradients) -> None:
        if self.local_policy is not None:
            return self.local_policy.apply_gradients(gradients)
        self._on_all("apply_gradients", gradients)

    def load_batch_into_buffer(self, batch: SampleBatch, buffer_index: int = 0) -> int:
        """Each learner loads its 1/N of every minibatch -> rows loaded over all
        learners, padding included."""
        if self.local_policy is not None:
            return self.local_policy.load_batch_into_buffer(batch, buffer_index)
        train = self._train_columns(batch, fixed_seq_len=True)
        minibatch_size = self.config.minibatch_size
        shards = split_minibatches(train, self.num_learners, minibatch_size, self.num_towers,
                                   self.config.num_grad_accumulation_steps)
        rows = sum(self._on_each("load_train_columns_into_buffer",
                                 [(s, buffer_index, minibatch_size // self.num_learners)
                                  for s in shards]))
        self._loaded_rows[buffer_index] = rows
        return rows

    def get_num_samples_loaded_into_buffer(self, buffer_index: int = 0) -> int:
        if self.local_policy is not None:
            return self.local_policy.get_num_samples_loaded_into_buffer(buffer_index)
        return sum(self._on_all("get_num_samples_loaded_into_buffer", buffer_index))

    def learn_on_loaded_batch(self, offset: int = 0, buffer_index: int = 0) -> dict:
        """One SGD step on the group's minibatch at row `offset` of the loaded batch."""
        if self.local_policy is not None:
            return self.local_policy.learn_on_loaded_batch(offset, buffer_index)
        step_rows = self.config.minibatch_size * self.config.num_grad_accumulation_steps
        loaded = self._loaded_rows.get(buffer_index, 0)
        if offset % step_rows or not 0 <= offset < max(loaded, 1):
            raise ValueError(f"offset {offset} must be a multiple of minibatch_size x "
                             f"num_grad_accumulation_steps = {step_rows} below {loaded} "
                             f"rows loaded into buffer {buffer_index}")
        return self._on_all("learn_on_loaded_batch", offset // self.num_learners,
                            buffer_index)[0]

    def learn_on_loaded_epochs(self, num_epochs: int | None = None, buffer_index: int = 0,
                               shuffle: bool = True) -> dict:
        """All epochs of minibatch SGD over the loaded batch, in one compiled call
        per learner; the all-reduce of every step sits inside it."""
        if self.local_policy is not None:
            return self.local_policy.learn_on_loaded_epochs(num_epochs, buffer_index, shuffle)
        return self._on_all("learn_on_loaded_epochs", num_epochs, buffer_index, shuffle)[0]

    # ----- weights and state ----------------------------------------------------------

    def get_weights(self) -> dict:
        return self._from_one("get_weights")

    def set_weights(self, weights: dict, new_rate: float = 1.0) -> None:
        """new_rate * weights + (1 - new_rate) * current on every learner (TFPolicy's)."""
        self._on_every("set_weights", weights, new_rate)

    def get_state(self) -> dict:
        """Weights, optimizer variables, RNG and counters (learner 0's: all are equal)."""
        return self._from_one("get_state")

    def get_state_ref(self):
        """An ObjectRef to learner 0's get_state(), not waited for (learner actors only)."""
        if not self._learners:
            raise RuntimeError("this LearnerGroup has no learner actors (stopped, or "
                               "num_learners=0)")
        return self._learners[0].get_state.remote()

    def set_state(self, state: dict) -> None:
        self._on_every("set_state", state)

    def save(self, directory: str) -> str:
        """Write the learner state (get_state) atomically, npz + JSON -> the directory;
        `TFPolicy.from_checkpoint` reads it too."""
        state = self.get_state()
        with checkpoints.atomic_directory(directory) as tmp:
            checkpoints.write_policy_state(tmp, state)
        return str(Path(directory).absolute())

    def restore(self, directory: str) -> None:
        """Set the state `save` wrote: every file checked first (CheckpointFileError, one
        line naming it), then all of it or, on a state that does not fit, nothing."""
        self.set_state(checkpoints.read_policy_state(directory))

    def _from_one(self, method: str):
        """`method` of the local policy, or of learner 0 (every learner holds the same)."""
        if self.local_policy is not None:
            return getattr(self.local_policy, method)()
        return self._results([getattr(self._learners[0], method).remote()])[0]

    def _on_every(self, method: str, *args) -> None:
        """`method` on the local policy, or on every learner."""
        if self.local_policy is not None:
            getattr(self.local_policy, method)(*args)
        else:
            self._on_all(method, *args)

    def weights_identical(self) -> bool:
        """Whether every learner holds bit-identical weights (checked by fingerprints
        over the collective group, not by moving the weights)."""
        if self.local_policy is not None:
            return True
        return all(self._on_all("weights_identical"))

    def foreach_policy(self, fn: Callable, *args) -> list:
        """fn(policy, *args) on every learner's policy -> the results, by rank. For
        state an algorithm keeps in the policy (PPO's KL coefficient): every learner
        must change it alike."""
        if self.local_policy is not None:
            return [fn(self.local_policy, *args)]
        return self._on_all("foreach_policy", fn, *args)

    # ----- internals ------------------------------------------------------------------

    def _train_columns(self, batch: SampleBatch, fixed_seq_len: bool = False) -> TrainColumns:
        return prepare_train_columns(
            batch, preprocessor=self._preprocessor, action_space=self.action_space,
            num_state_tensors=self._num_state_tensors,
            max_seq_len=self.config.model.max_seq_len,
            loss_columns=getattr(self.policy_cls, "loss_columns", None),
            fixed_seq_len=fixed_seq_len)

    def _on_all(self, method: str, *args) -> list:
        """The same call on every learner (arguments put in the object store once)."""
        args = [ray.put(a) if isinstance(a, dict) else a for a in args]
        return self._results([getattr(learner, method).remote(*args)
                              for learner in self._learners])

    def _on_each(self, method: str, args_per_learner: list) -> list:
        return self._results([getattr(learner, method).remote(*args)
                              for learner, args in zip(self._learners, args_per_learner)])

    def _results(self, refs: list) -> list:
        """Every learner's result, by rank; the first death seen ends the wait (the
        others may be blocked in a collective with the dead one), and so does
        `call_timeout_s` without all results (LearnerTimeoutError)."""
        if not self._learners:
            raise RuntimeError("this LearnerGroup is stopped")
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results, pending = {}, list(refs)
        deadline = time.monotonic() + self.call_timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                hung = ", ".join(str(rank_of[ref]) for ref in pending)
                raise LearnerTimeoutError(
                    f"learner(s) {hung} of {self.num_learners} gave no result within "
                    f"learner_update_timeout_s={self.call_timeout_s:g} s: hung (e.g. in a "
                    "collective with a stopped peer); the group must be restarted")
            try:
                results[ready[0]] = ray.get(ready[0])
            except RayActorError as err:
                raise LearnerDiedError(f"learner {rank_of[ready[0]]} of {self.num_learners} "
                                       f"died: {type(err).__name__}") from err
            except RayTaskError as err:
                if isinstance(err.cause, CollectivePeerError):
                    raise LearnerDiedError(f"learner {rank_of[ready[0]]} of "
                                           f"{self.num_learners}: {err.cause}") from err
                raise
        return [results[ref] for ref in refs]


def samples_trained(stats: dict) -> int:
    """Valid rows trained on, from a learning call's statistics: "valid_rows" is per
    SGD step (the mean over the steps of a loaded-epochs call, "num_sgd_steps")."""
    if "valid_rows" not in stats:
        raise KeyError(f"learning statistics lack 'valid_rows' (have {sorted(stats)})")
    return round(float(stats["valid_rows"]) * float(stats.get("num_sgd_steps", 1)))


# ----- reserving the learners' resources -------------------------------------------------


def learner_bundle(config) -> dict:
    """Ray resources of one learner: its CPUs, and its GPUs unless they are fake."""
    bundle = {}
    if config.num_cpus_per_learner > 0:
        bundle["CPU"] = float(config.num_cpus_per_learner)
    if config.num_gpus_per_learner > 0 and not config._fake_gpus:
        bundle["GPU"] = float(config.num_gpus_per_learner)
    return bundle


_KEY_OF = {"CPU": "num_cpus_per_learner", "GPU": "num_gpus_per_learner"}


def resource_shortfall(bundle: dict, count: int, total: dict, available: dict) -> str | None:
    """A one-line description of the first resource the cluster cannot give
    `count` learners of `bundle` (None when every total suffices)."""
    for resource, amount in bundle.items():
        asked = amount * count
        if total.get(resource, 0.0) + 1e-9 < asked:
            return (f"{count} learner(s) need {resource} {asked:g} in total "
                    f"({_KEY_OF.get(resource, resource)}={amount:g} each); the cluster has "
                    f"{resource} {total.get(resource, 0.0):g} "
                    f"({available.get(resource, 0.0):g} available)")
    return None


def reserve_placement_group(bundle: dict, count: int, strategy: str, timeout_s: float):
    """One placement group of `count` learner bundles, ready, or LearnerResourcesError:
    at once when the cluster's totals fall short, else after `timeout_s`."""
    shortfall = resource_shortfall(bundle, count, ray.cluster_resources(),
                                   ray.available_resources())
    if shortfall:
        raise LearnerResourcesError(shortfall)
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if ready:
        return group
    remove_placement_group(group)
    available = ray.available_resources()
    asked = ", ".join(f"{r} {a * count:g} ({_KEY_OF.get(r, r)}={a:g} each)"
                      for r, a in bundle.items())
    have = ", ".join(f"{r} {available.get(r, 0.0):g}" for r in bundle)
    raise LearnerResourcesError(
        f"{count} learner(s) ({strategy}) not placed within {timeout_s:g} s: asked {asked}; "
        f"available now {have}")
