"""The LearnerGroup's part of `benchmarks/learner.py --learners 1,2 --accumulate 1,4`.

Per (model, learners N, accumulation K), in a fresh child with its own local Ray:
"epoch", the group's samples/s, and "all_reduce" (N >= 2), what the group adds per
all-reduce inside the step beside the bare collective between the same processes
(vs_bare = group_ms / bare_flat_ms, goal <= 1.2), in wall and CPU ms.

    python -m benchmarks.learner --learners 1,2 --accumulate 1,4

Every field (step_ms, local_step_ms, weighted_local_step_ms, group_ms, bare_*_ms,
the CPU figures) and how K-step accumulation counts: benchmarks/history/methods.md,
"What each script measures".
"""

from __future__ import annotations

import copy
import os
import re
import statistics
import time
from collections import Counter

from benchmarks import harness, stats
from benchmarks.collectives import summing_loop

ENGINE = "group"
PROBE_MS = ("step_ms", "local_step_ms", "weighted_local_step_ms", "bare_flat_ms", "bare_packed_ms")
PROBE_CPU_MS = tuple(name.replace("_ms", "_cpu_ms") for name in PROBE_MS)


def measure(spec: dict, base: dict):
    """The child of one (model, learners, accumulate) configuration."""
    import ray

    from algorithms.ppo import PPOPolicy
    from benchmarks import ppo_shaped
    from policy_service.distributed.learner_group import LearnerGroup
    from policy_service.distributed.resources import actor_resources, process_resources

    model, epochs, repeats = base["model"], spec["epochs"], spec["repeats"]
    batch = ppo_shaped.synthetic_batch(model, spec["num_samples"])
    config = ppo_shaped.policy_config(
        model,
        0,
        minibatch_size=spec["minibatch"],
        num_epochs=epochs,
        real_gpus=spec["real_gpus"],
        num_learners=spec["learners"],
        num_gpus_per_learner=spec["towers"],
        num_cpus_per_learner=spec["cpus_per_learner"],
        num_grad_accumulation_steps=spec["accumulate"],
    )
    ray.init(**harness.RAY_INIT)
    group = LearnerGroup(PPOPolicy, *ppo_shaped.spaces_for(model), config)
    try:
        resources = {
            "driver": process_resources(),
            "learners": [actor_resources(a, lambda host: host.policy) for a in group.actors],
        }
        base = dict(
            base,
            engine=ENGINE,
            learners=spec["learners"],
            accumulate=spec["accumulate"],
            policy_class="PPOPolicy in LearnerGroup",
            devices=group.devices,
            resources=resources,
            cpus_per_learner=spec["cpus_per_learner"],
        )
        valid = batch.count * epochs
        last = {}
        if spec["learners"] > 1:  # before the step's first trace, so the probe need not retrace it
            ray.get([a.foreach_policy.remote(record_all_reduces) for a in group.actors])

        def whole_epochs():
            group.load_batch_into_buffer(batch)
            last.update(group.learn_on_loaded_epochs(epochs))

        walls, cpus = stats.timed_with_cpu(whole_epochs, repeats, warmup=spec.get("warmup", 1))
        seconds = stats.median(walls)
        yield dict(
            base,
            mode="epoch",
            seconds=seconds,
            cpu_seconds=stats.median(cpus),
            samples=valid,
            sgd_steps=int(last["num_sgd_steps"]),
            samples_per_s=valid / seconds,
        )
        if spec["learners"] > 1:
            per_learner = ray.get(
                [
                    a.foreach_policy.remote(
                        probe_all_reduce,
                        spec["probe_epochs"],
                        spec["probe_rounds"],
                        spec.get("warmup", 1),
                    )
                    for a in group.actors
                ],
                timeout=1800,
            )
            yield dict(base, mode="all_reduce", **combine_probes(per_learner))
    finally:
        group.stop()
        ray.shutdown()


# In a learner's process: per collective group, the tensors its step sums across
# learners (as the step's last all-reduce packs them), recorded while the step is traced
SUMMED_AT_TRACE: dict[int, list] = {}


def record_all_reduces(policy) -> list:
    """From now until stop_recording, every trace of the policy's step records the
    tensors it all-reduces in SUMMED_AT_TRACE (the list returned). Only the group
    instance changes, and only at trace time: the compiled step is the same."""
    import tensorflow as tf

    group = policy.towers.collective_group
    summed = SUMMED_AT_TRACE.setdefault(id(group), [])

    def sum_recorded(tensors):
        if tf.inside_function():
            summed[:] = list(tensors)
        return type(group).all_reduce_sum(group, tensors)

    def weighted_mean_recorded(tensors, weight):
        if tf.inside_function():
            summed[:] = [tf.reshape(weight, [1])] + list(tensors)  # the buffer it packs
        return type(group).all_reduce_weighted_mean(group, tensors, weight)

    # on this instance only (the step calls one or the other)
    group.all_reduce_sum = sum_recorded
    group.all_reduce_weighted_mean = weighted_mean_recorded
    return summed


def stop_recording(group) -> None:
    """The group's own all-reduces again (for copies of it and later traces)."""
    for name in ("all_reduce_sum", "all_reduce_weighted_mean"):
        group.__dict__.pop(name, None)
    SUMMED_AT_TRACE.pop(id(group), None)


def probe_all_reduce(policy, num_epochs: int, rounds: int, untimed_rounds: int = 1) -> dict:
    """Inside one learner (every learner runs it at once, in step): per round, ms per
    all-reduce of the whole-epoch loop with the collective, of the same loop on a
    solo copy of the policy (no collective; the same loaded buffer), and of the bare
    collective on the step's tensors, flat and as the step's list; in turn, A/B, after
    `untimed_rounds` rounds not timed."""
    import tensorflow as tf

    towers = policy.towers
    group = towers.collective_group
    summed = SUMMED_AT_TRACE.pop(id(group), [])
    retraced = not summed
    if retraced:  # the step was traced before record_all_reduces: trace it again
        summed = record_all_reduces(policy)
        towers.set_collective_group(group)
    steps = policy.learn_on_loaded_epochs(num_epochs)["num_sgd_steps"]
    stop_recording(group)
    if not summed:
        raise RuntimeError("the step ran no all-reduce this probe could see")
    solo = type(policy)(policy.observation_space, policy.action_space, policy.config)
    solo.towers.buffers = dict(towers.buffers)  # the same loaded tensors, no copy
    solo.learn_on_loaded_epochs(num_epochs)  # traced and warm
    twin = type(policy)(policy.observation_space, policy.action_space, policy.config)
    twin.towers.buffers = dict(towers.buffers)
    twin.towers.set_collective_group(without_collective(group))
    twin.learn_on_loaded_epochs(num_epochs)
    elements = sum(t.shape.num_elements() for t in summed)
    flat_loop = summing_loop([tf.ones([elements], tf.float32)], group.all_reduce_sum, steps)
    packed_loop = summing_loop(
        [tf.ones(t.shape, t.dtype) for t in summed], group.all_reduce_sum, steps
    )
    flat_loop(), packed_loop()  # traced and warm
    barrier = tf.zeros([1])
    out = {name: [] for name in PROBE_MS + PROBE_CPU_MS}
    by_thread = {name: Counter() for name in PROBE_MS}  # CPU ms by thread name, all rounds
    for timed in [False] * untimed_rounds + [True] * rounds:  # untimed first: the first call
        # with the collective after tracing costs ~1 s once (seen: 895 ms/step, then ~10)
        for name, run in (
            ("step_ms", lambda: policy.learn_on_loaded_epochs(num_epochs)),
            ("local_step_ms", lambda: solo.learn_on_loaded_epochs(num_epochs)),
            ("weighted_local_step_ms", lambda: twin.learn_on_loaded_epochs(num_epochs)),
            ("bare_flat_ms", flat_loop),
            ("bare_packed_ms", packed_loop),
        ):
            # every learner starts each timing together: else the first collective of
            # a timing would also hold the wait for a peer still in the previous one
            group.all_reduce_sum([barrier])[0].numpy()
            threads_before = thread_cpu_ns()
            wall, cpu = _timed_ms(run, steps)
            if timed:
                out[name].append(wall)
                out[name.replace("_ms", "_cpu_ms")].append(cpu)
                by_thread[name].update(thread_cpu_ns() - threads_before)
    per = 1e6 * rounds * steps  # ns -> ms per all-reduce
    cpu_by_thread = {
        name: {thread: ns / per for thread, ns in counts.most_common()}
        for name, counts in by_thread.items()
    }
    return dict(
        out,
        steps=int(steps),
        elements=int(elements),
        tensors=len(summed),
        dtypes=sorted({t.dtype.name for t in summed}),
        cpu_by_thread=cpu_by_thread,
        retraced_step=retraced,  # False: recorded at the step's first trace, as measure() asks
    )


def thread_cpu_ns() -> Counter:
    """CPU ns run so far by this process's threads, summed by thread name with
    digits dropped (Linux /proc/self/task/*/schedstat; empty elsewhere): which
    threads (TF's compute pools, gRPC's, the collective executor's) do the work."""
    totals: Counter = Counter()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return totals
    for tid in tids:
        try:
            with (
                open(f"/proc/self/task/{tid}/comm") as comm,
                open(f"/proc/self/task/{tid}/schedstat") as schedstat,
            ):
                name = re.sub(r"\d+", "#", comm.read().strip())
                totals[name] += int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return totals


def without_collective(group):
    """A copy of the connected `group` whose collective is the identity: the same
    packing, scaling, dividing and unpacking around it, no communication."""

    class NoCollective(type(group)):
        def _collective(self, flat, *args, **kwargs):
            import tensorflow as tf

            return tf.identity(flat)

    twin = copy.copy(group)
    twin.__class__ = NoCollective
    return twin


def _timed_ms(run, per: int) -> tuple[float, float]:
    """(wall ms, this process's CPU ms, all threads) of one call, per all-reduce.
    CPU time counts work, not waiting for a core: the steadier figure when the
    machine is busy with other work."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (1e3 * (time.perf_counter() - wall) / per, 1e3 * (time.process_time() - cpu) / per)


def combine_probes(per_learner: list[dict]) -> dict:
    """Per round the slowest learner's figure, then the median over rounds."""
    rounds = len(per_learner[0]["step_ms"])
    slowest = {
        name: [max(p[name][r] for p in per_learner) for r in range(rounds)] for name in PROBE_MS
    }
    group_ms = [s - loc for s, loc in zip(slowest["step_ms"], slowest["local_step_ms"])]
    out = {name: statistics.median(values) for name, values in slowest.items()}
    out["group_ms"] = statistics.median(group_ms)
    out["around_ms"] = statistics.median(
        w - loc for w, loc in zip(slowest["weighted_local_step_ms"], slowest["local_step_ms"])
    )
    out["in_step_ms"] = statistics.median(
        s - w for s, w in zip(slowest["step_ms"], slowest["weighted_local_step_ms"])
    )
    out["vs_bare"] = stats.ratio(out["group_ms"], out["bare_flat_ms"])
    out["packing_ms"] = out["bare_packed_ms"] - out["bare_flat_ms"]
    # CPU work per all-reduce, each learner's own (no waiting), then the mean of learners
    cpu = {
        name: statistics.median(
            statistics.mean(p[name][r] for p in per_learner) for r in range(rounds)
        )
        for name in PROBE_CPU_MS
    }
    out.update(cpu)
    out["group_cpu_ms"] = statistics.median(
        statistics.mean(p["step_cpu_ms"][r] - p["local_step_cpu_ms"][r] for p in per_learner)
        for r in range(rounds)
    )
    out["vs_bare_cpu"] = stats.ratio(out["group_cpu_ms"], out["bare_flat_cpu_ms"])
    for name, (minuend, subtrahend) in {
        "around_cpu_ms": ("weighted_local_step_cpu_ms", "local_step_cpu_ms"),
        "in_step_cpu_ms": ("step_cpu_ms", "weighted_local_step_cpu_ms"),
    }.items():
        out[name] = statistics.median(
            statistics.mean(p[minuend][r] - p[subtrahend][r] for p in per_learner)
            for r in range(rounds)
        )
    out["per_round"] = dict(slowest, group_ms=group_ms)
    out["per_learner"] = per_learner
    first = per_learner[0]
    out.update(
        elements=first["elements"],
        bytes=4 * first["elements"],
        tensors=first["tensors"],
        all_reduces_per_call=first["steps"],
        dtypes=first["dtypes"],
    )
    return out
