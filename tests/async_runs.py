"""What the asynchronous tests share: fakes.ReturnsPGPolicy's config, the episodes
envs.ScriptedEpisodesEnv plays, and draining a FragmentStream of its requests."""

from __future__ import annotations

from policy_service.distributed.fragment_stream import Fragment, FragmentStream

CONFIG = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "lr": 0.01}
SCRIPT = {"lengths": [4, 6], "endings": ["terminated", "truncated"], "step_sleep_s": 0.005}


def drain(stream: FragmentStream) -> list[Fragment]:
    """Every fragment the stream's requests in flight bring, waiting for each."""
    fragments = []
    while stream.requests_in_flight():
        fragments += stream.collect(timeout_s=5.0)
    return fragments
