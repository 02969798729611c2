"""Shared test setup: quiet TF, four fake GPUs for the whole pytest process.

TensorFlow fixes its devices when it initializes, so they are created here,
before any test imports TensorFlow ops. A test that needs a different device
count runs in a subprocess or a Ray actor.
"""

import os

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


@pytest.fixture(scope="module")
def ray_local(request):
    """A real local Ray for one test module, with the shared test envs and
    policies pickled by value so Ray workers need not import them. A module may
    set RAY_RESOURCES, e.g. {"num_gpus": 1}: Ray then advertises a GPU that no
    device backs."""
    import envs
    import fakes
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        **getattr(request.module, "RAY_RESOURCES", {}),
    )
    for module in (envs, fakes):
        ray.cloudpickle.register_pickle_by_value(module)
    yield
    for module in (envs, fakes):
        ray.cloudpickle.unregister_pickle_by_value(module)
    ray.shutdown()


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
