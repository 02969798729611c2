"""Bad input on the command line is a one-line error before anything is built, started
or written: config files, the run directory, addresses, export and submit arguments.
(A policy's bad inputs: test_policy_inputs.py beside this file; the command line's own
options: test_cli.py.)"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from algorithms.registry import ALGORITHMS
from policy_service.cli import commands as cli
from policy_service.distributed import jobs

# ----- the command line: config files, run directory, addresses, export, submit ---------
# (each refused in one line before anything is built, started or written)

TRAIN = ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1"]
HANG_BOUND_S = 60.0  # issue 27: what would otherwise hang fails within this


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("policy-service: error: "), err
    return lines[0]


@pytest.fixture
def no_algorithm_built(monkeypatch):
    """Building PPO fails the test: the check must come first."""
    from algorithms.ppo import PPO

    def built(*args, **kwargs):
        raise AssertionError("the algorithm was built before the bad input was refused")

    monkeypatch.setattr(PPO, "__init__", built)


def _train_with_config(tmp_path, name: str, content: bytes | str) -> tuple[int, Path]:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    run_dir = tmp_path / "run"
    return cli.main([*TRAIN, "--config", str(path), "--output-dir", str(run_dir)]), run_dir


ALIAS_BOMB = (
    "\n".join(
        ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
        + [f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in zip("abcde", "bcdef")]
    )
    + "\n"
)


def test_a_yaml_alias_bomb_in_a_config_file_is_refused(tmp_path, capsys, no_algorithm_built):
    assert len(ALIAS_BOMB) < 400  # 10**6 leaves once expanded
    code, run_dir = _train_with_config(tmp_path, "bomb.yaml", ALIAS_BOMB)
    assert code == 2
    assert (
        f"config file {tmp_path / 'bomb.yaml'}: YAML aliases are not allowed, found *a "
        "on line 2" in _one_line(capsys)
    )
    assert not run_dir.exists()


def test_a_yaml_alias_in_a_set_value_is_refused(tmp_path, capsys, no_algorithm_built):
    assert (
        cli.main(
            [
                *TRAIN,
                "--set",
                "model.fcnet_hiddens=[&n 8, *n]",
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert (
        "--set model.fcnet_hiddens value '[&n 8, *n]': YAML aliases are not allowed"
        in _one_line(capsys)
    )


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("deep.yaml", "a: " + "[" * 20_000 + "]" * 20_000, "nested more than 32 levels deep"),
        (
            "deep.json",
            '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}",
            "is not valid JSON: maximum recursion depth exceeded",
        ),
        (
            "nested.json",
            '{"a": ' + "[" * 40 + "]" * 40 + "}",
            "nested 41 levels deep, expected at most 32",
        ),
        (
            "latin1.yaml",
            b"lr: 0.001\nenv_config: {name: caf\xe9}\n",
            "not UTF-8 text (byte 0xe9 at offset 32)",
        ),
        ("big.yaml", "lr: 0.001\n" + "#" * (1 << 20) + "\n", "larger than 1048576 bytes"),
    ],
)
def test_a_config_file_that_is_deep_large_or_not_utf8_is_one_line(
    name, content, message, tmp_path, capsys, no_algorithm_built
):
    code, run_dir = _train_with_config(tmp_path, name, content)
    assert code == 2
    line = _one_line(capsys)
    assert f"config file {tmp_path / name}" in line and message in line, line
    assert not run_dir.exists()


def test_an_unregistered_custom_model_is_refused_before_the_algorithm_is_built(
    tmp_path, capsys, no_algorithm_built
):
    run_dir = tmp_path / "run"
    args = [*TRAIN, "--set", "model.custom_model=nosuch", "--output-dir", str(run_dir)]
    assert cli.main(args) == 2
    assert (
        "config.model.custom_model 'nosuch' is not a name given to register_custom_model"
        in _one_line(capsys)
    )
    assert not run_dir.exists()


def test_an_output_dir_that_is_a_file_fails_before_the_algorithm_is_built(
    tmp_path, capsys, no_algorithm_built
):
    taken = tmp_path / "taken"
    taken.write_text("a user's file")
    assert cli.main([*TRAIN, "--output-dir", str(taken)]) == 2
    assert (
        f"run directory {taken} (--output-dir): a file is there, expected a directory"
        in _one_line(capsys)
    )
    assert taken.read_text() == "a user's file"
    assert cli.main([*TRAIN, "--output-dir", str(taken / "run")]) == 2
    assert f"{taken} is a file, expected a directory" in _one_line(capsys)


def test_an_unwritable_output_dir_fails_before_the_algorithm_is_built(
    tmp_path, capsys, no_algorithm_built
):
    if os.geteuid() == 0:  # root writes through permissions; sysfs takes no new files
        target = Path("/sys/policy-service-run")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "run"
    assert cli.main([*TRAIN, "--output-dir", str(target)]) == 2
    line = _one_line(capsys)
    assert f"run directory {target} (--output-dir): cannot write in {target.parent}" in line
    assert not target.exists()


@pytest.mark.parametrize("opset", ["-1", "999", "5"])
def test_an_onnx_opset_out_of_range_is_one_line_naming_the_range(opset, tmp_path, capsys):
    import tf2onnx

    out = tmp_path / "out"
    assert (
        cli.main(
            ["export", str(tmp_path / "no-checkpoint-needed"), "--out", str(out), "--onnx", opset]
        )
        == 2
    )
    assert (
        f"--onnx {opset}: onnx opset must be an integer from 6 to 18 (what tf2onnx "
        f"{tf2onnx.__version__} converts to), got {opset}"
    ) in _one_line(capsys)
    assert not out.exists()


def test_the_onnx_opset_range_is_what_tf2onnx_converts_to():
    import onnx
    from tf2onnx import constants

    from policy_service.io.export import onnx_opsets

    assert onnx_opsets() == range(
        6, min(max(constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version()) + 1
    )
    with pytest.raises(ValueError, match="got True"):
        from policy_service.io.export import check_onnx_opset

        check_onnx_opset(True)


@pytest.mark.parametrize(
    "flag, env",
    [
        (["--address", "garbage://x"], {}),
        (["--address", "127.0.0.1:99999"], {}),
        ([], {"RAY_ADDRESS": "garbage://x"}),
    ],
)
def test_a_garbage_ray_address_is_one_line(
    flag, env, tmp_path, capsys, monkeypatch, no_algorithm_built
):
    import ray

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main([*TRAIN, *flag, "--output-dir", str(tmp_path / "run")]) == 2
    source, address = ("RAY_ADDRESS", env["RAY_ADDRESS"]) if env else tuple(flag)
    assert (
        f"{source} {address!r}: expected host:port (e.g. 127.0.0.1:6379), "
        "ray://host:port, 'auto' or 'local'" in _one_line(capsys)
    )
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_an_address_where_no_cluster_answers_fails_at_once(
    tmp_path, capsys, monkeypatch, no_algorithm_built
):
    import ray

    started = time.monotonic()
    code = cli.main([*TRAIN, "--address", "127.0.0.1:1", "--output-dir", str(tmp_path / "r")])
    assert time.monotonic() - started < HANG_BOUND_S  # the bound for a refused address
    assert code == 2
    assert (
        "--address '127.0.0.1:1': no Ray cluster answers at 127.0.0.1:1 (Connection refused"
        in _one_line(capsys)
    )
    assert not ray.is_initialized() and not (tmp_path / "r").exists()


def _beyond_memory(key: str, what: str, needed: int) -> str:
    from policy_service.config_rules import machine_memory_bytes

    return (
        f"{key} needs {what}, {needed} bytes at least, more than this machine's "
        f"{machine_memory_bytes() / 2**30:.1f} GiB of memory; got "
    )


@pytest.mark.parametrize(
    "algorithm, setting, key, what",
    [
        ("ppo", "train_batch_size=1000000000000", "config.train_batch_size", "16 bytes a row"),
        (
            "dqn",
            "replay_buffer_capacity=1000000000000",
            "config.replay_buffer_capacity",
            "16 bytes a transition",
        ),
    ],
)
def test_a_size_beyond_the_machines_memory_is_refused_when_the_config_is_read(
    algorithm, setting, key, what, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    argv = ["train", algorithm, "--env", "CartPole-v1", "--set", setting]
    assert cli.main([*argv, "--output-dir", str(run_dir)]) == 2
    expected = _beyond_memory(key, what, 16 * 10**12) + "1000000000000"
    assert expected in _one_line(capsys)
    assert not run_dir.exists()


def test_hidden_layers_whose_weights_exceed_memory_are_refused(
    tmp_path, capsys, no_algorithm_built
):
    run_dir = tmp_path / "run"
    argv = [*TRAIN, "--set", "model.fcnet_hiddens=[1000000, 1000000]"]
    assert cli.main([*argv, "--output-dir", str(run_dir)]) == 2
    expected = _beyond_memory(
        "config.model.fcnet_hiddens", "4 bytes a weight, layer to layer", 4 * 10**12
    )
    assert expected + "[1000000, 1000000]" in _one_line(capsys)
    assert not run_dir.exists()


@pytest.fixture
def no_cluster_contacted(monkeypatch):
    """jobs.connect records its address and stops: no network is used."""
    contacted = []

    def connect(address):
        contacted.append(address)
        raise jobs.JobSubmissionError("stopped before the network")

    monkeypatch.setattr(jobs, "connect", connect)
    return contacted


def test_submit_with_a_missing_working_dir_names_the_directory(
    tmp_path, capsys, no_cluster_contacted
):
    missing = tmp_path / "missing"
    assert (
        cli.main(
            [
                "submit",
                "--address",
                "http://127.0.0.1:9",
                "--working-dir",
                str(missing),
                "--",
                "true",
            ]
        )
        == 2
    )
    line = _one_line(capsys)
    assert (
        f"--working-dir {missing}: expected a directory, a .zip file or a URI, found not there"
        in line
        and "127.0.0.1" not in line
    )
    assert no_cluster_contacted == []


@pytest.mark.parametrize("address", ["garbage://x", "http://", "http://host:0"])
def test_submit_to_a_garbage_address_is_one_line(address, capsys, no_cluster_contacted):
    assert cli.main(["submit", "--address", address, "--", "true"]) == 2
    assert (
        f"--address {address!r}: expected http(s)://HOST:PORT or HOST:PORT of the job "
        "server" in _one_line(capsys)
    )
    assert no_cluster_contacted == []


@pytest.mark.parametrize(
    "address", ["http://10.1.2.3:8265", "203.0.113.5:8265", "http://head.example.com:8265"]
)
def test_submit_refuses_plain_http_to_another_host_unless_insecure(
    address, capsys, no_cluster_contacted
):
    assert cli.main(["submit", "--address", address, "--", "true"]) == 2
    line = _one_line(capsys)
    host = address.split("//")[-1].rsplit(":", 1)[0].strip("[]")
    assert line.startswith(f"policy-service: error: --address {address}: plain http:// to {host}")
    assert "which is not this machine, would send the cluster token unencrypted" in line
    assert "--insecure" in line and no_cluster_contacted == []
    assert cli.main(["submit", "--address", address, "--insecure", "--", "true"]) == 2
    assert "stopped before the network" in _one_line(capsys)
    assert no_cluster_contacted == [address]


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:8265",
        "http://localhost:8265",
        "http://[::1]:8265",
        "https://10.1.2.3:8265",
    ],
)
def test_submit_over_loopback_or_https_needs_no_insecure(address, capsys, no_cluster_contacted):
    assert cli.main(["submit", "--address", address, "--", "true"]) == 2
    assert "stopped before the network" in _one_line(capsys)
    assert no_cluster_contacted == [address]


def test_submit_says_which_host_it_sends_the_token_to(monkeypatch, capsys):
    import ray.job_submission

    sent = {}

    class Client:
        def __init__(self, address, headers):
            sent.update(address=address, headers=headers)

    monkeypatch.setattr(jobs, "auth_headers", lambda: {"authorization": "Bearer secret"})
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    jobs.connect("https://10.1.2.3:8265")
    assert capsys.readouterr().err == (
        "policy-service: sending the Ray cluster token to 10.1.2.3 (https://10.1.2.3:8265)\n"
    )
    assert sent == {
        "address": "https://10.1.2.3:8265",
        "headers": {"authorization": "Bearer secret"},
    }
    jobs.connect("127.0.0.1:8265")
    assert capsys.readouterr().err == (
        "policy-service: sending the Ray cluster token to "
        "127.0.0.1 (http://127.0.0.1:8265, unencrypted)\n"
    )


def test_an_unknown_algorithm_is_one_line_before_tensorflow_loads():
    """The registry names the known algorithms without loading any (nor TensorFlow, the
    seconds of a training command's start), so a typo is answered at once."""
    script = (
        "import sys\n"
        "from policy_service.cli.commands import main\n"
        "status = main(['train', 'ppoo', '--env', 'CartPole-v1'])\n"
        "print(status, 'tensorflow' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr.strip().splitlines() == [
        f"policy-service: error: unknown algorithm 'ppoo'; known algorithms: {sorted(ALGORITHMS)}"
    ]
