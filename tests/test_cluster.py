"""On a real 3-node Ray cluster (tests/cluster_nodes.py: a network namespace per node,
token auth on): learners on different nodes give one device's gradient, roles land
on the nodes asked for, a lost node or head is survived or ends the run in one line,
and jobs submitted to the head run where they asked.

Every driver runs inside a node's namespace, as a child process: a `*_driver`
function of this module run by `run_driver_function`, which hands back what it
returns (JSON). One cluster serves the whole module (it takes ~10 s to start).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from cluster_nodes import WORKER_NODE, NamespaceCluster, skip_reason

pytestmark = pytest.mark.slow

TWO_BY_TWO = {
    "num_learners": 2,
    "num_gpus_per_learner": 2,
    "_fake_gpus": True,
    "num_cpus_per_learner": 0.5,
}
ON_WORKER_NODES = {WORKER_NODE: 0.01}  # a fraction: many actors fit on one node
RESULT = "RESULT "
APPO_STOP_REWARD = 450
MODELS = [{}, {"use_lstm": True, "max_seq_len": 4}]  # the learners' test
REFUSED = [  # the refusals' test: STRICT_SPREAD beyond the nodes, a missing resource, a GPU
    {"num_learners": 4, "learner_placement_strategy": "STRICT_SPREAD"},
    {"num_learners": 2, "custom_resources_per_learner": {"node_7": 0.5}},
    {"num_learners": 1, "num_gpus_per_learner": 1, "num_cpus_per_learner": 0.5},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # node 2 declares a GPU that no device backs, as a GPU host without CUDA TensorFlow
    nodes = NamespaceCluster(
        tmp_path_factory.mktemp("cluster"), num_nodes=3, cpus_per_node=4, gpus={2: 1}
    )
    started = time.perf_counter()
    try:
        nodes.start()
        print(f"\n3-node cluster up in {time.perf_counter() - started:.1f} s")
        yield nodes
    finally:
        nodes.stop()


def run_driver_function(
    cluster: NamespaceCluster, name: str, *args, node: int = 0, timeout: float = 600
):
    """`name(*args)` of this module in a driver process inside node `node` -> its result."""
    code = (
        "import json, sys\n"
        "sys.path[:0] = ['tests']\n"
        "import test_cluster\n"
        f"result = test_cluster.{name}(*json.loads(sys.argv[1]))\n"
        f"print({RESULT!r} + json.dumps(result))\n"
    )
    done = cluster.run_driver(
        [sys.executable, "-c", code, json.dumps(args)], node=node, timeout=timeout
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-6000:]}"
    [line] = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    return json.loads(line[len(RESULT) :])


def join_cluster():
    """In a driver: join the cluster at RAY_ADDRESS as the command line does, with the
    shared test modules pickled by value (no node has tests/ on its path)."""
    import fakes
    import ray

    from policy_service.distributed.ray_runtime import start_ray

    start_ray(os.environ["RAY_ADDRESS"], quiet=True)
    ray.cloudpickle.register_pickle_by_value(fakes)
    return ray


def node_of(actor) -> str:
    """The address of the node a Ray actor runs on, as it sees it."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: ray.util.get_node_ip_address()))


# ----- learners on different nodes ----------------------------------------------------


def learners_and_refusals_driver(models: list[dict], configs: list[dict]) -> dict:
    """The two tests below in one driver (joining and importing TensorFlow cost ~20 s a
    driver here): the refusals first, while no actor of ours is alive, then the learners."""
    join_cluster()
    return {"refused": refused(configs), "learners": learners_on_two_nodes(models)}


@pytest.fixture(scope="module")
def learners_and_refusals(cluster) -> dict:
    return run_driver_function(cluster, "learners_and_refusals_driver", MODELS, REFUSED)


def learners_on_two_nodes(models: list[dict]) -> list[dict]:
    """For each model: 2 learners x 2 fake GPUs, STRICT_SPREAD over the worker nodes,
    against one device in this driver: gradient, two steps, bit-identical weights."""
    import ray
    from fakes import (
        ACTION_SPACE,
        OBS_SPACE,
        PGPolicy,
        assert_grads_close,
        assert_weights_close,
        episode_batch,
        mlp_batch,
        one_device,
        same_start,
        small_config,
    )

    from policy_service import LearnerGroup

    results = []
    for model in models:
        config = small_config(
            model=model,
            learner_placement_strategy="STRICT_SPREAD",
            custom_resources_per_learner=ON_WORKER_NODES,
            **TWO_BY_TWO,
        )
        group = LearnerGroup(PGPolicy, OBS_SPACE, ACTION_SPACE, config)
        try:
            one = one_device(model=model)
            same_start(group, one)
            lstm = model.get("use_lstm", False)
            # MLP: 38 rows after padding to 2 learners, 40 over 4 towers; LSTM: 10
            # sequences of at most 4 steps, 5 per learner, padded to 6 over 2 towers
            batch = episode_batch([5, 3, 7, 2, 4, 6, 1]) if lstm else mlp_batch(37)
            g1, s1 = one.compute_gradients(batch)
            g4, s4 = group.compute_gradients(batch)
            assert_grads_close(g1, g4)
            for seed in (1, 2):  # the second step from the combined Adam state
                batch = episode_batch([4, 6, 2, 5], seed=seed) if lstm else mlp_batch(37, seed=seed)
                one.learn_on_batch(batch)
                group.learn_on_batch(batch)
                assert_weights_close(one.get_weights(), group.get_weights())
            addresses = ray.get([actor.address.remote() for actor in group.actors])
            results.append(
                {
                    "driver": ray.util.get_node_ip_address(),
                    "learner_nodes": [node_of(actor) for actor in group.actors],
                    "collective_addresses": addresses,
                    "devices": group.devices,
                    "valid_rows": [s1["valid_rows"], s4["valid_rows"]],
                    "identical": group.weights_identical(),
                }
            )
        finally:
            group.stop()
    return results


def test_two_learners_on_two_nodes_give_one_devices_gradient_mlp_and_lstm(
    cluster, learners_and_refusals
):
    workers = {node.address for node in cluster.nodes[1:]}
    results = learners_and_refusals["learners"]
    assert len(results) == len(MODELS)
    for result in results:
        assert result["driver"] == cluster.head.address
        assert set(result["learner_nodes"]) == workers  # one learner on each worker node
        # each learner's collective server is at its own node's address, not loopback
        hosts = [address.rsplit(":", 1)[0] for address in result["collective_addresses"]]
        assert hosts == result["learner_nodes"]
        assert result["devices"] == [["/CPU:0", "/CPU:1"]] * 2
        assert result["valid_rows"][0] == result["valid_rows"][1] > 0
        assert result["identical"] is True


# ----- bad input -------------------------------------------------------------------------


def refused(configs: list[dict]) -> list[dict]:
    """For each config, a LearnerGroup of it -> the one-line error it is refused with,
    and the actors alive in the cluster right after (none may have started)."""
    from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config
    from ray.util.state import list_actors

    from policy_service import LearnerGroup

    results = []
    for config in configs:
        try:
            LearnerGroup(PGPolicy, OBS_SPACE, ACTION_SPACE, small_config(**config)).stop()
        except Exception as err:  # noqa: BLE001 - the test reads what it was
            alive = list_actors(filters=[("state", "=", "ALIVE")])
            results.append({"error": f"{type(err).__name__}: {err}", "actors": len(alive)})
        else:
            results.append({"error": None})
    return results


def test_strict_spread_beyond_the_nodes_a_missing_resource_and_an_unseen_gpu_are_one_line(
    learners_and_refusals,
):
    spread, resource, unseen = learners_and_refusals["refused"]
    assert spread == {
        "error": "ResourcesExceedClusterError: learner_placement_strategy STRICT_SPREAD puts "
        "each of 4 learners on a node of its own, but the cluster has 3 alive nodes "
        "(num_learners)",
        "actors": 0,
    }
    assert resource == {
        "error": "ResourcesExceedClusterError: resources: 2 learners x 0.5 node_7 = 1 node_7, "
        "no node of the cluster has the resource 'node_7' (num_learners, "
        "custom_resources_per_learner)",
        "actors": 0,
    }
    # the learner asking a GPU went to node 2, the one that declares one (Ray assigned it
    # GPU 0), where TensorFlow sees none: one line, no retries
    assert unseen["error"] == (
        "LearnerStartError: a learner actor could not build its policy where Ray placed it: "
        "num_gpus=1.0 asks for 1 GPU(s); Ray assigned GPUs [0] but TensorFlow sees no GPU in "
        "this process (is the CUDA build of TensorFlow installed, extra 'gpu'?)"
    )


# ----- roles on nodes, runs in progress --------------------------------------------------


def roles_on(cluster: NamespaceCluster, node: int) -> list[str]:
    """The Ray actor processes running on a node, by the class their title names."""
    roles = []
    for pid in cluster.pids(node):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:  # ended meanwhile
            continue
        if title.startswith("ray::") and not title.startswith("ray::IDLE"):
            roles.append(title.removeprefix("ray::").split(".")[0].split(" ")[0])
    return roles


def iterations_done(run_dir: Path) -> int:
    try:
        return len((run_dir / "progress.jsonl").read_text().splitlines())
    except OSError:
        return 0


def newest_checkpoint(run_dir: Path) -> int:
    """The iteration of the newest finished checkpoint (names end in _<iteration>)."""
    numbers = [
        int(tail)
        for p in (run_dir / "checkpoints").iterdir()
        if (tail := p.name.rsplit("_", 1)[-1]).isdigit()
    ]
    return max(numbers, default=0)


def wait_for_iterations(driver, run_dir: Path, count: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while iterations_done(run_dir) < count:
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the run ended before iteration {count}: {err[-4000:]}")
        assert time.monotonic() < deadline, f"no iteration {count} within {timeout_s} s"
        time.sleep(0.5)


def around(text: str, word: str, chars: int = 3000) -> str:
    """The text about the first `word` in it (where a failure starts)."""
    at = text.find(word)
    return text[max(0, at - chars) : at + chars]


# ----- APPO as a job submitted to the head, a worker node lost mid-run --------------------

APPO_ARGS = [
    "train", "appo", "--env", "CartPole-v1",
    "--config", "algorithms/tuned/cartpole_appo.yaml",
]  # fmt: skip


def train_command(cluster: NamespaceCluster, run_dir: Path, *args: str) -> list[str]:
    """`policy-service train` joining the cluster (--address), into `run_dir`."""
    cli = str(Path(sys.executable).parent / "policy-service")
    return [cli, *APPO_ARGS, "--address", cluster.address, "--output-dir", str(run_dir), *args]


def nodes_of(resources: dict) -> dict:
    """result.json's resources -> each role's node addresses."""
    return {
        "driver": resources["driver"]["node_ip"],
        "learners": [entry["node_ip"] for entry in resources["learners"]],
        "env_runners": [entry["node_ip"] for entry in resources["env_runners"]],
        "inference_actor": (resources["inference_actor"] or {}).get("node_ip"),
    }


def job_actors_driver(submission_id: str) -> dict:
    """The actors of the job submitted as `submission_id`: class name -> node addresses."""
    join_cluster()
    from ray.util.state import list_actors, list_jobs, list_nodes

    [job] = [j for j in list_jobs() if j.submission_id == submission_id]
    address_of = {node.node_id: node.node_ip for node in list_nodes()}  # dead ones too
    placed: dict[str, list[str]] = {}
    for actor in list_actors(filters=[("job_id", "=", job.job_id)], detail=True):
        if actor.node_id:  # else never placed (a replacement the run gave up on): ran nowhere
            placed.setdefault(actor.class_name, []).append(address_of.get(actor.node_id, "?"))
    return {"status": str(job.status), "actors": placed}


def test_appo_submitted_to_the_head_loses_a_worker_node_mid_run_replaces_it_and_learns(
    cluster, tmp_path
):
    """One job, submitted to the head: runners, the PolicyActor and 2 learners (SPREAD)
    on the two worker nodes. At iteration 3 the node holding the PolicyActor (and so a
    learner) is killed; the run reaches 450 on the node left, its losses counted, with
    no traceback; `submit` exits with the job's status, and Ray's state API shows every
    actor of the job, the lost ones and their replacements, where it was asked."""
    cli = str(Path(sys.executable).parent / "policy-service")
    config = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "cartpole_appo.yaml"
    run_dir = tmp_path / "job"
    submitter = cluster.start_driver(
        [
            cli, "submit", "--address", cluster.job_server, "--insecure", "--",
            cli, "train", "appo", "--env", "CartPole-v1", "--config", str(config),
            "--output-dir", str(run_dir),
            "--stop-reward", str(APPO_STOP_REWARD), "--stop-timesteps", "600000",
            "--set", "inference=policy_actors",
            "--set", "custom_resources_per_env_runner={worker_node: 0.01}",
            "--set", "custom_resources_per_policy_actor={worker_node: 0.01}",
            "--num-learners", "2", "--set", "num_cpus_per_learner=0.5",
            "--set", "learner_placement_strategy=SPREAD",
            "--set", "custom_resources_per_learner={worker_node: 0.01}",
        ],
    )  # fmt: skip
    started = time.perf_counter()
    try:
        wait_for_iterations(submitter, run_dir, 3)
        before = {i: roles_on(cluster, i) for i in range(3)}
        [victim] = [i for i in (1, 2) if any("PolicyHost" in r for r in before[i])]
        killed_at = iterations_done(run_dir)
        cluster.kill_node(victim)
        out, err = submitter.communicate(timeout=600)
    finally:
        if submitter.poll() is None:
            submitter.kill()
    seconds = time.perf_counter() - started
    lost = before[victim]
    print(
        f"\nAPPO job, node {victim} lost at iteration {killed_at} ({sorted(lost)}), {seconds:.0f} s"
    )
    assert submitter.returncode == 0, (out + err)[-4000:]
    assert "Traceback" not in out + err, around(out + err, "Traceback")
    result = json.loads((run_dir / "result.json").read_text())
    print(
        f"{result['episode_return_mean']:.1f} after {result['timesteps_total']} env steps "
        f"({result['stop_reason']}), {result['num_worker_restarts']} runner, "
        f"{result['num_policy_actor_restarts']} PolicyActor and "
        f"{result['num_learner_restarts']} learner restart(s)"
    )
    roles = ("RolloutWorker", "LearnerHost", "PolicyHost")
    # before the loss: nothing of the run on the head, a learner on each worker node
    assert not [r for r in before[0] if any(role in r for role in roles)], before[0]
    assert all(any("LearnerHost" in r for r in before[i]) for i in (1, 2)), before
    assert result["stop_reason"] == "stop_reward"
    assert result["episode_return_mean"] >= APPO_STOP_REWARD
    assert result["num_learner_restarts"] >= 1
    assert result["num_policy_actor_restarts"] >= 1
    runners_lost = sum("RolloutWorker" in role for role in lost)
    assert result["num_worker_restarts"] >= runners_lost
    head, survivor = cluster.head.address, cluster.nodes[3 - victim].address
    where = nodes_of(result["resources"])  # at the end: every role on the node left
    assert where["driver"] == head  # a job's driver runs on the head
    assert set(where["env_runners"]) | set(where["learners"]) | {where["inference_actor"]} == {
        survivor
    }
    [submission_id] = set(re.findall(r"raysubmit_\w+", out + err))
    job = run_driver_function(cluster, "job_actors_driver", submission_id)
    assert job["status"] == "SUCCEEDED"
    placed = {
        role: {node for name, nodes in job["actors"].items() if role in name for node in nodes}
        for role in roles
    }
    # the lost learner on the victim, its replacements on the survivor; the PolicyActor
    # is restarted by Ray (one actor, where it last ran)
    workers = {node.address for node in cluster.nodes[1:]}
    assert placed["LearnerHost"] == workers, job["actors"]
    assert placed["PolicyHost"] == {survivor}, job["actors"]
    assert placed["RolloutWorker"] and placed["RolloutWorker"] <= workers, job["actors"]


def test_a_failed_job_exits_with_its_status(cluster):
    cli = str(Path(sys.executable).parent / "policy-service")
    done = cluster.run_driver(
        [cli, "submit", "--address", cluster.job_server, "--insecure", "--",
         sys.executable, "-c", "raise SystemExit(3)"],
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]


# ----- the head lost ----------------------------------------------------------------------


def test_the_head_lost_ends_the_run_in_one_line_it_resumes_and_a_spent_budget_ends_it(
    cluster, tmp_path
):
    """The head killed: one line, exit 1, a checkpoint. Resumed on a fresh cluster, the
    run goes on; with no env runner restart allowed (max_num_env_runner_restarts=0),
    killing its runner's node then ends it in one line naming the runner, exit 1."""
    run_dir = tmp_path / "run"
    args = [
        "--num-env-runners", "1",
        "--set", "custom_resources_per_env_runner={worker_node: 0.01}",
        "--set", "max_num_env_runner_restarts=0",
    ]  # fmt: skip
    # the driver on node 1: the head's node is killed whole
    driver = cluster.start_driver(
        train_command(cluster, run_dir, *args, "--checkpoint-every", "2"), node=1
    )
    try:
        wait_for_iterations(driver, run_dir, 4)
        killed = time.perf_counter()
        cluster.kill_node(0)
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    ended_s = time.perf_counter() - killed
    print(f"\nthe head lost: the run ended {ended_s:.0f} s after")
    assert driver.returncode == 1
    last_line = err.strip().splitlines()[-1]
    assert last_line == (
        f"policy-service: error: the Ray cluster went away: its head's GCS at "
        f"{cluster.address} has not answered for 10 s; continue with --resume {run_dir}"
    )
    assert "Traceback" not in err
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    resumed_from = int(checkpoints[-1].rsplit("_", 1)[1])
    assert resumed_from >= 2  # every 2 iterations; the 4th's may be cut by the kill
    cluster.stop()  # a fresh cluster: nothing of the old one's state
    cluster.start()
    # the driver on the head now: the runner's node (a worker) is killed next
    resumed = cluster.start_driver(
        [str(Path(sys.executable).parent / "policy-service"), "train", "--resume", str(run_dir),
         "--address", cluster.address, "--stop-iters", str(resumed_from + 10**7)],
    )  # fmt: skip
    # progress.jsonl may hold iterations past the checkpoint until the resume cuts them:
    # a checkpoint 2 or more iterations on says the resumed run made them (only the newest 3
    # are kept, so the one exactly 2 on may be gone by the time it is looked for)
    try:
        deadline = time.monotonic() + 300
        runner_nodes: list[int] = []  # empty while the driver's stand-in samples for it
        while not (newest_checkpoint(run_dir) >= resumed_from + 2 and runner_nodes):
            assert resumed.poll() is None, resumed.communicate()[1][-4000:]
            assert time.monotonic() < deadline, (
                f"no checkpoint after iteration {resumed_from + 1} and runner in 300 s"
            )
            time.sleep(0.5)
            runner_nodes = [
                i for i in (1, 2) if any("RolloutWorker" in r for r in roles_on(cluster, i))
            ]
        [runner_node] = runner_nodes
        cluster.kill_node(runner_node)
        _, err = resumed.communicate(timeout=300)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    assert f"from {checkpoints[-1]} (iteration {resumed_from})" in err
    iterations = [json.loads(line)["iteration"] for line in (run_dir / "progress.jsonl").open()]
    after = iterations[iterations.index(resumed_from) + 1 :]
    assert after[:2] == [resumed_from + 1, resumed_from + 2]  # the curve goes on
    assert resumed.returncode == 1, err[-4000:]
    assert "Traceback" not in err, around(err, "Traceback")
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith(
        "policy-service: error: env runner 1 died 1 times during one async sampling "
        "(0 restarts in all; budgets: max_restarts_per_sample=3, "
        "max_num_env_runner_restarts=0); last: "
    ), last_line
