"""Where a batch's forward pass runs: always in the policy thread, or on the event loop
while the thread is idle and passes are short (RequestBatcher's `inline_pass_s`).

One process, one asyncio loop, the PPO MLP 4 -> 256x256 on CartPole spaces acting
through its XLA twins as a PolicyHost does (one per row count of the ladder). C
coroutine callers (1 / 4 / 16) each submit one observation, await its action and
submit the next, for `calls` answers in all; the placements alternate within each
child, so both see the same load:
  thread    every pass handed to the PolicyThread and back (inline_pass_s = 0)
  loop      the shipped rule: passes under INLINE_PASS_S run on the loop while the
            thread is idle
Reported: answers/s, CPU per answer (the process's, every thread's), rows per pass.

    python -m benchmarks.pass_placement            # ~1 min
    python -m benchmarks.pass_placement --smoke
"""

from __future__ import annotations

import asyncio
import time

from benchmarks import harness, plots, stats

NAME = "pass_placement"
VALUE = "answers_per_s"
KEYS = ("placement", "callers")
PLACEMENTS = ("thread", "loop")
CALLERS = (1, 4, 16)
WORKLOAD = "PPO MLP 4 -> 256x256, one observation per request, coroutine callers"


def measure(spec: dict):
    import numpy as np

    from benchmarks import ppo_shaped
    from policy_service.distributed.batching import INLINE_PASS_S, RequestBatcher
    from policy_service.distributed.policy_thread import PolicyThread
    from policy_service.engine.fixed_rows import row_ladder

    policy = ppo_shaped.make_policy("mlp", 1)
    policy.act_with_xla(*row_ladder(32))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(1, 4)).astype(np.float32)

    async def serve(placement: str, callers: int) -> dict:
        passes = []  # rows of each pass

        def run_batch(key, payloads):
            passes.append(len(payloads))
            actions, _, _ = policy.compute_actions(np.concatenate(payloads), explore=key)
            return list(actions)

        thread = PolicyThread()
        batcher = RequestBatcher(
            run_batch,
            max_batch_size=32,
            batch_wait_timeout_s=0.001,
            executor=thread,
            thread_idle=lambda: thread.idle,
            inline_pass_s=0.0 if placement == "thread" else INLINE_PASS_S,
        )
        per_caller = max(1, spec["calls"] // callers)

        async def caller():
            for _ in range(per_caller):
                await batcher.submit(True, obs, 1)

        await asyncio.gather(*(caller() for _ in range(callers)))  # warm-up
        passes.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        thread.shutdown()
        answers = per_caller * callers
        return {
            VALUE: answers / wall,
            "cpu_us_per_answer": cpu / answers * 1e6,
            "rows_per_pass": answers / max(1, len(passes)),
        }

    for repeat in range(spec["repeats"]):
        for callers in spec["callers"]:
            for placement in PLACEMENTS:
                yield {
                    "bench": NAME,
                    "round": spec["round"],
                    "repeat": repeat,
                    "placement": placement,
                    "callers": callers,
                    **asyncio.run(serve(placement, callers)),
                }


def configurations(args) -> list[dict]:
    return [
        dict(
            target="placement",
            callers=[1, 4] if args.smoke else list(CALLERS),
            calls=64 if args.smoke else 3000,
            repeats=1 if args.smoke else 3,
        )
    ]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize_each(records, KEYS, (VALUE, "cpu_us_per_answer", "rows_per_pass"))
    for row in summary:
        if row["placement"] == "loop":
            row["vs_thread"] = stats.vs(
                summary, VALUE, row, placement="thread", callers=row["callers"]
            )
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    callers = sorted({row["callers"] for row in summary})
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "Forward passes in the policy thread or on the event loop",
        "answers/s",
        [f"{c} callers" for c in callers],
        {
            p: [stats.find(summary, VALUE, placement=p, callers=c) for c in callers]
            for p in PLACEMENTS
        },
    )


def add_flags(parser) -> None:
    """No flags beyond the harness's own."""


if __name__ == "__main__":
    harness.main(__name__)
