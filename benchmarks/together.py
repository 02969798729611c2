"""The child of harness.together's bundles: several runs measured in one process.

At --smoke a script may send all its runs of one interpreter to one child (see
harness.together for why); this child measures them in turn, each with its own
script's `measure(spec)`. A Ray a run left running is stopped before the next run of
another script; the next run of the same script takes it in harness.ray_init when it
asks for the same settings and the Ray holds nothing of the run before (a local Ray's
start and stop are seconds apiece), else ray_init stops it and starts its own.

    python -m benchmarks.together --child '{"parts": [[module, spec, tags], ...], ...}'

Imports neither TensorFlow nor policy_service at the top (RLlib's venv runs it too).
"""

from __future__ import annotations

import importlib
import traceback

from benchmarks import harness


def measure(spec: dict):
    """Each part's records, tagged as its own child's would be; a part that raises
    gives an error record and the next part still runs (on a Ray of its own)."""
    seeded = {"seed": spec["seed"]} if "seed" in spec else {}
    harness.share_ray(True)
    previous = None  # the module of the part before, if it ended without raising
    try:
        for module, part, tags in spec["parts"]:
            if module != previous or not harness.shared_ray_up():  # it may call ray.init
                harness.stop_ray()
            previous = module
            part = dict(part, round=spec["round"], **seeded)
            try:
                for record in importlib.import_module(module).measure(part):
                    yield {**tags, **record}
            except Exception as err:  # noqa: BLE001 - one failed part is a record, as a child's is
                previous = None
                yield {
                    **tags,
                    **part,
                    "bench": part.get("workload") or module.rsplit(".", 1)[-1],
                    "error": f"{type(err).__name__}: {err}"[:2000],
                    "stderr_tail": traceback.format_exc()[-4000:],
                }
    finally:
        harness.stop_ray()
        harness.share_ray(False)


if __name__ == "__main__":
    harness.child_main(harness.base_parser(__doc__.splitlines()[0]).parse_args(), measure)
