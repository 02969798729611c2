"""The watcher process that says why a run ends when Ray's GCS or raylet is gone,
watching ordinary processes in their place."""

import subprocess
import sys

import pytest


def _start_watcher(*pids: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "policy_service.distributed.cluster_watch", "; the hint"]
        + [f"name{i}={pid}" for i, pid in enumerate(pids)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def sleepers():
    started = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_a_watched_process_that_ends_is_one_line_and_status_1(sleepers):
    watcher = _start_watcher(*(p.pid for p in sleepers))
    sleepers[1].kill()
    sleepers[1].wait()  # reaped here: the watcher's pidfd still says it ended
    _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 1
    assert err == (
        "policy-service: error: the Ray cluster went away: its name1 "
        f"(pid {sleepers[1].pid}) exited; the hint\n"
    )


def test_stop_from_the_driver_ends_the_watcher_without_a_word(sleepers):
    watcher = _start_watcher(*(p.pid for p in sleepers))
    _, err = watcher.communicate("stop", timeout=30)
    assert (watcher.returncode, err) == (0, "")


def test_a_driver_gone_without_stop_ends_the_watcher_without_a_word(sleepers):
    watcher = _start_watcher(sleepers[0].pid)
    watcher.stdin.close()  # what the driver's end does to the pipe
    assert watcher.wait(timeout=30) == 0
    assert watcher.stderr.read() == ""


def test_a_process_gone_before_the_watch_began_is_reported(sleepers):
    sleepers[0].kill()
    sleepers[0].wait()
    watcher = _start_watcher(sleepers[0].pid)
    _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 1 and f"(pid {sleepers[0].pid}) exited" in err
