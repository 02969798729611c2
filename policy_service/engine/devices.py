"""Which devices the towers go on: real GPUs, fake GPUs (logical CPUs) or one CPU.

TensorFlow fixes its device list and thread pools when it initializes, so
`prepare_process` must run before the first op in a process. Fake GPUs are
separate *logical CPU devices*, so N towers really are N devices that run in
parallel, which is what the multi-GPU path needs to be tested honestly.
`_fake_gpus` gives them even where real GPUs exist (as RLlib does): real GPUs
override nothing a config asked for. GPUs asked for with `_fake_gpus` off that
this process cannot see give one CPU tower and a one-line note (docs/towers.md).
TensorFlow is imported by the functions that configure it: a process that imports this
module and hosts no policy (an env runner acting through an actor) loads none.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

GPU = "gpu"
FAKE_GPU = "fake_gpu"
CPU = "cpu"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TowerDevices:
    """The tower devices and what kind they are.

    devices: TensorFlow device names, one per tower, e.g. ("/GPU:0", "/GPU:1").
    kind: GPU, FAKE_GPU or CPU.
    note: one line when the towers are not the GPUs num_gpus asked for: what was
      asked, what was found, what runs instead (logged at start, in result.json).
    """

    devices: tuple[str, ...]
    kind: str
    note: str | None = field(default=None, compare=False)

    @property
    def num_towers(self) -> int:
        return len(self.devices)

    @property
    def variable_device(self) -> str:
        """Where the single copy of the variables lives and gradients are summed."""
        return self.devices[0]

    @property
    def gradient_reduction(self) -> str:
        """How tower gradients meet: NCCL only between real GPUs, else a sum on one device."""
        return "nccl" if self.kind == GPU and self.num_towers > 1 else "sum_on_variable_device"


def choose_tower_devices(
    num_gpus: float, fake_gpus: bool, visible_gpus: int, ray_gpu_ids: list | None = None
) -> TowerDevices:
    """Turn the `num_gpus`/`_fake_gpus` config and what is visible into tower devices.

    visible_gpus: GPUs TensorFlow sees in this process. Inside a Ray actor Ray
    sets CUDA_VISIBLE_DEVICES to the GPUs it assigned (`ray_gpu_ids`), so
    TensorFlow numbers them 0..k-1.
    """
    if num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus}")
    if num_gpus > 1 and num_gpus != int(num_gpus):
        raise ValueError(f"num_gpus above 1 must be a whole number, got {num_gpus}")
    if ray_gpu_ids is not None and len(ray_gpu_ids) > 0:
        visible_gpus = min(visible_gpus, len(ray_gpu_ids)) if visible_gpus else 0
    if num_gpus == 0:
        return TowerDevices(("/CPU:0",), CPU)
    wanted = max(1, math.ceil(num_gpus))  # a fractional GPU is one tower sharing it
    if fake_gpus:
        fakes = tuple(f"/CPU:{i}" for i in range(wanted))
        return TowerDevices(fakes, FAKE_GPU, _fake_gpus_note(num_gpus, visible_gpus, fakes))
    if visible_gpus == 0 and ray_gpu_ids:
        raise ValueError(
            f"num_gpus={num_gpus} asks for {wanted} GPU(s); Ray assigned GPUs "
            f"{list(ray_gpu_ids)} but TensorFlow sees no GPU in this process (is the CUDA "
            "build of TensorFlow installed, extra 'gpu'?)"
        )
    if visible_gpus == 0:
        return TowerDevices(("/CPU:0",), CPU, _no_gpu_note(num_gpus, wanted))
    if wanted > visible_gpus:
        raise ValueError(f"num_gpus={num_gpus} requested but only {visible_gpus} GPU(s) found")
    return TowerDevices(tuple(f"/GPU:{i}" for i in range(wanted)), GPU)


def _no_gpu_note(num_gpus: float, wanted: int) -> str:
    return (
        f"num_gpus={num_gpus:g} asks for {wanted} GPU(s) but TensorFlow sees no GPU in this "
        "process (is the CUDA build of TensorFlow installed, extra 'gpu'?); training on one "
        f"CPU tower instead (_fake_gpus: true gives {wanted} tower(s) on logical CPU devices)"
    )


def _fake_gpus_note(num_gpus: float, visible_gpus: int, fakes: tuple[str, ...]) -> str:
    found = f"{visible_gpus} GPU(s) visible, left unused" if visible_gpus else "no GPU visible"
    return (
        f"num_gpus={num_gpus:g} with _fake_gpus: {found}; {len(fakes)} tower(s) on "
        f"fake GPUs (logical CPU devices {', '.join(fakes)})"
    )


def in_ray_worker() -> bool:
    """True inside a Ray worker process (an actor or task), False in a driver
    or where Ray is not running."""
    import ray  # here, not at import: engine modules load without Ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def ray_gpu_ids() -> list | None:
    """GPU ids Ray assigned to this worker, or None outside a Ray worker."""
    import ray

    return list(ray.get_gpu_ids()) if in_ray_worker() else None


def assigned_cpu_threads() -> int:
    """Thread count matching the CPUs Ray gave this worker (at least 1)."""
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, math.ceil(cpus))


def visible_gpus() -> int:
    """GPUs TensorFlow sees in this process (Ray's assignment, inside an actor)."""
    import tensorflow as tf  # here, not at import: a process hosting no policy loads none

    return len(tf.config.list_physical_devices("GPU"))


def _tf_initialized() -> bool:
    """True once TF created its devices (after which they cannot change)."""
    from tensorflow.python.eager import context  # no public query exists

    return context.context()._initialized


_prepared_devices = 0  # logical CPU devices this process was prepared with


def prepare_process(
    num_fake_devices: int = 1,
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
) -> None:
    """Configure TF for this process before it initializes.

    Creates `num_fake_devices` logical CPU devices (fake GPUs), turns on
    memory growth on every GPU (TF otherwise takes all GPU memory), and sets
    thread pools: by default half a core's share of intra-op threads per
    device (1 on 2 cores) and one inter-op thread per core. A later call may only
    add devices; it keeps the first call's thread choice.
    """
    import tensorflow as tf

    global _prepared_devices
    if _tf_initialized():
        have = len(tf.config.list_logical_devices("CPU"))
        if have < num_fake_devices:
            raise RuntimeError(
                f"{num_fake_devices} fake GPUs requested but TensorFlow already "
                f"initialized with {have} CPU device(s); call "
                "policy_service.engine.devices.prepare_process before any TensorFlow op "
                "(or run in a fresh process)"
            )
        return
    first_call = _prepared_devices == 0
    if num_fake_devices > max(1, _prepared_devices):
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_fake_devices)]
        )
    _prepared_devices = max(_prepared_devices, num_fake_devices)
    if first_call:
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        cores = os.cpu_count() or 1
        # Measured (benchmarks/learner.py, 2 cores): one intra-op thread per op beats
        # two even for one tower (218k vs 175k samples/s), since independent ops
        # (policy and value branches, towers) then run side by side on the cores.
        tf.config.threading.set_intra_op_parallelism_threads(
            intra_op_threads or max(1, cores // (2 * max(1, num_fake_devices)))
        )
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads or cores)


def resolve_devices(num_gpus: float, fake_gpus: bool) -> TowerDevices:
    """The tower devices for this process, configuring fake GPUs when needed; a note
    on what was asked and what runs instead is logged once here."""
    tower_devices = choose_tower_devices(
        num_gpus, fake_gpus, visible_gpus=visible_gpus(), ray_gpu_ids=ray_gpu_ids()
    )
    # memory growth and thread pools are set here too, if TF is not running yet
    prepare_process(tower_devices.num_towers if tower_devices.kind == FAKE_GPU else 1)
    if tower_devices.note is not None:
        logger.warning("towers: %s", tower_devices.note)
    return tower_devices
