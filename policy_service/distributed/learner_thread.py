"""LearnerThread: the learners train whenever a batch of fragments is ready.

    thread = LearnerThread({None: learners}, queue_size=4, num_sgd_steps=1,
                           broadcast_interval=1, max_policy_lag=None)
    thread.start()
    thread.offer(fragments)        # False when the queue is full: the caller waits
    thread.take_results()          # each update's Stats since the last call (metrics_logger.py)
    thread.take_weights()          # (version, weights) every broadcast_interval updates
    thread.last_gradients()        # the learners' last gradients, between two updates
    thread.stop()

A driver thread holds the LearnerGroups it trains (one learner in this process, or
N learner actors: the same calls) and a bounded queue of train batches, each a list
of fragments whose data stays in the object store until a learner reads it. Its
groups are {None: the group} in a single-agent run, or policy id -> group for every
policy trained on its own rows of multi-agent fragments. For each group the thread
deals the fragments holding rows of its policy across its learners by those rows (a
policy with fewer such fragments than learners sits this batch out), drops fragments
older than `max_policy_lag` updates (counted), and takes the trained weights for the
env runners after every `broadcast_interval` updates (None: never, when the learners
act themselves), so neither the sampling loop nor the learners wait for a broadcast.
`version` is the number of updates made (of every group at once); a fragment's lag
is version - the weights version that acted in it. An error in the thread is kept
and raised by `check()`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

from policy_service.distributed.fragment_stream import Fragment
from policy_service.policy.learning_results import NUM_SAMPLES_TRAINED
from policy_service.runs.metrics_logger import reduce_stats

_IDLE_POLL_S = 0.05


class LearnerThread(threading.Thread):
    """Trains `groups` (policy id or None -> LearnerGroup) on queued batches of Fragments."""

    def __init__(
        self,
        groups: dict,
        *,
        queue_size: int,
        num_sgd_steps: int,
        broadcast_interval: int | None,
        max_policy_lag: int | None,
        version: int = 0,
    ):
        super().__init__(name="learner-thread", daemon=True)
        self.groups = groups
        self.batches: queue.Queue[list[Fragment]] = queue.Queue(maxsize=queue_size)
        self.num_sgd_steps = int(num_sgd_steps)
        self.broadcast_interval = broadcast_interval
        self.max_policy_lag = max_policy_lag
        self.version = int(version)
        self.idle_s = 0.0
        self.dropped_fragments = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._results: list[dict] = []
        self._weights: tuple[int, dict] | None = None
        self._stopping = threading.Event()
        self._updating = threading.Lock()  # held by the thread through each update

    # ----- the caller's side -------------------------------------------------------

    def offer(self, fragments: list[Fragment]) -> bool:
        """Queue one train batch -> False (nothing queued) when the queue is full."""
        try:
            self.batches.put_nowait(list(fragments))
            return True
        except queue.Full:
            return False

    def queue_fill(self) -> float:
        """Queued batches / queue size."""
        return self.batches.qsize() / self.batches.maxsize

    def take_results(self) -> list[dict]:
        with self._lock:
            results, self._results = self._results, []
        return results

    def take_weights(self) -> tuple[int, dict] | None:
        """The newest weights taken for the env runners since the last call, or None."""
        with self._lock:
            weights, self._weights = self._weights, None
        return weights

    def last_gradients(self) -> dict:
        """LearnerGroup.last_gradients (multi-agent: by policy id), taken between two
        updates (the learners' collectives of the two calls must not interleave): waits
        for at most one."""
        with self._updating:
            return by_policy({p: group.last_gradients() for p, group in self.groups.items()})

    @contextlib.contextmanager
    def updates_held(self):
        """No update runs inside (a consistent learner state and version to save);
        queued batches wait, none is dropped. Waits for the update running, if any."""
        with self._updating:
            yield

    def check(self) -> None:
        """Raise what stopped the thread, if anything did."""
        if self.error is not None:
            raise self.error

    def stop(self) -> int:
        """End the thread after its current update -> queued fragments dropped with it."""
        self._stopping.set()
        if self.is_alive():
            self.join()
        dropped = 0
        while True:
            try:
                dropped += len(self.batches.get_nowait())
            except queue.Empty:
                return dropped

    # ----- the thread ----------------------------------------------------------------

    def run(self) -> None:
        while not self._stopping.is_set():
            start = time.perf_counter()
            try:
                fragments = self.batches.get(timeout=_IDLE_POLL_S)
            except queue.Empty:
                self.idle_s += time.perf_counter() - start
                continue
            self.idle_s += time.perf_counter() - start
            try:
                with self._updating:
                    self._train(fragments)
            except BaseException as error:  # noqa: BLE001 - kept for the caller's check()
                self.error = error
                return

    def _train(self, fragments: list[Fragment]) -> None:
        fresh = [f for f in fragments if not self._too_old(f)]
        self.dropped_fragments += len(fragments) - len(fresh)
        results = {}
        for policy_id, group in self.groups.items():
            shards = deal(fresh, group.num_learners or 1, policy_id)
            if all(shards):  # else fewer fragments with its rows than learners: sits out
                results[policy_id] = group.update_on_fragments(
                    [[f.batch for f in shard] for shard in shards],
                    self.version,
                    self.num_sgd_steps,
                    policy_id,
                )
        if not results:  # nothing to train on
            self.dropped_fragments += len(fresh)
            return
        stats = update_stats(results)
        self.version += 1
        for policy_id, group in self.groups.items():
            if policy_id not in results:  # sat out: its weights are its latest all the same
                group.set_acting_version(self.version)
        weights = None
        if self.broadcast_interval is not None and self.version % self.broadcast_interval == 0:
            trained = {p: self.groups[p].get_weights() for p in results}
            weights = (self.version, by_policy(trained))
        with self._lock:
            self._results.append(stats)
            if weights is not None:
                self._weights = weights

    def _too_old(self, fragment: Fragment) -> bool:
        lag = self.version - fragment.weights_version
        return self.max_policy_lag is not None and lag > self.max_policy_lag


def deal(
    fragments: list[Fragment], num_shards: int, policy_id: str | None = None
) -> list[list[Fragment]]:
    """The fragments holding rows of `policy_id` (None: all, by env steps) into
    `num_shards` lists of about equal rows (largest first, each to the lightest shard)."""
    shards: list[list[Fragment]] = [[] for _ in range(num_shards)]
    rows = [0] * num_shards
    holding = [f for f in fragments if f.rows(policy_id)]
    for fragment in sorted(holding, key=lambda f: -f.rows(policy_id)):
        lightest = rows.index(min(rows))
        shards[lightest].append(fragment)
        rows[lightest] += fragment.rows(policy_id)
    return shards


def by_policy(results: dict):
    """{None: x} -> x (a single-agent run's); else the dict of policy id -> x itself."""
    return results[None] if None in results else results


def update_stats(results: dict) -> dict:
    """One update's Stats from each trained policy's (policy id -> its LearnerGroup's;
    None: a single-agent run's, as they are): each as "<policy id>/<stat>", and over all
    policies' rows the samples trained, the policy lag's mean (weighted by them) and max."""
    if None in results:
        return results[None]
    rows = [r[NUM_SAMPLES_TRAINED].value for r in results.values()]
    over_policies = reduce_stats(
        [
            {k: r[k] for k in (NUM_SAMPLES_TRAINED, "policy_lag_mean", "policy_lag_max")}
            for r in results.values()
        ],
        weights=rows if sum(rows) else None,  # an update without rows: plain means
    )
    return {
        **{f"{p}/{k}": stat for p, r in results.items() for k, stat in r.items()},
        **over_policies,
    }
