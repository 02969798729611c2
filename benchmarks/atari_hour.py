"""An hour of APPO on Pong: the learning curve, frames/s over time, and a resumed segment.

    python -m benchmarks.atari_hour                          # 60 + 10 minutes here
    python -m benchmarks.atari_hour --minutes 2 --resume-minutes 1     # a look at the setup
    python -m benchmarks.atari_hour --from-run DIR           # the figures of a run made already

Trains `policy-service train appo --config algorithms/tuned/pong_appo.yaml --stop-time
S` into one run directory, then continues it with `policy-service train --resume DIR
--stop-time S+R`, so progress.jsonl holds both segments. Then reads the run back:
episode_return_mean over training time (the mean of the last 100 episodes), frames
sampled per second in each minute of training (one agent step is atari.FRAME_SKIP = 4
emulator frames), where the resume starts, and the return of a policy that picks
actions at random on the same env (measured here, `--random-episodes`), for scale.
`--load-log` (lines "unix_time load1 load5 load15", sampled from /proc/loadavg every
30 s from the run's start) adds the machine's load to the frames/s plot: other work on
the same cores slows training, and the curve is over training time.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import harness

NAME = "atari_hour"
TUNED = harness.REPO / "algorithms" / "tuned" / "pong_appo.yaml"
WINDOW_S = 60.0  # frames/s are given per this much training time
SEGMENTS_FILE = "atari_hour_segments.json"  # in the run directory: where the resume began


def train_commands(run_dir: Path, minutes: float, resume_minutes: float, seed: int) -> list:
    """The two commands: the first segment, and its continuation from the checkpoint
    (one every 50 iterations, so a killed segment loses little)."""
    cli = str(Path(sys.executable).parent / "policy-service")
    first = [
        cli, "train", "appo", "--config", str(TUNED), "--seed", str(seed),
        "--stop-time", str(minutes * 60), "--checkpoint-every", "50",
        "--output-dir", str(run_dir),
    ]  # fmt: skip
    resumed = [
        cli, "train", "--resume", str(run_dir),
        "--stop-time", str((minutes + resume_minutes) * 60),
    ]  # fmt: skip
    return [first, resumed] if resume_minutes > 0 else [first]


def train(run_dir: Path, minutes: float, resume_minutes: float, seed: int) -> None:
    """The segments one after another; the first one's last iteration is written to
    SEGMENTS_FILE (a resume goes on from the checkpoint taken at the stop, so the
    iteration numbers alone do not show where it began)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for index, command in enumerate(train_commands(run_dir, minutes, resume_minutes, seed)):
        print("#", " ".join(command), file=sys.stderr)
        returncode = run_segment(command, env)
        if returncode != 0:
            raise SystemExit(f"atari_hour: {command[1:3]} exited with {returncode}")
        if index == 0:
            last = json.loads((run_dir / "result.json").read_text())["iteration"]
            (run_dir / SEGMENTS_FILE).write_text(json.dumps({"first_segment_ends": last}))


def run_segment(command: list, env: dict) -> int:
    """One training command to its end. Interrupted (SIGINT or SIGTERM to this script
    alone), the run is asked to stop as Ctrl-C would (it checkpoints) and no later
    segment starts."""
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    stopped_by: list[int] = []

    def stop(signum, frame):  # forwarded only: the wait below goes on until the run ends
        stopped_by.append(signum)
        child.send_signal(signal.SIGINT)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped_by:
        raise SystemExit(f"atari_hour: stopped by signal {stopped_by[0]}; the run checkpointed")
    return returncode


def first_segment_end(run_dir: Path, given: int | None) -> int | None:
    """The first segment's last iteration: `given` (--resumed-after), else the one
    train() wrote, else None (one segment)."""
    if given is not None:
        return given
    path = run_dir / SEGMENTS_FILE
    return json.loads(path.read_text())["first_segment_ends"] if path.exists() else None


def read_progress(run_dir: Path, resumed_after: int | None = None) -> list[dict]:
    """progress.jsonl's iterations, with the segment each belongs to (0: the first run,
    1: the iterations after `resumed_after`, the resumed run's)."""
    rows = []
    for line in (run_dir / "progress.jsonl").read_text().splitlines():
        row = json.loads(line)
        segment = int(resumed_after is not None and row["iteration"] > resumed_after)
        rows.append(
            {
                "iteration": row["iteration"],
                "segment": segment,
                "time_total_s": row["time_total_s"],
                "agent_steps": row["timesteps_total"],
                "episode_return_mean": row.get("episode_return_mean"),
            }
        )
    return rows


def frames_per_minute(rows: list[dict], frame_skip: int) -> list[dict]:
    """Frames sampled per second of training in each WINDOW_S of training time: the env
    steps between the first and last iteration inside the window, over the time between."""
    windows: dict[int, list[dict]] = {}
    for row in rows:
        windows.setdefault(int(row["time_total_s"] // WINDOW_S), []).append(row)
    out = []
    for index, members in sorted(windows.items()):
        first, last = members[0], members[-1]
        seconds = last["time_total_s"] - first["time_total_s"]
        if seconds <= 0:
            continue
        steps = last["agent_steps"] - first["agent_steps"]
        out.append(
            {
                "minute": index * WINDOW_S / 60,
                "segment": last["segment"],
                "frames_per_s": frame_skip * steps / seconds,
            }
        )
    return out


def random_policy_return(episodes: int, seed: int) -> dict:
    """Pong with DeepMind's preprocessing and actions drawn at random: mean return."""
    import yaml

    from policy_service.envs.atari import AtariEnvCreator

    config = yaml.safe_load(TUNED.read_text())
    env = AtariEnvCreator(config["env"])(config.get("env_config") or {})
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return {"episodes": episodes, "mean": statistics.fmean(returns), "returns": returns}


def read_load(path: str | None, run_dir: Path) -> list[tuple[float, float]]:
    """(wall minutes since the run directory was made, 1-minute load average) from a
    load log, if given: close to training minutes (start-up and checkpoints aside)."""
    if not path:
        return []
    start = (run_dir / "config.json").stat().st_mtime
    samples = [line.split()[:2] for line in Path(path).read_text().splitlines() if line.strip()]
    return [((float(when) - start) / 60, float(load1)) for when, load1 in samples]


def summarize(rows: list[dict], frame_skip: int, random_return: dict) -> dict:
    """The start and end of the curve and the frames/s over the run."""
    curve = [r for r in rows if r["episode_return_mean"] is not None]
    first_segment = [r for r in curve if r["segment"] == 0]
    rates = frames_per_minute(rows, frame_skip)
    resumed = [r for r in curve if r["segment"] > 0]
    summary = {
        "iterations": len(rows),
        "training_minutes": rows[-1]["time_total_s"] / 60,
        "agent_steps": rows[-1]["agent_steps"],
        "frames": rows[-1]["agent_steps"] * frame_skip,
        "return_start": curve[0]["episode_return_mean"],
        "return_end_of_first_segment": first_segment[-1]["episode_return_mean"],
        "return_best": max(r["episode_return_mean"] for r in curve),
        "return_end": curve[-1]["episode_return_mean"],
        "random_policy_return": random_return["mean"],
        "frames_per_s_median": statistics.median(r["frames_per_s"] for r in rates),
        "frames_per_s_first_minute": rates[0]["frames_per_s"],
        "frames_per_s_last_minute": rates[-1]["frames_per_s"],
    }
    if resumed:
        summary["resumed_at_minute"] = resumed[0]["time_total_s"] / 60
        summary["resumed_from_iteration"] = resumed[0]["iteration"] - 1
        summary["return_first_after_resume"] = resumed[0]["episode_return_mean"]
    summary["return_gain"] = summary["return_end"] - summary["return_start"]
    return summary


def plot(rows, rates, summary, load, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for segment in sorted({r["segment"] for r in rows}):
        members = [r for r in rows if r["segment"] == segment and r["episode_return_mean"]]
        label = "APPO, pong_appo.yaml" if segment == 0 else "resumed from the checkpoint"
        top.plot(
            [r["time_total_s"] / 60 for r in members],
            [r["episode_return_mean"] for r in members],
            label=label,
        )
    top.axhline(
        summary["random_policy_return"], linestyle="--", color="gray", label="random actions"
    )
    top.set_ylabel("episode return (mean of last 100)")
    top.set_title("ALE/Pong-v5, 2 CPU cores: return over training time", fontsize=10)
    top.legend(fontsize=8)
    bottom.plot([r["minute"] for r in rates], [r["frames_per_s"] for r in rates], label="frames/s")
    bottom.set_ylabel("emulator frames sampled / s")
    bottom.set_xlabel("training minutes (time_total_s)")
    if "resumed_at_minute" in summary:
        for ax in (top, bottom):
            ax.axvline(summary["resumed_at_minute"], color="black", linewidth=0.8)
    if load:
        twin = bottom.twinx()
        twin.plot([m for m, _ in load], [v for _, v in load], color="C3", alpha=0.5)
        twin.set_ylabel("load average (1 min)", color="C3")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv=None) -> Path:
    parser = harness.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="the first segment")
    parser.add_argument("--resume-minutes", type=float, default=10.0, help="the resumed one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None, help="default: <out>/atari_hour_run")
    parser.add_argument("--from-run", default=None, help="read this run; train nothing")
    parser.add_argument("--random-episodes", type=int, default=10)
    parser.add_argument("--load-log", default=None, help="'unix_time load1 ...' lines")
    parser.add_argument(
        "--resumed-after",
        type=int,
        default=None,
        help="with --from-run: the iteration the first segment ended at",
    )
    args = parser.parse_args(argv)
    meta = harness.start_meta(args, workload="APPO ALE/Pong-v5 for an hour: return and frames/s")
    if args.from_run:
        run_dir = Path(args.from_run)
    else:
        run_dir = Path(args.run_dir or Path(args.out) / "atari_hour_run")
        train(run_dir, args.minutes, args.resume_minutes, args.seed)
    from policy_service.envs import atari

    rows = read_progress(run_dir, first_segment_end(run_dir, args.resumed_after))
    random_return = random_policy_return(args.random_episodes, args.seed)
    summary = summarize(rows, atari.FRAME_SKIP, random_return)
    load = read_load(args.load_log, run_dir)
    rates = frames_per_minute(rows, atari.FRAME_SKIP)
    meta["plots"] = [plot(rows, rates, summary, load, Path(args.out) / f"{NAME}.png")]
    meta["run_dir"] = str(run_dir)
    records = [{"kind": "frames_per_s", **r} for r in rates] + [
        {"kind": "random_policy", **random_return}
    ]
    return harness.finish(NAME, args.out, records, [summary], meta)


if __name__ == "__main__":
    main()
