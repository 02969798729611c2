"""A real multi-host Ray cluster on one machine: one network namespace per node.

Each node is a network namespace with its own address on a private bridge, so a
role that binds or dials loopback where it should use its node's address fails
here as it would across real hosts. The bridge sits in a namespace of its own
too: nothing is added to the machine's own network, and no packet leaves it.

    cluster = NamespaceCluster(tmp_dir, num_nodes=3, cpus_per_node=2)
    cluster.start()                     # head on node 0, workers on 1..N-1, token auth on
    done = cluster.run_driver(["python", "script.py"], node=0)   # a driver inside node 0
    cluster.kill_node(2)                # every process of node 2 (its raylet, its actors)
    cluster.stop()                      # what it started, by namespace; then the network

Node i declares the custom resource "node_i" (1 unit), and every node but the head
"worker_node" (1 unit), for tests to pin roles (asking a fraction: 0.01 each); and
Ray's token authentication is on with a token of its own (RAY_AUTH_TOKEN_PATH in
every process's environment: nodes, their workers, drivers). Needs root and `ip`
(`skip_reason()` says why not). Processes are ended by the namespace they run in
(`ip netns pids`), never by name or `ray stop`, which would end every Ray on the
machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GCS_PORT = 6379
DASHBOARD_PORT = 8265
START_TIMEOUT_S = 180.0
OBJECT_STORE_BYTES = 300 * 1024**2
WORKER_NODE = "worker_node"  # the resource every node but the head declares


def skip_reason() -> str | None:
    """Why namespace clusters cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs these tests as root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"psprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def remove_stale_namespaces() -> list[str]:
    """Namespaces a cluster of a process that is gone left behind (killed before its
    stop(): e.g. pytest killed), with whatever still runs in them -> their names. Only
    names of this module's pattern ("ps<pid>sw", "ps<pid>n<i>") whose process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    stale = []
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        match = re.fullmatch(r"ps(\d+)(sw|n\d+)", name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        stale.append(name)
    return stale


def _ip(*args: str, netns: str | None = None) -> None:
    """One `ip` command (in `netns`), its stderr in the error when it fails."""
    command = ["ip"] + (["-n", netns] if netns else []) + list(args)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Node:
    index: int
    namespace: str
    address: str
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def resource(self) -> str:
        """The custom resource only this node has."""
        return f"node_{self.index}"

    @property
    def resources(self) -> dict:
        """What the node declares: its own resource, and "worker_node" unless the head."""
        return {self.resource: 1} | ({WORKER_NODE: 1} if self.index else {})


class NamespaceCluster:
    """`num_nodes` Ray nodes, node 0 the head, each in its own network namespace.

    root: a directory of this cluster's own (token, Ray temp dirs, logs).
    subnet: the first three octets of the /24 the nodes' addresses come from
      (node i is .i+1); the bridge is private to this cluster, so two clusters may
      use the same one.
    gpus: node index -> GPUs that node declares (`ray start --num-gpus`); no device backs
      them, so a role given one finds no GPU in TensorFlow.
    """

    def __init__(
        self,
        root: Path,
        num_nodes: int = 3,
        cpus_per_node: int = 2,
        subnet: str = "10.77.0",
        gpus: dict[int, int] | None = None,
    ):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        tag = f"ps{os.getpid()}"  # namespaces are machine-wide: names of our own
        self.switch = f"{tag}sw"
        self.nodes = [Node(i, f"{tag}n{i}", f"{subnet}.{i + 1}") for i in range(int(num_nodes))]
        self.cpus_per_node = int(cpus_per_node)
        self.gpus = dict(gpus or {})  # node index -> GPUs it declares (none backs them)
        self.token_path = self.root / "auth_token"
        # Ray's sockets live under its temp dir, and a socket path has at most 107 bytes
        self.ray_root = Path(tempfile.mkdtemp(prefix="psray", dir="/tmp"))
        self._made: list[str] = []  # namespaces made, deleted in stop()

    # ----- addresses and environment -------------------------------------------------

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        """The head's GCS, "host:port", as ray.init(address=...) joins it."""
        return f"{self.head.address}:{GCS_PORT}"

    @property
    def job_server(self) -> str:
        return f"http://{self.head.address}:{DASHBOARD_PORT}"

    def env(self, **extra: str) -> dict:
        """The environment of every process of this cluster: token auth with this
        cluster's token, none of the caller's Ray settings, TensorFlow quiet."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RAY_") and k != "PYTEST_CURRENT_TEST"
        }
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_path),
            TF_CPP_MIN_LOG_LEVEL="3",
            RAY_USAGE_STATS_ENABLED="0",
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        )
        env.update(extra)
        return env

    # ----- start ---------------------------------------------------------------------

    def start(self) -> NamespaceCluster:
        """The network, then the head, then the workers; returns once every node is
        alive in the cluster (a driver in node 0 counted them)."""
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        self.ray_root.mkdir(exist_ok=True)  # again after a stop()
        remove_stale_namespaces()
        try:
            self._make_network()
            self._start_node(self.head)
            self._wait_for_port(self.head, GCS_PORT)
            for node in self.nodes[1:]:
                self._start_node(node)
            self.wait_for_nodes(len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def _make_network(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        _ip("link", "set", "br0", "up", netns=self.switch)
        for node in self.nodes:
            _ip("netns", "add", node.namespace)
            self._made.append(node.namespace)
            port = f"port{node.index}"
            # made in the switch, its peer moved straight into the node: never in the host
            _ip(
                "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", node.namespace, netns=self.switch,
            )  # fmt: skip
            _ip("link", "set", port, "master", "br0", "up", netns=self.switch)
            _ip("addr", "add", f"{node.address}/24", "dev", "eth0", netns=node.namespace)
            _ip("link", "set", "eth0", "up", netns=node.namespace)
            _ip("link", "set", "lo", "up", netns=node.namespace)
            # a route for every destination, so that "which address of mine reaches the
            # outside" (Ray's and TF's guess of a node's address) names eth0's
            _ip("route", "add", "default", "dev", "eth0", netns=node.namespace)

    def _start_node(self, node: Node) -> None:
        temp_dir = self.ray_root / str(node.index)
        temp_dir.mkdir(exist_ok=True)
        command = [
            str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
            f"--node-ip-address={node.address}",
            f"--num-cpus={self.cpus_per_node}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--resources={json.dumps(node.resources)}",
            f"--temp-dir={temp_dir}",
        ]  # fmt: skip
        if node.index == 0:
            command += [
                "--head", f"--port={GCS_PORT}",
                "--include-dashboard=true", f"--dashboard-host={node.address}",
                f"--dashboard-port={DASHBOARD_PORT}",
            ]  # fmt: skip
        else:
            command += [f"--address={self.address}"]
        command.append(f"--num-gpus={self.gpus.get(node.index, 0)}")
        node.log = self.root / f"node{node.index}.log"
        with open(node.log, "ab") as log:
            node.process = subprocess.Popen(
                ["ip", "netns", "exec", node.namespace] + command,
                env=self.env(),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_for_port(self, node: Node, port: int) -> None:
        probe = f"import socket; socket.create_connection(('{node.address}', {port}), 1).close()"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check_running(node)
            done = self.run_in(node, [sys.executable, "-c", probe], capture_output=True)
            if done.returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"node {node.index}: nothing listens at port {port} {self.tail(node)}")

    def _check_running(self, node: Node) -> None:
        if node.process is not None and node.process.poll() is not None:
            raise RuntimeError(
                f"node {node.index}: `ray start` exited with {node.process.returncode} "
                f"{self.tail(node)}"
            )

    def wait_for_nodes(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once `count` nodes are alive in the cluster, seen by a driver in node 0."""
        script = (
            "import time, ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
            "    assert time.monotonic() < deadline, ray.nodes()\n"
            "    time.sleep(0.5)\n"
        )
        done = self.run_driver([sys.executable, "-c", script], timeout=timeout_s + 60)
        if done.returncode != 0:
            logs = " ".join(self.tail(node) for node in self.nodes)
            raise RuntimeError(f"{count} nodes not alive: {done.stderr[-2000:]} {logs}")

    # ----- drivers ---------------------------------------------------------------------

    def run_in(self, node: Node, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        """`command` in `node`'s namespace (not a driver: nothing of Ray set up)."""
        kwargs.setdefault("env", self.env())
        return subprocess.run(["ip", "netns", "exec", node.namespace] + command, cwd=REPO, **kwargs)

    def run_driver(
        self, command: list[str], node: int = 0, timeout: float = 600, **env: str
    ) -> subprocess.CompletedProcess:
        """`command` (e.g. a Python script that calls ray.init(address=cluster.address))
        inside node `node`'s namespace, with this cluster's token; output captured."""
        return self.run_in(
            self.nodes[node],
            command,
            env=self.env(RAY_ADDRESS=self.address, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start_driver(self, command: list[str], node: int = 0, **env: str) -> subprocess.Popen:
        """`run_driver`, not waited for (stdout and stderr are pipes, text)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.nodes[node].namespace] + command,
            env=self.env(RAY_ADDRESS=self.address, **env),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    # ----- faults and stop -------------------------------------------------------------

    def pids(self, node: Node | int) -> list[int]:
        """Every process in the node's namespace: what this cluster started there."""
        node = self.nodes[node] if isinstance(node, int) else node
        done = subprocess.run(
            ["ip", "netns", "pids", node.namespace], capture_output=True, text=True
        )
        return [int(p) for p in done.stdout.split()]

    def kill_node(self, index: int) -> None:
        """The node lost as a host is: every process in its namespace killed at once
        (SIGKILL: its raylet, object store, workers and actors), the namespace kept."""
        node = self.nodes[index]
        for _ in range(20):  # a process forking as it dies leaves a child: sweep again
            pids = self.pids(node)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        if node.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=10)

    def stop(self) -> None:
        """End every process of every node, then delete the namespaces, which takes
        their veths and the bridge with them. Idempotent."""
        self._terminate([node for node in self.nodes if node.namespace in self._made])
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        self._made.clear()
        shutil.rmtree(self.ray_root, ignore_errors=True)

    def _terminate(self, nodes: list[Node], grace_s: float = 5.0) -> None:
        """SIGTERM to the nodes' processes, all nodes at once (`ray start --block` stops
        its own; one grace period for all, not one per node), then SIGKILL to whatever
        is left in their namespaces."""
        for node in nodes:
            for pid in self.pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(self.pids(node) for node in nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
        for node in nodes:
            self.kill_node(node.index)

    def tail(self, node: Node, chars: int = 1500) -> str:
        """The end of the node's `ray start` output, for errors."""
        try:
            return f"[node {node.index} log: {node.log.read_text()[-chars:]!r}]" if node.log else ""
        except OSError:
            return ""
