"""Shared test setup: quiet TF, four fake GPUs for the whole pytest process.

TensorFlow fixes its devices when it initializes, so they are created here,
before any test imports TensorFlow ops. A test that needs a different device
count runs in a subprocess or a Ray actor.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from policy_service.distributed import quiet_tensorflow
from policy_service.engine import devices

# as the command line and Ray workers import it: quietly, and frozen out of collections
quiet_tensorflow.import_quietly()
NUM_FAKE_GPUS = 4
devices.prepare_process(NUM_FAKE_GPUS)


import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def custom_models_restored():
    """A test module's custom model registrations end with it: actors take a copy of
    the registry, and a model class from tests/ left in it by another module would
    have to be importable in every later module's Ray workers."""
    from policy_service.policy import models

    before = models.custom_model_registry()
    yield
    for name in models.custom_model_registry():
        models.unregister_custom_model(name)
    models.register_custom_models(before)


WAITING_ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING")


class SharedRay:
    """One local Ray per pytest worker, shared by the test modules that ask for it
    one after another: starting Ray is seconds per module on 2 cores. A module gets
    it only clean (every resource free again, and no actor of an earlier module
    waiting to be placed) and started with its RAY_RESOURCES; else Ray is started
    afresh. A module that does not ask for it from its first test on finds no Ray,
    as it would alone (an Algorithm then starts and stops its own)."""

    CLEAN_WAIT_S = 10.0  # killed actors give their CPUs back asynchronously

    def __init__(self) -> None:
        self.resources: dict | None = None  # what the running Ray was started with

    def enter(self, resources: dict, fresh: bool = False) -> None:
        import ray

        if ray.is_initialized() and (fresh or resources != self.resources or not self._clean()):
            self.shutdown()
        if not ray.is_initialized():
            with quiet_tensorflow.hook_in_local_workers():  # workers import TF as a run's do
                ray.init(address="local", num_cpus=2, include_dashboard=False, **resources)
            self.resources = dict(resources)

    def _clean(self) -> bool:
        import ray

        deadline = time.monotonic() + self.CLEAN_WAIT_S
        while ray.available_resources() != ray.cluster_resources() or self._actors_left():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    @staticmethod
    def _actors_left() -> bool:
        """Whether an earlier module's actor still waits to be placed (or restarted):
        it holds nothing yet, so the resources look free, and it takes the CPUs of the
        next module's placement group the moment an actor of that module frees them (a
        Tune trial then waits forever for its group). Live actors hold their resources
        and show there; detached ones that hold none (Ray Data's stats actor, Serve's
        controller) are no harm."""
        from ray._private import state

        return any(actor["State"] in WAITING_ACTOR_STATES for actor in state.actors().values())

    def shutdown(self) -> None:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        self.resources = None


SHARED_RAY = SharedRay()


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items):
    """Which modules take the shared Ray from their first test on."""
    for item in items:
        module = item.module
        if not hasattr(module, "_takes_shared_ray"):
            module._takes_shared_ray = "ray_local" in item.fixturenames


@pytest.fixture(scope="module", autouse=True)
def no_ray_from_an_earlier_module(request):
    """A module that does not start with the shared Ray runs without one."""
    if not getattr(request.module, "_takes_shared_ray", False):
        SHARED_RAY.shutdown()
    yield


@pytest.fixture(scope="session", autouse=True)
def shared_ray_stopped_at_the_end():
    yield
    SHARED_RAY.shutdown()


@pytest.fixture(scope="module")
def ray_local(request):
    """A real local Ray for the test module (SharedRay), with the shared test envs
    (single- and multi-agent) and policies pickled by value so Ray workers need not
    import them. A module may set RAY_RESOURCES, e.g. {"num_gpus": 1}: Ray then
    advertises a GPU that no device backs; FRESH_RAY = True starts a Ray of its own
    (a module whose placement groups need every CPU of it, as Tune trials do);
    PICKLE_BY_VALUE = True sends the module's own actors and functions by value too
    (workers cannot import a test module)."""
    import envs
    import fakes
    import multi_agent_envs
    import ray

    SHARED_RAY.enter(
        getattr(request.module, "RAY_RESOURCES", {}), getattr(request.module, "FRESH_RAY", False)
    )
    by_value = [envs, fakes, multi_agent_envs]
    if getattr(request.module, "PICKLE_BY_VALUE", False):
        by_value.append(request.module)
    for module in by_value:
        ray.cloudpickle.register_pickle_by_value(module)
    yield
    for module in by_value:
        ray.cloudpickle.unregister_pickle_by_value(module)


@pytest.fixture
def start_pg_group(ray_local):
    """start_pg_group(**config) -> a LearnerGroup of fakes.PGPolicy on
    `small_config(**config)`, stopped after the test."""
    from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config

    from policy_service import LearnerGroup

    groups = []

    def start(**config):
        group = LearnerGroup(PGPolicy, OBS_SPACE, ACTION_SPACE, small_config(**config))
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.stop()


# ----- the longest test file first --------------------------------------------------
# `make test` and `make test-slow` hand each of their 2 workers a file at a time; the
# wall time is how those files pack. xdist hands them out by test count, so a file of
# a few long learning runs came last and one worker ran it alone. Instead the costliest
# file left goes next, its cost the sum of its tests' last measured seconds (recorded
# by every run here, outside the clone: CI starts on a clean one).
TEST_SECONDS = Path(
    os.environ.get(
        "TEST_SECONDS_FILE", Path.home() / ".cache" / "policy_service" / "test_seconds.json"
    )
)
UNMEASURED_TEST_S = 5.0  # a test no run has timed yet
# each file's seconds when this machine has measured none of its tests (a clean CI
# machine): tests/file_seconds.py writes it from a record
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def recorded_test_seconds() -> dict[str, float]:
    try:
        return json.loads(TEST_SECONDS.read_text())
    except (OSError, ValueError):
        return {}


class LongestFileFirst:
    """The plugin that schedules (pytest_xdist_make_scheduler) and records the seconds of
    every test the run reported (setup, call and teardown), in the controlling process."""

    def __init__(self) -> None:
        self.seconds = recorded_test_seconds()
        self.measured: dict[str, float] = {}
        try:
            self.file_seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text())
        except (OSError, ValueError):
            self.file_seconds = {}

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        seconds, file_seconds = self.seconds, self.file_seconds

        class Scheduling(LoadFileScheduling):
            def _assign_work_unit(self, node) -> None:
                def cost(scope: str) -> float:
                    tests = self.workqueue[scope]
                    if scope in file_seconds and not any(test in seconds for test in tests):
                        return file_seconds[scope]
                    return sum(seconds.get(test, UNMEASURED_TEST_S) for test in tests)

                self.workqueue.move_to_end(max(self.workqueue, key=cost), last=False)
                super()._assign_work_unit(node)

            def _reschedule(self, node) -> None:
                # a worker takes its next file when it starts its last test, not its
                # second-to-last (xdist's rule): a long last test holds no file back
                # from the other worker
                if not node.shutting_down and self.workqueue:
                    if self._pending_of(self.assigned_work[node]) > 1:
                        return
                super()._reschedule(node)

        return Scheduling(config, log)

    def pytest_runtest_logreport(self, report) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        """Merged into the file under a lock: other checkouts' runs write it too."""
        if not self.measured:
            return
        import fcntl

        try:
            TEST_SECONDS.parent.mkdir(parents=True, exist_ok=True)
            with open(TEST_SECONDS.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                merged = {**recorded_test_seconds(), **self.measured}
                written = TEST_SECONDS.with_suffix(f".{os.getpid()}.tmp")
                written.write_text(json.dumps(merged, indent=0, sort_keys=True))
                os.replace(written, TEST_SECONDS)
        except OSError as err:  # a read-only home: the next run schedules by test count
            print(f"\ntest seconds not recorded in {TEST_SECONDS}: {err}", file=sys.stderr)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controlling process, or a run without xdist
        config.pluginmanager.register(LongestFileFirst(), "longest_file_first")
