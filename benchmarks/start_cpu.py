"""Whether a start-up step waits or works: one JSON line with its wall seconds and the
CPU seconds it cost, in this process and in every process it started (read from /proc
half a second after it returned, while they live). A step whose CPU per wall second is
near the core count leaves nothing to overlap with other start-up work.

    python -m benchmarks.start_cpu ray          # an embedded ray.init (2 CPUs, loopback)
    python -m benchmarks.start_cpu tensorflow   # the driver's TensorFlow import
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.stats import process_tree_cpu_s

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("ray", "tensorflow"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    if args.step == "ray":
        from policy_service.distributed.ray_runtime import start_ray

        start_ray(num_cpus=2, quiet=True)
    else:
        import tensorflow as tf

        tf.constant(1.0) + 1.0  # the runtime up, not only the modules
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    time.sleep(0.5)
    tree = process_tree_cpu_s(os.getpid()) or {}
    started = {pid: cpu for pid, cpu in tree.items() if pid != os.getpid()}
    started_cpu = sum(started.values())
    print(
        json.dumps(
            {
                "step": args.step,
                "load_1min": load,
                "wall_s": round(wall, 2),
                "this_process_cpu_s": round(cpu, 2),
                "started_processes": len(started),
                "started_processes_cpu_s": round(started_cpu, 2),
                "cores_busy": round((cpu + started_cpu) / wall, 2),
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
