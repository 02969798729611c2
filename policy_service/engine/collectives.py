"""Sum tensors across processes with TensorFlow's collective ops, inside compiled code.

One `CollectiveGroup` lives in each member process (a learner Ray actor), so that
learners all-reduce their gradient sums inside the compiled SGD step, never through
the object store:

    group = CollectiveGroup()                  # before any TF op; picks a port: group.address
    group.connect(rank, addresses)             # addresses in rank order, from the driver
    ...inside a tf.function: summed = group.all_reduce_sum(grads)
    with group.peer_errors():                  # a dead peer -> CollectivePeerError
        epoch(...)

Contract: every member makes the same calls, with the same shapes, in the same order,
from one thread; after a failed collective the group must be rebuilt in fresh
processes; collectives have no per-op timeout (the caller bounds each call). A group
of one runs no collective. Security: TF's gRPC server listens on every interface with
no authentication; run num_learners >= 2 only on a private cluster network.
Setup, the ops' keys, timeouts and threads, security in full: docs/collectives.md.
"""

from __future__ import annotations

import contextlib
import re
import socket
import weakref
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

RING = "RING"
NCCL = "NCCL"
PROBE_TIMEOUT_S = 120.0  # connect's probe: one op, so its two timer threads are cheap
JOB = "worker"
SUM_GROUP_KEY = 4201  # the all-reduce of tensors (on the GPU with NCCL)
CHECK_GROUP_KEY = 4202  # the weight check, always on the CPU (a group has one device type)
SUMMABLE_DTYPES = (tf.float32, tf.float64, tf.int32, tf.int64)  # the ones tested


class CollectivePeerError(RuntimeError):
    """A collective failed because a member is dead, hung or out of step."""


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now. The OS may hand it out again before TF binds
    it in `connect`; that window is short and an error, not a hang."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def choose_implementation(physical_devices: Sequence) -> str:
    """NCCL when the process has a real GPU, RING (gRPC) otherwise.

    physical_devices: `tf.config.list_physical_devices()` (listing does not
    initialize TF). Fake GPUs are logical CPU devices, so they give RING."""
    return NCCL if any(d.device_type == "GPU" for d in physical_devices) else RING


class CollectiveGroup:
    """This process's membership in a group that sums tensors with TF collectives.

    address: "host:port" this member's TF server will listen on (picked now).
    rank, world_size: set by `connect`.
    implementation: RING or NCCL, chosen by `connect` from this process's GPUs.
    timeout_s: None (default): collectives wait for their peers without a
      deadline, and cost no timer threads (see the module docstring); the
      caller bounds a hang. A number: every collective not finished in that
      time fails (two threads held per collective for that long: only for
      groups that run few).
    probe_timeout_s: how long `connect`'s probe waits for every member to
      run its first collective.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        timeout_s: float | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ):
        for key, value in (("timeout_s", timeout_s), ("probe_timeout_s", probe_timeout_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{key} must be > 0, got {value}")
        self.address = f"{host}:{pick_free_port(host)}"
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self.implementation: str | None = None
        self._strategy = None  # keeps the strategy (and its server) alive
        self._tokens: dict[str, tf.Variable] = {}
        self._calls_per_graph: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._signature_of_key: dict[tuple[int, int], str] = {}

    # ----- setup -----------------------------------------------------------------

    def connect(self, rank: int, addresses: Sequence[str]) -> None:
        """Join the group of all `addresses` (in rank order) as member `rank`.

        Must run before any TensorFlow op in this process (TF fixes its
        collective configuration when it initializes). Blocks until every
        member has connected, then runs one collective with `probe_timeout_s`
        (CollectivePeerError if a member does not take part in time). With one
        address it only records the rank."""
        addresses = list(addresses)
        self._check_membership(rank, addresses)
        implementation = choose_implementation(tf.config.list_physical_devices())
        if len(addresses) > 1:
            self._strategy = self._start_executor(rank, addresses, implementation)
        self.rank, self.world_size, self.implementation = rank, len(addresses), implementation
        if self.world_size > 1:
            for device in {self.sum_device, self.check_device}:
                with tf.device(device):
                    self._tokens[device] = tf.Variable(
                        0.0, trainable=False, name="collective_ordering_token"
                    )
            self.probe()

    def probe(self) -> None:
        """One one-element sum over all members with `probe_timeout_s`: every member
        must call it; a member that does not -> CollectivePeerError in that time."""
        with self.peer_errors(self.probe_timeout_s), tf.device(self.check_device):
            one = tf.ones([1], tf.int32)
            total = self._collective(
                one,
                "Add",
                CHECK_GROUP_KEY,
                self.check_device,
                RING,
                "probe",
                timeout_s=self.probe_timeout_s,
            )
            if int(total[0]) != self.world_size:
                raise RuntimeError(f"probe: {self.world_size} members summed to {int(total[0])}")

    def _start_executor(self, rank: int, addresses: list[str], implementation: str):
        """MultiWorkerMirroredStrategy's setup from a cluster spec of `addresses`."""
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({JOB: addresses}), task_type=JOB, task_id=rank, rpc_layer="grpc"
        )
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(
                tf.distribute.experimental.CommunicationImplementation, implementation
            ),
            timeout_seconds=self.probe_timeout_s,
        )
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=options
            )
        except RuntimeError as err:
            if "program startup" not in str(err):
                raise
            raise RuntimeError(
                "CollectiveGroup.connect must run before any TensorFlow op in this "
                "process (TensorFlow is already initialized)"
            ) from err

    def _check_membership(self, rank: int, addresses: list[str]) -> None:
        if self.rank is not None:
            raise RuntimeError(f"this CollectiveGroup is already connected as rank {self.rank}")
        if not addresses:
            raise ValueError("addresses must list every member, got none")
        if not 0 <= rank < len(addresses):
            raise ValueError(f"rank must be in [0, {len(addresses)}), got {rank}")
        if addresses[rank] != self.address:
            raise ValueError(
                f"addresses[{rank}] must be this member's address "
                f"{self.address!r}, got {addresses[rank]!r}"
            )
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"addresses must be distinct, got {addresses}")

    @property
    def _connected_implementation(self) -> str:
        """RING or NCCL, as `connect` chose it (a collective needs `connect` first)."""
        if self.implementation is None:
            raise RuntimeError("CollectiveGroup: connect() before running a collective")
        return self.implementation

    @property
    def sum_device(self) -> str:
        """Where the all-reduce runs: this member's first GPU with NCCL, else its CPU."""
        kind = "GPU" if self.implementation == NCCL else "CPU"
        return f"/job:{JOB}/replica:0/task:{self.rank}/device:{kind}:0"

    @property
    def check_device(self) -> str:
        return f"/job:{JOB}/replica:0/task:{self.rank}/device:CPU:0"

    # ----- collectives --------------------------------------------------------------

    def all_reduce_sum(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The element-wise sum of `tensors` over all members, same shapes and dtypes.

        Works eagerly, in a tf.function and in a tf.while_loop body. Tensors
        are packed into one flat tensor per dtype, so a call runs one
        collective per dtype. Shapes must be static (the collective's size is
        part of its key)."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        self._check_summable(tensors)
        if self.world_size == 1:
            return list(tensors)
        out: list = [None] * len(tensors)
        by_dtype: dict = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        for indices in by_dtype.values():
            parts = [tensors[i] for i in indices]
            with tf.device(self.sum_device):
                flat = tf.concat([tf.reshape(t, [-1]) for t in parts], axis=0)
                summed = self._collective(
                    flat,
                    "Add",
                    SUM_GROUP_KEY,
                    self.sum_device,
                    self._connected_implementation,
                    "all_reduce_sum",
                )
            sizes = [t.shape.num_elements() for t in parts]
            for i, piece in zip(indices, tf.split(summed, sizes)):
                out[i] = tf.reshape(piece, tensors[i].shape)
        return out

    def all_reduce_weighted_mean(
        self, tensors: Sequence[tf.Tensor], weight: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """(sum over members of weight * t) / (sum of the weights) for each tensor,
        and that total weight <dtype>[], in one collective.

        A member of weight 0 adds exactly nothing (even NaN or inf); a total of 0
        gives zeros. A group of one returns the tensors and the weight as given.
        When every tensor has the weight's dtype, the weight and the tensors
        travel as one flat buffer [1, t...] that is scaled, and after the sum
        divided, as a whole: three ops where one per tensor cost measurably more
        (benchmarks/history/learner.md); per element the same products, sums and quotients as
        scaling each tensor, so the results are bit-identical. Mixed dtypes take
        one collective per dtype."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        weight = tf.convert_to_tensor(weight)
        self._check_summable(tensors + [weight])
        if self.world_size == 1:
            return list(tensors), weight
        if any(t.dtype != weight.dtype for t in tensors):
            return self._weighted_mean_by_dtype(tensors, weight)
        sizes = [1] + [t.shape.num_elements() for t in tensors]
        with tf.device(self.sum_device):
            packed = tf.concat(
                [tf.ones([1], weight.dtype)] + [tf.reshape(t, [-1]) for t in tensors], axis=0
            )
            # the leading 1 becomes this member's weight, exactly (1 * w == w)
            summed = self._collective(
                tf.math.multiply_no_nan(packed, weight),
                "Add",
                SUM_GROUP_KEY,
                self.sum_device,
                self._connected_implementation,
                "all_reduce_sum",
            )
            total = summed[0]
            means = tf.split(tf.math.divide_no_nan(summed, total), sizes)[1:]
        return [tf.reshape(m, t.shape) for m, t in zip(means, tensors)], total

    def _weighted_mean_by_dtype(self, tensors: list, weight: tf.Tensor) -> tuple:
        """all_reduce_weighted_mean with each tensor scaled and divided on its own."""
        summed = self.all_reduce_sum(
            [tf.reshape(weight, [1])]
            + [tf.math.multiply_no_nan(t, tf.cast(weight, t.dtype)) for t in tensors]
        )
        total = summed[0][0]
        return [tf.math.divide_no_nan(s, tf.cast(total, s.dtype)) for s in summed[1:]], total

    def all_identical(self, tensors: Sequence[tf.Tensor]) -> tf.Tensor:
        """<bool>[]: True when every member holds bit-identical `tensors`.

        Compares a 64-bit fingerprint per tensor (two small collectives: the
        max and the min over members), so it costs nothing like a broadcast."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self.world_size == 1 or not tensors:
            return tf.constant(True)
        with tf.device(self.check_device):
            prints = tf.concat([self._fingerprint(t) for t in tensors], axis=0)
            high = self._collective(
                prints, "Max", CHECK_GROUP_KEY, self.check_device, RING, "all_identical_max"
            )
            low = self._collective(
                prints, "Min", CHECK_GROUP_KEY, self.check_device, RING, "all_identical_min"
            )
            return tf.reduce_all(tf.equal(high, low))

    @contextlib.contextmanager
    def peer_errors(self, timeout_s: float | None = None) -> Iterator[None]:
        """Turn TF's errors from a dead or hung peer into one CollectivePeerError
        that names the group size and the timeout (`timeout_s`, default the group's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        timeout = "no timeout" if timeout_s is None else f"timeout {timeout_s:g}s"
        try:
            yield
        except (
            tf.errors.DeadlineExceededError,
            tf.errors.UnavailableError,
            tf.errors.CancelledError,
            tf.errors.AbortedError,
            tf.errors.InvalidArgumentError,
            tf.errors.InternalError,
        ) as err:
            message = str(err)
            if "Collective" not in message:
                raise
            lines = [line.strip() for line in message.splitlines()]
            cause = next((line for line in lines if line.startswith("Collective")), lines[0])
            # the op's name: {{node NAME}} in a function, "[Op:...] name: NAME" eagerly
            node = re.search(r"\{\{node ([^}]+)\}\}|\] name: (\S+)", message)
            name = next((g for g in node.groups() if g), None) if node else None
            raise CollectivePeerError(
                f"{name or 'CollectiveReduceV2'} failed in a group of "
                f"{self.world_size} members (this is rank {self.rank}, {timeout}): {cause}; "
                "collectives in this process are now aborted, rebuild the group"
            ) from err

    # ----- internals -----------------------------------------------------------------

    def _collective(
        self,
        flat: tf.Tensor,
        merge_op: str,
        group_key: int,
        device: str,
        implementation: str,
        what: str,
        timeout_s: float | None = None,
    ) -> tf.Tensor:
        """One CollectiveReduceV2; timeout_s (default the group's) None: none, so TF
        starts no timer thread for it."""
        if self.world_size is None:
            raise RuntimeError(f"{what}: CollectiveGroup.connect has not run")
        signature = f"{what}:{flat.dtype.name}:{flat.shape.num_elements()}:{merge_op}"
        instance_key = self._instance_key(flat, group_key, signature)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        from tensorflow.python.ops import collective_ops  # the raw op has no public alias

        return collective_ops.all_reduce_v2(
            flat,
            group_size=self.world_size,
            group_key=group_key,
            instance_key=instance_key,
            merge_op=merge_op,
            final_op="Id",
            communication_hint=implementation.lower(),
            timeout=timeout_s or 0,
            ordering_token=self._tokens[device].handle,
            name=f"{what}_over_{self.world_size}_members",
        )

    def _instance_key(self, flat: tf.Tensor, group_key: int, signature: str) -> int:
        """The same key in every member for the n-th call with this signature in
        one traced function (n = 0 eagerly), different for different signatures."""
        graph: Any = getattr(flat, "graph", None)
        while getattr(graph, "outer_graph", None) is not None:  # a loop body: its function
            graph = graph.outer_graph
        nth = 0
        if graph is not None:
            counts = self._calls_per_graph.setdefault(graph, Counter())
            nth = counts[signature]
            counts[signature] += 1
        key = 1 + zlib.crc32(f"{signature}#{nth}".encode()) % (2**31 - 2)
        seen = self._signature_of_key.setdefault((group_key, key), f"{signature}#{nth}")
        if seen != f"{signature}#{nth}":
            raise RuntimeError(f"instance key {key} collides: {seen} and {signature}#{nth}")
        return key

    @staticmethod
    def _fingerprint(t: tf.Tensor) -> tf.Tensor:
        """<int64>[1]: a 64-bit hash of the tensor's bytes."""
        return tf.bitcast(tf.fingerprint(tf.reshape(t, [1, -1])), tf.int64)

    @staticmethod
    def _check_summable(tensors: list[tf.Tensor]) -> None:
        for i, t in enumerate(tensors):
            if t.dtype not in SUMMABLE_DTYPES:
                raise TypeError(
                    f"tensors[{i}]: dtype must be one of "
                    f"{[d.name for d in SUMMABLE_DTYPES]}, got {t.dtype.name}"
                )
            if not t.shape.is_fully_defined():
                raise ValueError(f"tensors[{i}]: shape must be static, got {t.shape}")
