"""WeightSync on a real local Ray, with small receiver actors: one object-store copy per
broadcast read by every receiver, the version rule, policy-id weights merged into the
latest, a receiver's own error raised by the next check, and a replacement given only
the weights it missed.

(The env runners on it: test_env_runner_group.py, test_multi_agent_env_runners.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import ray

from policy_service.distributed.weight_sync import WeightSync, next_version

# ray_local sends this module's actors by value: workers cannot import it
PICKLE_BY_VALUE = True


@ray.remote(num_cpus=0)
class Receiver:
    """Keeps what its set_weights got; refuses a version of 13 (its own error)."""

    def __init__(self):
        self.calls: list = []

    def set_weights(self, weights, version, num_grad_updates=None):
        if version == 13:
            raise ValueError("receiver refuses version 13")
        self.calls.append((weights, version, num_grad_updates))
        return version

    def received(self) -> list:
        return self.calls


def test_next_version_takes_the_given_one_or_adds_one():
    assert next_version(4) == 5
    assert next_version(4, 9) == 9
    assert next_version(4, np.int64(0)) == 0
    with pytest.raises(ValueError, match="version must be None or an integer >= 0, got -1"):
        next_version(4, -1)


def test_every_receiver_reads_one_object_store_copy(ray_local, monkeypatch):
    sync = WeightSync()
    assert sync.take({"w": np.ones(3)}) == 1 and sync.take({"w": np.full(3, 2.0)}, 7, 40) == 7
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value: puts.append(value) or real_put(value))
    receivers = [Receiver.remote() for _ in range(3)]
    ray.get(sync.send(receivers[:2]) + sync.send(receivers[2:]))
    assert len(puts) == 1  # one put for every receiver of one broadcast
    for receiver in receivers:
        [(weights, version, num_grad_updates)] = ray.get(receiver.received.remote())
        assert version == 7 and num_grad_updates == 40
        np.testing.assert_array_equal(weights["w"], np.full(3, 2.0))


def test_policy_weights_merge_into_the_latest():
    sync = WeightSync()
    sync.take({"a": {"w": 1}, "b": {"w": 2}}, 0)
    assert sync.take({"b": {"w": 3}}) == 1
    assert sync.weights == {"a": {"w": 1}, "b": {"w": 3}}


def test_a_receivers_error_is_raised_by_the_next_check(ray_local):
    sync = WeightSync()
    sync.take({"w": np.zeros(2)}, 13)
    refs = sync.send([Receiver.remote()])
    sync.expect(refs)
    ray.wait(refs)
    with pytest.raises(ValueError, match="receiver refuses version 13"):
        sync.check_acks()
    sync.check_acks()  # raised once: nothing left to raise


def test_a_replacement_gets_the_latest_and_then_only_what_it_missed(ray_local):
    sync = WeightSync()
    receiver = Receiver.remote()
    sync.replacement_started("slot")
    assert sync.send_to_replacement("nothing put yet", receiver) is None
    sync.take({"w": np.zeros(1)}, 3)
    sync.ref()
    ray.get(sync.send_to_replacement("slot", receiver))
    sync.catch_up("slot", receiver)  # nothing new since it started
    sync.take({"w": np.ones(1)}, 4)
    sync.replacement_started("later")
    sync.ref()
    sync.catch_up("later", receiver)  # started with 4: nothing to send
    sync.replacement_started("slot")
    sync.take({"w": np.full(1, 5.0)}, 5)
    sync.ref()
    sync.catch_up("slot", receiver)  # started with 4, now 5: sent
    sync.catch_up("acts elsewhere", receiver)  # never recorded (acting through a PolicyActor)
    sync.check_acks()
    versions = [version for _, version, _ in ray.get(receiver.received.remote())]
    assert versions == [3, 5]
