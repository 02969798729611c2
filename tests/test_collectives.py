"""CollectiveGroup: exact sums across two Ray actor processes, in a tf.function and
in a while loop; a group of one is the identity; RING without GPUs; a dead or
hung peer is an error within the timeout, not a hang; without a per-op timeout
(the default) thousands of all-reduces start no threads."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from policy_service.engine import collectives
from policy_service.engine.collectives import CollectiveGroup

ray = pytest.importorskip("ray")

LOOP_ITERATIONS = 50
SHORT_TIMEOUT_S = 3.0
# well above the timeout on a machine 5x slower and busy, well below ray.get's 60 s
NOT_A_HANG_S = 45.0


def rank_values(rank: int) -> list[np.ndarray]:
    """Different values per rank, in several shapes and dtypes."""
    r = rank + 1
    return [
        np.arange(12, dtype=np.float32).reshape(3, 4) * r + r,
        np.linspace(-1.0, 1.0, 5) * r**2,  # float64
        np.array([[r, -r], [7 * r, 100]], dtype=np.int32),
        np.array(0.25 * r, dtype=np.float32),
    ]  # a scalar


class Member:
    """One group member in its own process, configured before TF initializes."""

    def __init__(self, timeout_s: float | None, probe_timeout_s: float = 120.0):
        from policy_service.engine import devices

        devices.prepare_process(1)
        from policy_service.engine.collectives import CollectiveGroup

        self.group = CollectiveGroup(timeout_s=timeout_s, probe_timeout_s=probe_timeout_s)
        self.reduce_in_function = tf.function(self.group.all_reduce_sum)

    def address(self) -> str:
        return self.group.address

    def connect(self, rank: int, addresses: list[str]) -> str:
        self.group.connect(rank, addresses)
        return self.group.implementation

    def sum_in_function(self, rank: int) -> list:
        values = [tf.constant(v) for v in rank_values(rank)]
        summed = tf.function(self.group.all_reduce_sum)(values)
        return [t.numpy() for t in summed] + [summed[0].device]

    def sum_eagerly(self, rank: int) -> list:
        return [
            t.numpy()
            for t in self.group.all_reduce_sum([tf.constant(v) for v in rank_values(rank)])
        ]

    def sum_twice_in_one_function(self, rank: int) -> list:
        """Two calls with the same shapes in one function need distinct keys."""

        @tf.function
        def twice(x):
            first = self.group.all_reduce_sum([x])[0]
            return first, self.group.all_reduce_sum([first * 2.0])[0]

        return [t.numpy() for t in twice(tf.fill([1000], float(rank + 1)))]

    def sum_after_tracing_in_rank_order(self, rank: int) -> list:
        """Members trace two functions in opposite orders, then run them alike:
        keys must not depend on the order of tracing."""
        small = tf.function(lambda x: self.group.all_reduce_sum([x])[0])
        large = tf.function(lambda x: self.group.all_reduce_sum([x, x])[1])
        specs = [(small, tf.TensorSpec([10])), (large, tf.TensorSpec([20]))]
        for fn, spec in specs if rank == 0 else specs[::-1]:
            fn.get_concrete_function(spec)
        return [small(tf.fill([10], rank + 1.0)).numpy(), large(tf.fill([20], rank + 1.0)).numpy()]

    def sum_in_while_loop(self, rank: int) -> list:
        """acc += all_reduce(x * i) for i in 0..N-1, inside one compiled loop."""
        values = [tf.constant(v) for v in rank_values(rank)]
        accumulators = [tf.Variable(tf.zeros_like(v)) for v in values]

        @tf.function
        def loop():
            def body(i):
                scaled = [v * tf.cast(i, v.dtype) for v in values]
                for acc, s in zip(accumulators, self.group.all_reduce_sum(scaled)):
                    acc.assign_add(s)
                return i + 1

            tf.while_loop(lambda i: i < LOOP_ITERATIONS, body, [tf.constant(0)])
            return [acc.read_value() for acc in accumulators]

        return [t.numpy() for t in loop()]

    def all_identical(self, rank: int) -> tuple[bool, bool]:
        same = [tf.constant(v) for v in rank_values(0)]
        different = same[:-1] + [tf.constant(np.float32(rank))]
        check = tf.function(self.group.all_identical)
        return bool(check(same)), bool(check(different))

    def weighted_means(self, rank: int, weights: list, poison: bool = False) -> dict:
        """all_reduce_weighted_mean beside the same sums done tensor by tensor (scale,
        all_reduce_sum, divide): float32 tensors (one packed buffer) and a float64 one
        (one collective per dtype). poison: this member's tensors hold NaN and inf."""
        values = [v for v in rank_values(rank) if v.dtype.kind == "f"]  # 3 x f32, 1 x f64
        if poison:
            values = [
                np.full_like(v, np.nan) if i % 2 else np.full_like(v, np.inf)
                for i, v in enumerate(values)
            ]
        weight = tf.constant(weights[rank], tf.float32)

        @tf.function
        def both(tensors):
            f32 = [t for t in tensors if t.dtype == tf.float32]
            fused, total = self.group.all_reduce_weighted_mean(f32, weight)
            mixed, mixed_total = self.group.all_reduce_weighted_mean(tensors, weight)
            summed = self.group.all_reduce_sum(
                [tf.reshape(weight, [1])]
                + [tf.math.multiply_no_nan(t, tf.cast(weight, t.dtype)) for t in tensors]
            )
            by_hand = [tf.math.divide_no_nan(x, tf.cast(summed[0][0], x.dtype)) for x in summed[1:]]
            return fused, total, mixed, mixed_total, by_hand

        fused, total, mixed, mixed_total, by_hand = both([tf.constant(v) for v in values])
        return {
            "fused": [t.numpy() for t in fused],
            "total": float(total),
            "mixed": [t.numpy() for t in mixed],
            "mixed_total": float(mixed_total),
            "by_hand": [t.numpy() for t in by_hand],
        }

    def threads_around_all_reduces(self, iterations: int) -> tuple[int, int]:
        """This process's threads before and after `iterations` one-element
        all-reduces in one compiled loop (traced and run once before)."""
        from policy_service.distributed.learner_actor import thread_count

        total = tf.Variable(0.0)

        @tf.function
        def loop(n):
            def body(i):
                total.assign_add(self.group.all_reduce_sum([tf.ones([1])])[0][0])
                return i + 1

            tf.while_loop(lambda i: i < n, body, [tf.constant(0)])
            return total.read_value()

        loop(tf.constant(10))  # traced, executors and gRPC channels up
        before = thread_count()
        expected = float(total.numpy()) + 2.0 * iterations
        if float(loop(tf.constant(iterations))) != expected:  # every all-reduce ran
            raise AssertionError(f"sum {float(total.numpy())}, expected {expected}")
        return before, thread_count()

    def timed_probe(self) -> tuple[str, float]:
        """Seconds until a probe returns or fails, and how it failed."""
        start = time.perf_counter()
        try:
            self.group.probe()
        except collectives.CollectivePeerError as err:
            return str(err), time.perf_counter() - start
        return "no error", time.perf_counter() - start

    def timed_sum(self) -> tuple[str, float]:
        """Seconds until an all-reduce returns or fails, and how it failed."""
        start = time.perf_counter()
        try:
            with self.group.peer_errors():
                self.reduce_in_function([tf.ones([135_000])])[0].numpy()
        except collectives.CollectivePeerError as err:
            return str(err), time.perf_counter() - start
        return "no error", time.perf_counter() - start


@pytest.fixture(scope="module")
def remote_member(ray_local):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray.remote(Member).options(num_cpus=0.5)
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def start_group(
    remote_member, size: int, timeout_s: float | None = 60.0, probe_timeout_s: float = 120.0
) -> list:
    members = [remote_member.remote(timeout_s, probe_timeout_s) for _ in range(size)]
    addresses = ray.get([m.address.remote() for m in members])
    implementations = ray.get(
        [m.connect.remote(rank, addresses) for rank, m in enumerate(members)], timeout=120
    )
    assert implementations == [collectives.RING] * size  # no GPU on this machine
    return members


@pytest.fixture(scope="module")
def pair(remote_member):
    members = start_group(remote_member, 2)
    yield members
    for m in members:
        ray.kill(m)


def expected_sums(size: int) -> list[np.ndarray]:
    return [sum(rank_values(r)[i] for r in range(size)) for i in range(len(rank_values(0)))]


def assert_exact(results: list, expected: list[np.ndarray]) -> None:
    for got, want in zip(results, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # small integers and halves: exact


def test_sums_in_a_function_are_exact_in_every_member(pair):
    results = ray.get([m.sum_in_function.remote(r) for r, m in enumerate(pair)])
    for rank, result in enumerate(results):
        assert_exact(result[:-1], expected_sums(2))
        assert f"/task:{rank}/" in result[-1]  # the result stays in its own process


def test_eager_sums_and_two_sums_in_one_function(pair):
    for result in ray.get([m.sum_eagerly.remote(r) for r, m in enumerate(pair)]):
        assert_exact(result, expected_sums(2))
    for first, second in ray.get(
        [m.sum_twice_in_one_function.remote(r) for r, m in enumerate(pair)]
    ):
        np.testing.assert_array_equal(first, np.full(1000, 3.0, np.float32))
        np.testing.assert_array_equal(second, np.full(1000, 12.0, np.float32))


def test_keys_do_not_depend_on_the_order_functions_were_traced(pair):
    for small, large in ray.get(
        [m.sum_after_tracing_in_rank_order.remote(r) for r, m in enumerate(pair)]
    ):
        np.testing.assert_array_equal(small, np.full(10, 3.0, np.float32))
        np.testing.assert_array_equal(large, np.full(20, 3.0, np.float32))


def test_sums_inside_a_while_loop_accumulate_exactly(pair):
    steps = sum(range(LOOP_ITERATIONS))
    expected = [(s * steps).astype(s.dtype) for s in expected_sums(2)]
    for result in ray.get([m.sum_in_while_loop.remote(r) for r, m in enumerate(pair)], timeout=120):
        for got, want in zip(result, expected):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_weighted_means_are_bit_identical_to_scaling_each_tensor(pair):
    """The packed buffer [1, t...] scaled and divided whole gives the same bits as
    each tensor scaled and divided on its own (the LearnerGroup's exactness rests
    on it); mixed dtypes take one collective per dtype and agree too."""
    results = ray.get([m.weighted_means.remote(rank, [3.0, 5.0]) for rank, m in enumerate(pair)])
    f32 = [v for v in rank_values(0) if v.dtype == np.float32]
    for got in results:
        assert got["total"] == got["mixed_total"] == 8.0
        by_hand_f32 = [v for v in got["by_hand"] if v.dtype == np.float32]
        assert len(got["fused"]) == len(f32) == len(by_hand_f32)
        for fused, by_hand in zip(got["fused"], by_hand_f32):
            np.testing.assert_array_equal(fused, by_hand)
        assert [t.dtype for t in got["mixed"]] == [np.float32, np.float64, np.float32]
        for mixed, by_hand in zip(got["mixed"], got["by_hand"]):
            np.testing.assert_array_equal(mixed, by_hand)
        expected = (3 * rank_values(0)[0] + 5 * rank_values(1)[0]) / 8
        np.testing.assert_allclose(got["fused"][0], expected, rtol=1e-6)


def test_a_member_of_weight_zero_adds_nothing_even_nan(pair):
    results = ray.get(
        [m.weighted_means.remote(rank, [2.0, 0.0], poison=rank == 1) for rank, m in enumerate(pair)]
    )
    own = [v for v in rank_values(0) if v.dtype.kind == "f"]
    for got in results:
        assert got["total"] == 2.0
        for mean, value in zip(got["mixed"], own):
            np.testing.assert_array_equal(mean, value.astype(mean.dtype))
    zeros = ray.get([m.weighted_means.remote(rank, [0.0, 0.0]) for rank, m in enumerate(pair)])
    assert all(got["total"] == 0.0 and not any(np.any(t) for t in got["fused"]) for got in zeros)


def test_all_identical_tells_equal_from_different_tensors(pair):
    assert ray.get([m.all_identical.remote(r) for r, m in enumerate(pair)]) == [
        (True, False),
        (True, False),
    ]


def listening_hosts(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port` (Linux /proc/net)."""
    hosts = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            host, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                hosts.add(
                    "0.0.0.0"
                    if host == "0" * width and width == 8
                    else "::"
                    if host == "0" * width
                    else host
                )
    return hosts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_tensorflows_server_listens_on_every_interface_not_the_host_given(pair):
    """What collectives.py's security note says: the members were given 127.0.0.1,
    yet TF's gRPC server listens on all interfaces (grpc_server_lib.cc binds
    "0.0.0.0:port"); if TF ever honours the host, the note must change."""
    for member in pair:
        host, port = ray.get(member.address.remote()).rsplit(":", 1)
        assert host == "127.0.0.1"
        hosts = listening_hosts(int(port))
        assert hosts and hosts <= {"0.0.0.0", "::"}, hosts


def test_a_group_of_one_is_the_identity_and_starts_no_server():
    group = CollectiveGroup()
    group.connect(0, [group.address])
    values = [tf.constant(v) for v in rank_values(0)]
    summed = tf.function(group.all_reduce_sum)(values)
    assert_exact([t.numpy() for t in summed], rank_values(0))
    assert bool(group.all_identical(values))
    assert not any("/job:worker" in d.name for d in tf.config.list_logical_devices())


def test_ring_without_gpus_and_nccl_only_with_a_real_gpu():
    cpu = tf.config.PhysicalDevice("/physical_device:CPU:0", "CPU")
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    assert collectives.choose_implementation([cpu]) == collectives.RING
    assert collectives.choose_implementation([cpu, gpu]) == collectives.NCCL
    # fake GPUs are logical CPU devices: this process has four and no physical GPU
    assert collectives.choose_implementation(tf.config.list_physical_devices()) == collectives.RING


def test_bad_membership_and_bad_tensors_are_one_line_errors():
    group = CollectiveGroup()
    with pytest.raises(ValueError, match=r"addresses\[1\] must be this member's address"):
        group.connect(1, ["127.0.0.1:1", "127.0.0.1:2"])
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\), got 3"):
        group.connect(3, [group.address])
    group.connect(0, [group.address])
    with pytest.raises(TypeError, match=r"tensors\[1\]: dtype must be one of .* got string"):
        group.all_reduce_sum([tf.ones([2]), tf.constant(["a"])])


def test_connecting_after_tensorflow_initialized_says_so():
    group = CollectiveGroup()
    tf.constant(1.0)  # this process's TF is running (conftest made its fake GPUs)
    with pytest.raises(RuntimeError, match="connect must run before any TensorFlow op"):
        group.connect(0, [group.address, "127.0.0.1:1"])


@pytest.mark.slow  # a collective member killed and waited out: ~9 s here
def test_a_killed_peer_is_an_error_within_the_timeout(remote_member):
    survivor, victim = start_group(remote_member, 2, timeout_s=SHORT_TIMEOUT_S)
    ray.get([m.timed_sum.remote() for m in (survivor, victim)])  # both healthy first
    ray.kill(victim)
    message, seconds = ray.get(survivor.timed_sum.remote(), timeout=60)
    ray.kill(survivor)
    assert "all_reduce_sum_over_2_members failed in a group of 2 members" in message, message
    assert "rebuild the group" in message
    assert seconds < NOT_A_HANG_S  # an error, not a hang; how fast depends on the machine


@pytest.mark.slow  # waits out a collective timeout: ~13 s here
def test_a_peer_that_never_joins_the_collective_times_out(remote_member):
    waiting, idle = start_group(remote_member, 2, timeout_s=SHORT_TIMEOUT_S)
    message, seconds = ray.get(waiting.timed_sum.remote(), timeout=60)
    for m in (waiting, idle):
        ray.kill(m)
    assert "all_reduce_sum_over_2_members failed in a group of 2 members" in message, message
    assert "timeout 3s" in message and "timed out" in message
    assert SHORT_TIMEOUT_S - 0.5 < seconds < NOT_A_HANG_S  # it waited for the timeout


@pytest.mark.slow  # three group sizes of collective members: ~27 s here
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_all_reduces_without_a_timeout_start_no_threads_with_one_two_each(remote_member):
    """The default group (no per-op timeout, as in the SGD loop): 3,000 all-reduces
    leave the thread count where it was. With a timeout TF starts two threads per
    collective that sleep for the whole timeout: the same count sees them."""

    def thread_counts(timeout_s, all_reduces: int) -> list:
        members = start_group(remote_member, 2, timeout_s=timeout_s)
        counts = ray.get(
            [m.threads_around_all_reduces.remote(all_reduces) for m in members], timeout=120
        )
        for m in members:
            ray.kill(m)
        print(
            f"\nthreads (before, after) per member, {all_reduces:,} all-reduces, "
            f"timeout {timeout_s}: {counts}"
        )
        return counts

    counts = thread_counts(None, 3000)
    for before, after in counts:
        assert before > 0 and after - before < 50, counts  # a few pool threads at most
    counts = thread_counts(NOT_A_HANG_S, 200)
    for before, after in counts:
        assert after - before >= 200, counts  # ~2 per all-reduce, alive for the timeout


@pytest.mark.slow  # waits out a collective timeout: ~14 s here
def test_the_probe_keeps_a_timeout_when_the_sums_have_none(remote_member):
    """connect's probe ran in both members; run alone it fails at its own timeout,
    although the group's all-reduces wait without one."""
    waiting, idle = start_group(remote_member, 2, timeout_s=None, probe_timeout_s=SHORT_TIMEOUT_S)
    message, seconds = ray.get(waiting.timed_probe.remote(), timeout=60)
    for m in (waiting, idle):
        ray.kill(m)
    assert "probe_over_2_members failed in a group of 2 members" in message, message
    assert "timeout 3s" in message
    assert SHORT_TIMEOUT_S - 0.5 < seconds < NOT_A_HANG_S
