"""shutdown_serve (serving/serve_shutdown.py) on a real local Ray and Serve: a healthy
stop prints none of Ray's "Task ServeController.* failed ... will be retried" lines."""

from __future__ import annotations

import time

import pytest
import ray
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

from policy_service.serving.serve_shutdown import shutdown_serve

RAYS_LINE = "Task ServeController."
LINE_WAIT_S = 5.0  # Ray's driver prints such lines a moment after the controller ended


@pytest.mark.slow  # Serve's controller and one replica: ~15 s here
def test_a_stopped_serve_leaves_no_line_about_calls_to_its_controller(ray_local, capfd):
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        def echo(self, value):
            return value

    serve.start(proxy_location="Disabled")
    handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
    assert handle.echo.remote(3).result() == 3  # this process now long-polls the controller
    shutdown_serve()
    time.sleep(LINE_WAIT_S)
    out, err = capfd.readouterr()
    assert RAYS_LINE not in out + err, out + err
    with pytest.raises(ValueError):  # the controller is gone
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    shutdown_serve()  # with Serve stopped: nothing
