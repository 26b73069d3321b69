"""Shared fixtures of the training tests.

``ray_session``: one local Ray instance of its own (``address="local"``: never a cluster
running here) for the whole test session (8 logical CPUs on any
machine, no dashboard, worker logs kept out of the test output), shut down at the end. The
driver reuses an initialised Ray instead of starting its own, so tests that run training
in-process share it.
"""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from ftkit.train.control.ray_session import LOCAL_RAY_CPUS

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
