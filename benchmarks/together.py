"""The child of harness.together's bundles: several runs measured in one process.

At --smoke a script may send all its runs of one interpreter to one child (see
harness.together for why); this child measures them in turn, each with its own
script's `measure(spec)`, and stops any Ray a run left running before the next.

    python -m benchmarks.together --child '{"parts": [[module, spec, tags], ...], ...}'

Imports neither TensorFlow nor policy_service at the top (RLlib's venv runs it too).
"""

from __future__ import annotations

import importlib
import sys
import traceback

from benchmarks import harness


def measure(spec: dict):
    """Each part's records, tagged as its own child's would be; a part that raises
    gives an error record and the next part still runs."""
    seeded = {"seed": spec["seed"]} if "seed" in spec else {}
    for module, part, tags in spec["parts"]:
        part = dict(part, round=spec["round"], **seeded)
        try:
            for record in importlib.import_module(module).measure(part):
                yield {**tags, **record}
        except Exception as err:  # noqa: BLE001 - one failed part is a record, as a child's is
            yield {
                **tags,
                **part,
                "bench": part.get("workload") or module.rsplit(".", 1)[-1],
                "error": f"{type(err).__name__}: {err}"[:2000],
                "stderr_tail": traceback.format_exc()[-4000:],
            }
        finally:
            _stop_ray()


def _stop_ray() -> None:
    """Shut down a Ray the part started and left (or Ray started for it on first use)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


if __name__ == "__main__":
    harness.child_main(harness.base_parser(__doc__.splitlines()[0]).parse_args(), measure)
