"""PolicyClient against a server that dies mid-answer: one ConnectionError, as
docs/serving.md promises, so a client retrying on ConnectionError outlives a restart."""

import json
import socket
import threading

import gymnasium as gym
import pytest

from policy_service.client.policy_client import PolicyClient
from policy_service.io.space_codec import space_to_json

SPEC = json.dumps(
    {
        "observation_space": space_to_json(gym.spaces.Box(-1.0, 1.0, (4,))),
        "action_space": space_to_json(gym.spaces.Discrete(2)),
        "state_shapes": [],
    }
).encode()


def _serve(listener: socket.socket, truncate_after: int) -> None:
    """Answer the spec, then answer POSTs with a 36-byte body cut after `truncate_after`."""
    conn, _ = listener.accept()
    with conn:
        reader = conn.makefile("rb")
        while True:
            request = reader.readline()
            if not request:
                return
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            if request.startswith(b"GET"):
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(SPEC)}\r\n\r\n"
                conn.sendall(head.encode() + SPEC)
                continue
            body = b'{"episode_id": "0123456789abcdef01"}'
            assert len(body) == 36
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n"
            conn.sendall(head.encode() + body[:truncate_after])
            return  # the server dies mid-answer


@pytest.mark.parametrize("truncate_after", [0, 20])
def test_an_answer_cut_off_mid_body_raises_one_connection_error(truncate_after):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = threading.Thread(target=_serve, args=(listener, truncate_after), daemon=True)
    server.start()
    client = PolicyClient(f"http://127.0.0.1:{port}", "token", timeout_s=10)
    with pytest.raises(ConnectionError, match=rf"POST /v1/episodes: .* after {truncate_after} "):
        client.start_episode()
    server.join(10)
    listener.close()
