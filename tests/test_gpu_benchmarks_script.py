"""scripts/gpu_benchmarks.sh without running a benchmark: what it does with no GPU,
and the sweep it plans for the GPUs `nvidia-smi -L` lists (NVIDIA_SMI stands in for
it, so these run the same on any host). The sweep itself: test_benchmarks.py (slow)."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "scripts" / "gpu_benchmarks.sh")


def _run(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", SCRIPT, *args, str(tmp_path / "out")],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _smi_listing(tmp_path, count: int) -> str:
    smi = tmp_path / "nvidia-smi"
    lines = "".join(
        f'echo "GPU {i}: NVIDIA A100-SXM4-80GB (UUID: GPU-{i})"\n' for i in range(count)
    )
    smi.write_text("#!/bin/sh\n" + lines)
    smi.chmod(0o755)
    return str(smi)


def test_no_gpu_says_so_and_exits_0_without_measuring(tmp_path):
    proc = _run(tmp_path, NVIDIA_SMI="false")
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "gpu_benchmarks.sh: no GPU found (nvidia-smi -L lists none), so there is nothing "
        "to measure on GPUs here; pass --fake-gpus to run the same sweep on fake GPUs"
    )
    assert not (tmp_path / "out").exists()


def test_three_gpus_give_one_to_three_learners_on_real_gpus(tmp_path):
    proc = _run(
        tmp_path, NVIDIA_SMI=_smi_listing(tmp_path, 3), DRY_RUN="1", BENCH_RAY_NUM_CPUS="12"
    )
    assert proc.returncode == 0, proc.stderr
    commands = [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]
    group, towers = [c for c in commands if "benchmarks.learner" in c]
    assert "--learners 1,2,3 --accumulate 1,4 --cpus-per-learner 4" in group
    assert "--real-gpus" in group and "--real-gpus" in towers
    assert "--towers 1,2 " in towers + " "  # 4 towers would need a 4th GPU
    assert not [c for c in commands if "benchmarks.e2e" in c]  # only with --all


def test_fake_gpus_run_the_same_sweep_on_the_cpu(tmp_path):
    proc = _run(
        tmp_path, "--fake-gpus", "--all", NVIDIA_SMI="false", DRY_RUN="1", BENCH_RAY_NUM_CPUS="2"
    )
    assert proc.returncode == 0, proc.stderr
    commands = [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]
    assert not [c for c in commands if "--real-gpus" in c]
    assert any("--learners 1,2 --accumulate 1,4 --cpus-per-learner 1" in c for c in commands)
    assert any("benchmarks.e2e" in c for c in commands)


def test_an_unknown_option_is_one_line_and_exit_2(tmp_path):
    proc = _run(tmp_path, "--fake-gpu", NVIDIA_SMI="false")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu_benchmarks.sh: unknown option --fake-gpu (see --help)"


# ----- which Python runs the benchmarks -----------------------------------------------------


def _elsewhere(tmp_path, python3: str | None, **env) -> subprocess.CompletedProcess:
    """The script copied into a project without .venv, with only `python3` (running
    `python3`, if given) and the shell's tools on PATH; a dry run on fake GPUs."""
    project, bin_dir = tmp_path / "project", tmp_path / "bin"
    (project / "scripts").mkdir(parents=True)
    bin_dir.mkdir()
    (project / "scripts" / "gpu_benchmarks.sh").write_text(Path(SCRIPT).read_text())
    if python3 is not None:  # a venv's python finds its packages only from its own path
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {python3} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
    return subprocess.run(
        ["bash", str(project / "scripts" / "gpu_benchmarks.sh"), "--fake-gpus", "out"],
        env={
            **os.environ,
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "NVIDIA_SMI": "false",
            "DRY_RUN": "1",
            "BENCH_RAY_NUM_CPUS": "2",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def _pythons(proc) -> set[str]:
    """The interpreters of the dry run's benchmark commands."""
    commands = [line.split() for line in proc.stderr.splitlines() if line.startswith("+ ")]
    return {c[1] for c in commands if "-m" in c}


def test_outside_a_venv_the_python3_on_path_that_imports_policy_service_runs_it(tmp_path):
    """Was exit 127: '.venv/bin/python: No such file or directory'."""
    python = REPO / ".venv" / "bin" / "python"
    proc = _elsewhere(tmp_path, str(python))
    assert proc.returncode == 0, proc.stderr
    assert _pythons(proc) == {str(tmp_path / "bin" / "python3")}


def test_python_names_the_interpreter(tmp_path):
    python = str(REPO / ".venv" / "bin" / "python")
    proc = _elsewhere(tmp_path, None, PYTHON=python)
    assert proc.returncode == 0, proc.stderr
    assert _pythons(proc) == {python}


def test_no_python_with_the_project_is_one_line_and_exit_2(tmp_path):
    proc = _elsewhere(tmp_path, "/bin/false")  # a python3 that cannot import policy_service
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_benchmarks.sh: no Python with policy_service found (no .venv/bin/python here, "
        "and python3 on PATH cannot import it); set PYTHON=/path/to/python"
    )
    bad = _elsewhere(tmp_path / "again", None, PYTHON="/nope/python")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "gpu_benchmarks.sh: PYTHON=/nope/python cannot run or cannot import policy_service; "
        "point PYTHON at the Python the project is installed in"
    )


def test_help_says_how_the_python_is_found():
    proc = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "PYTHON=path" in proc.stdout and "python3 on PATH" in proc.stdout
    assert "set -euo" not in proc.stdout  # the help ends where the comment does
