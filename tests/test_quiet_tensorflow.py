"""quiet_tensorflow: TensorFlow's start-up lines kept off stderr in this process and in
every Ray worker that start_ray starts, below TF_CPP_MIN_LOG_LEVEL only, everything
shown when the import fails."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from policy_service.distributed import quiet_tensorflow
from policy_service.distributed.quiet_tensorflow import QuietImport, without_startup_lines

REPO = Path(__file__).resolve().parents[1]
# what TF 2.21 wrote while being imported here (CPU machine, TF_CPP_MIN_LOG_LEVEL=0)
STARTUP = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1796541707.438340    3122 port.cc:153] oneDNN custom operations are on.\n"
    "I0000 00:00:1796541707.438628    3122 cudart_stub.cc:31] Could not find cuda drivers "
    "on your machine, GPU will not be used.\n"
)
WARNING_LINE = "W0000 00:00:1796541707.5    3122 gpu_device.cc:2] Cannot dlopen GPU libraries.\n"
ERROR_LINE = "E0000 00:00:1796541707.6    3122 cuda_fft.cc:467] Unable to register cuFFT factory\n"
PYTHON_LINE = "/x/y.py:3: UserWarning: a warning of Python's own\n"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_the_level_decides_which_native_lines_go():
    text = STARTUP + WARNING_LINE + ERROR_LINE + PYTHON_LINE
    assert without_startup_lines(text, 0) == text
    assert without_startup_lines(text, 1) == WARNING_LINE + ERROR_LINE + PYTHON_LINE
    assert without_startup_lines(text, 2) == ERROR_LINE + PYTHON_LINE
    assert without_startup_lines(text, 3) == PYTHON_LINE


def noisy_module(tmp_path: Path, monkeypatch, name: str, fails: bool = False) -> str:
    """A module that writes native start-up lines and a Python line to fd 2 as it is
    imported (and then raises, if `fails`)."""
    body = f"""
        import os
        os.write(2, {(STARTUP + PYTHON_LINE).encode()!r})
        if {fails}:
            raise ImportError("the noisy module failed")
    """
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_the_import_hook_keeps_only_lines_that_are_not_start_up_lines(tmp_path, monkeypatch, capfd):
    name = noisy_module(tmp_path, monkeypatch, "noisy_ok")
    QuietImport.install(name)
    __import__(name)
    assert capfd.readouterr().err == PYTHON_LINE
    assert not any(isinstance(f, QuietImport) for f in sys.meta_path)  # used once, gone
    assert sys.modules[name].__loader__.__class__.__name__ == "SourceFileLoader"


def test_an_import_that_fails_shows_everything_it_wrote(tmp_path, monkeypatch, capfd):
    name = noisy_module(tmp_path, monkeypatch, "noisy_fails", fails=True)
    QuietImport.install(name)
    with pytest.raises(ImportError, match="the noisy module failed"):
        __import__(name)
    assert capfd.readouterr().err == STARTUP + PYTHON_LINE


def test_import_quietly_filters_and_level_0_shows_all(tmp_path, monkeypatch, capfd):
    quiet_tensorflow.import_quietly(noisy_module(tmp_path, monkeypatch, "noisy_quiet"))
    assert capfd.readouterr().err == PYTHON_LINE
    name = noisy_module(tmp_path, monkeypatch, "noisy_loud")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    quiet_tensorflow.import_quietly(name)
    assert capfd.readouterr().err == STARTUP + PYTHON_LINE


@pytest.mark.parametrize("through", ["import_quietly", "the import hook"])
def test_what_the_import_made_is_frozen_out_of_the_collectors_way(through, tmp_path, monkeypatch):
    name = noisy_module(tmp_path, monkeypatch, f"noisy_{through.replace(' ', '_')}")
    with open(tmp_path / f"{name}.py", "a") as module:
        module.write("MADE = [[]]\n")  # an object the cycle collector tracks
    if through == "import_quietly":
        quiet_tensorflow.import_quietly(name)
    else:
        QuietImport.install(name)
        __import__(name)
    made = sys.modules[name].MADE
    assert not any(obj is made for obj in gc.get_objects())  # frozen: no collection sees it
    after = [[]]
    assert any(obj is after for obj in gc.get_objects())  # what comes later is collected


def test_workers_get_the_hook_and_the_level_unless_the_job_sets_them(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert quiet_tensorflow.worker_runtime_env() == {
        "worker_process_setup_hook": "policy_service.distributed.quiet_tensorflow."
        "install_in_worker",
        "env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"},
    }
    job = {"runtime_env": {"worker_process_setup_hook": "mine.hook", "env_vars": {"X": "1"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert quiet_tensorflow.worker_runtime_env() == {"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}}
    job["runtime_env"]["env_vars"] = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert quiet_tensorflow.worker_runtime_env() == {}  # Ray would refuse the same keys


def test_a_local_rays_workers_get_the_hook_from_the_environment_while_it_starts(monkeypatch):
    monkeypatch.delenv(quiet_tensorflow.SETUP_HOOK_ENV, raising=False)
    with quiet_tensorflow.hook_in_local_workers():
        assert os.environ[quiet_tensorflow.SETUP_HOOK_ENV] == quiet_tensorflow.SETUP_HOOK
    assert quiet_tensorflow.SETUP_HOOK_ENV not in os.environ  # this process: as before
    monkeypatch.setenv(quiet_tensorflow.SETUP_HOOK_ENV, "mine.hook")
    with quiet_tensorflow.hook_in_local_workers():
        assert os.environ[quiet_tensorflow.SETUP_HOOK_ENV] == "mine.hook"
    assert os.environ[quiet_tensorflow.SETUP_HOOK_ENV] == "mine.hook"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    environ.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # a Ray started in a child process, a worker importing TensorFlow: ~30 s
def test_a_ray_worker_started_by_start_ray_imports_tensorflow_quietly():
    ray_tmp = tempfile.mkdtemp(prefix="psq", dir="/tmp")  # short: Ray's socket paths
    try:
        done = run_python(
            """
        import ray
        from policy_service.distributed.ray_runtime import start_ray

        start_ray(num_cpus=1)

        @ray.remote(num_cpus=0)
        def tensorflow_version():
            import tensorflow as tf
            return tf.__version__

        print("version", ray.get(tensorflow_version.remote()))
        ray.shutdown()
        """,
            TF_CPP_MIN_LOG_LEVEL="3",
            RAY_TMPDIR=ray_tmp,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "version 2." in done.stdout, output[-3000:]
    assert [line for line in output.splitlines() if _is_startup_line(line)] == []


def _is_startup_line(line: str) -> bool:
    """A native start-up line, also as Ray shows a worker's: "(pid=12) I0000 ..."."""
    text = re.sub(r"^\([^)]*\)\s*", "", ANSI.sub("", line))
    return without_startup_lines(text + "\n", 3) == ""
