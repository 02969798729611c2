"""Shared test setup: quiet TF, four fake GPUs for the whole pytest process.

TensorFlow fixes its devices when it initializes, so they are created here,
before any test imports TensorFlow ops. A test that needs a different device
count runs in a subprocess or a Ray actor.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from policy_service.engine import devices

NUM_FAKE_GPUS = 4
devices.prepare_process(NUM_FAKE_GPUS)


import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def custom_models_restored():
    """A test module's custom model registrations end with it: actors take a copy of
    the registry, and a model class from tests/ left in it by another module would
    have to be importable in every later module's Ray workers."""
    from policy_service import models

    before = models.custom_model_registry()
    yield
    for name in models.custom_model_registry():
        models.unregister_custom_model(name)
    models.register_custom_models(before)


class SharedRay:
    """One local Ray per pytest worker, shared by the test modules that ask for it
    one after another: starting Ray is seconds per module on 2 cores. A module gets
    it only clean (every resource free again: no actor or placement group of an
    earlier module left) and started with its RAY_RESOURCES; else Ray is started
    afresh. A module that does not ask for it from its first test on finds no Ray,
    as it would alone (an Algorithm then starts and stops its own)."""

    CLEAN_WAIT_S = 10.0  # killed actors give their CPUs back asynchronously

    def __init__(self) -> None:
        self.resources: dict | None = None  # what the running Ray was started with

    def enter(self, resources: dict) -> None:
        import ray

        if ray.is_initialized() and (resources != self.resources or not self._clean()):
            self.shutdown()
        if not ray.is_initialized():
            ray.init(address="local", num_cpus=2, include_dashboard=False, **resources)
            self.resources = dict(resources)

    def _clean(self) -> bool:
        import ray

        deadline = time.monotonic() + self.CLEAN_WAIT_S
        while ray.available_resources() != ray.cluster_resources():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

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
    and policies pickled by value so Ray workers need not import them. A module may
    set RAY_RESOURCES, e.g. {"num_gpus": 1}: Ray then advertises a GPU that no
    device backs."""
    import envs
    import fakes
    import ray

    SHARED_RAY.enter(getattr(request.module, "RAY_RESOURCES", {}))
    for module in (envs, fakes):
        ray.cloudpickle.register_pickle_by_value(module)
    yield
    for module in (envs, fakes):
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
