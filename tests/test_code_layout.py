"""The code keeps its layers and its modules' privacy (read from the source).

- No module imports another module's private name (`from m import _x`, `m._x`).
- Imports point down: policy_service never imports algorithms or benchmarks
  (its command line, policy_service.cli, may import algorithms); the engine and
  I/O never import the Ray side or the policy. No two modules import each other,
  however indirectly.
- An install adds exactly the packages `policy_service` and `algorithms`.
- `policy-service submit` does not import TensorFlow, nor does what an env runner acting
  through a PolicyActor loads.
"""

import ast
import importlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("policy_service", "algorithms", "scripts", "benchmarks")
INSTALLED = ("algorithms", "policy_service")


def modules(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py"))


def project_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, imported name or None) for every import of a project module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in PACKAGES:
                found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES
            ]
    return found


def private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    aliases, uses = set(), []
    for line, module, name in project_imports(path):
        if name is not None and name.startswith("_") and not name.startswith("__"):
            uses.append(f"{line}: from {module} import {name}")
        if name is None:
            aliases.add(module.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in PACKAGES
        ):
            aliases.update(a.asname or a.name for a in node.names)
        if isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            uses.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return uses


@pytest.mark.parametrize("path", modules(*PACKAGES), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_uses_another_modules_private_names(path):
    assert private_uses(path) == []


# The packages of policy_service, bottom to top where it matters: data (batches, spaces)
# is the floor above the root's config and errors; the engine and the returns math sit
# on data; I/O on both; the policy on the engine and I/O; the Ray side above the policy.
SUBPACKAGES = (
    "data",
    "engine",
    "returns",
    "io",
    "policy",
    "envs",
    "replay",
    "client",
    "runs",
    "distributed",
    "multi_agent",
    "offline",
    "serving",
    "cli",
)


def above(*allowed: str) -> tuple[str, ...]:
    """Every subpackage but `allowed`: what a package low in the stack must not import."""
    return tuple(f"policy_service.{p}" for p in SUBPACKAGES if p not in allowed)


# (modules under this prefix, module prefixes they must not import)
LAYERS = [
    ("policy_service", ("algorithms", "scripts", "benchmarks")),
    ("policy_service.cli", ("scripts", "benchmarks")),
    # the algorithms reach the serving side only through a registered runner type
    ("algorithms", ("policy_service.cli", "policy_service.serving", "scripts", "benchmarks")),
    ("policy_service.data", above()),
    ("policy_service.engine", above("data")),
    ("policy_service.returns", above("data")),
    ("policy_service.io", above("data", "engine")),
    ("policy_service.policy", above("data", "engine", "returns", "io")),
    ("policy_service.envs", above("data")),
    ("policy_service.replay", above("data")),
    # a client process holds no policy and no Ray
    ("policy_service.client", above("data", "io")),
    ("policy_service.runs", above("data", "io")),
    # env runners write what they act on (offline.output: below them, it imports no Ray side)
    (
        "policy_service.distributed",
        above("data", "engine", "returns", "io", "policy", "runs", "offline", "multi_agent"),
    ),
    # multi-agent envs, policies and the sampler: below the Ray side that runs them
    (
        "policy_service.multi_agent",
        above("data", "engine", "returns", "io", "policy", "runs"),
    ),
    # experiences on disk are data: written and read without the Ray side or the policy
    (
        "policy_service.offline",
        above("data", "engine", "returns", "io", "replay", "multi_agent"),
    ),
]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("layer, forbidden", LAYERS, ids=[layer for layer, _ in LAYERS])
def test_imports_point_down(layer, forbidden):
    wrong = []
    for path in modules(layer.replace(".", "/")):
        if layer == "policy_service" and module_name(path).startswith("policy_service.cli"):
            continue  # the command line sits above both packages (its own layer below)
        for line, module, name in project_imports(path):
            target = module if name is None else f"{module}.{name}"
            if layer != "policy_service" and (target + ".").startswith(layer + "."):
                continue  # within its own package
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                wrong.append(f"{module_name(path)}:{line} imports {target}")
    assert wrong == []


def method_calls(path: Path, name: str, nargs: int | None = None) -> list[str]:
    """Lines of `path` that call a method named `name` (`x.name(...)`), with `nargs`
    positional arguments when given."""
    return [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and (nargs is None or len(node.args) + len(node.keywords) == nargs)
    ]


def test_the_command_line_holds_no_run_loop():
    """`train` parses arguments and calls fit() (algorithms/run.py): no module of the
    command line calls an algorithm's train() or writes a run's progress itself."""
    calls = [
        call
        for path in modules("policy_service/cli")
        for name, nargs in (("train", 0), ("append_progress", None), ("write_result", None))
        for call in method_calls(path, name, nargs)
    ]
    assert calls == []


def test_the_checks_catch_a_private_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from policy_service.data.sample_batch import _take\n"
        "from policy_service import models\nmodels._CUSTOM_MODELS\n"
    )
    assert private_uses(sample) == [
        "1: from policy_service.data.sample_batch import _take",
        "3: models._CUSTOM_MODELS",
    ]


SUBMIT_WITHOUT_TENSORFLOW = """
import sys
from policy_service.cli import commands as cli
from policy_service.distributed import jobs
jobs.run_job = lambda *args, **kwargs: 0  # the path up to the cluster, not the cluster
assert cli.main(["submit", "--address", "http://127.0.0.1:9", "--", "true"]) == 0
print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
"""


def printed_in_a_fresh_process(script: str) -> str:
    """What `script` prints, run in a new interpreter at the repository's root."""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def test_submit_does_not_import_tensorflow():
    assert printed_in_a_fresh_process(SUBMIT_WITHOUT_TENSORFLOW) == "[]"


# what an env runner acting through a PolicyActor loads: its own modules and, with the
# actor's handle, the actor's class (restarts.RecordedPolicyActor, or a MultiPolicyActor's)
ACTING_THROUGH_AN_ACTOR = (
    "policy_service.distributed.rollout_worker",
    "policy_service.distributed.lazy_policy_class",
    "policy_service.distributed.restarts",
    "policy_service.distributed.policy_actor",
    "policy_service.distributed.multi_policy_actor",
    "policy_service.engine.devices",
)


def test_an_env_runner_acting_through_an_actor_imports_no_tensorflow():
    imports = "".join(f"import {module}\n" for module in ACTING_THROUGH_AN_ACTOR)
    probe = 'import sys\nprint(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))'
    assert printed_in_a_fresh_process(imports + probe) == "[]"


def import_graph(*roots: str) -> dict[str, set[str]]:
    """module -> the project modules it imports (at module level or inside a function):
    `from package import name` counts as importing the submodule when there is one."""
    known = {module_name(path) for path in modules(*roots)}
    graph = {}
    for path in modules(*roots):
        targets = set()
        for _, module, name in project_imports(path):
            submodule = f"{module}.{name}" if name else None
            target = submodule if submodule in known else module
            if target in known and target != module_name(path):
                targets.add(target)
        graph[module_name(path)] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that import each other (Tarjan's strongly
    connected components), each sorted."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle():
    assert import_circles(import_graph("policy_service", "algorithms")) == []


def test_the_circle_check_finds_one():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_install_adds_only_the_two_packages(tmp_path):
    """The wheel `pip install .` would install: its top-level names, and the console
    script's target. Built from a copy of the tree, so no build/ lands in the repo."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "runs", "build", "*.egg-info", "__pycache__", "results"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info",))}
    assert sorted(top) == list(INSTALLED)
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "policy-service = policy_service.cli.commands:main" in text


# The root's public import paths of modules that moved: each names the moved module.
FACADE = (
    "policy_service",
    "policy_service.sample_batch",
    "policy_service.sequencing",
    "policy_service.models",
    "policy_service.vtrace",
)


def package_of(module: str) -> str | None:
    """The package a module belongs to for the package graph: a subpackage of
    policy_service, "policy_service (root)" for the root's own modules (config, errors:
    the floor), None for the facade above everything."""
    parts = module.split(".")
    if parts[0] != "policy_service":
        return parts[0]
    if module in FACADE:
        return None
    return ".".join(parts[:2]) if (REPO / "/".join(parts[:2])).is_dir() else "policy_service (root)"


def package_graph() -> dict[str, set[str]]:
    """package -> the packages its modules import (the facade left out)."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph("policy_service", "algorithms").items():
        source = package_of(module)
        if source is None:
            continue
        graph.setdefault(source, set())
        for target in targets:
            package = package_of(target)
            if package is not None and package != source:
                graph[source].add(package)
    return graph


def test_no_package_level_circle():
    assert import_circles(package_graph()) == []


def test_the_roots_own_modules_are_the_floor():
    """config, config_rules and errors import no subpackage: every layer may use them."""
    assert package_graph()["policy_service (root)"] == set()


TEST_FILE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:tests\.)?(test_\w+)", re.MULTILINE)


def test_no_test_file_imports_another():
    """What several test files share lives in a helper module of tests/ (fakes, envs,
    learning_runs, ...): a test file imported by another runs its module-level setup
    twice, and its tests' names are not its own to change. A script a test file runs may
    import that same file."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for name in TEST_FILE_IMPORT.findall(path.read_text()):
            if name != path.stem:
                found.append(f"{path.relative_to(REPO)} imports {name}")
    assert found == []


def test_only_the_facade_imports_the_facade():
    """Inside the project, modules import a moved module from its package, not through
    the root's public path (which is for users)."""
    uses = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph("policy_service", "algorithms").items()
        if module not in FACADE
        for target in targets
        if target in FACADE[1:]
    )
    assert uses == []


# Every name of the public contract (docs/design.md, "Public API contract"), where users
# import it from: the same object wherever it now lives.
CONTRACT = {
    "policy_service.sample_batch.SampleBatch": "policy_service.data.sample_batch.SampleBatch",
    "policy_service.sample_batch.concat_samples": (
        "policy_service.data.sample_batch.concat_samples"
    ),
    "policy_service.sequencing.chop_into_sequences": (
        "policy_service.data.sequencing.chop_into_sequences"
    ),
    "policy_service.models.register_custom_model": (
        "policy_service.policy.models.register_custom_model"
    ),
    "policy_service.vtrace.from_importance_weights": (
        "policy_service.returns.vtrace.from_importance_weights"
    ),
    "policy_service.client.PolicyClient": "policy_service.client.policy_client.PolicyClient",
    "policy_service.policy.TFPolicy": "policy_service.policy.tf_policy.TFPolicy",
    "policy_service.TFPolicy": "policy_service.policy.tf_policy.TFPolicy",
    "policy_service.SampleBatch": "policy_service.data.sample_batch.SampleBatch",
    "policy_service.masked_mean": "policy_service.engine.reductions.masked_mean",
    "policy_service.PolicyActor": "policy_service.distributed.policy_actor.PolicyActor",
    "policy_service.LearnerGroup": "policy_service.distributed.learner_group.LearnerGroup",
    "policy_service.MultiAgentEnv": "policy_service.multi_agent.env.MultiAgentEnv",
    "policy_service.MultiAgentBatch": "policy_service.multi_agent.batch.MultiAgentBatch",
    "policy_service.PolicySpec": "policy_service.policy.policy_spec.PolicySpec",
    "policy_service.Callbacks": "policy_service.runs.callbacks.Callbacks",
    "policy_service.MetricsLogger": "policy_service.runs.metrics_logger.MetricsLogger",
    "policy_service.LossExtras": "policy_service.engine.loss_output.LossExtras",
    "policy_service.LossGroup": "policy_service.engine.loss_groups.LossGroup",
    "algorithms.run.fit": "algorithms.run.fit",
}


def resolve(path: str):
    """The object a dotted path names, imported the way a user's `from m import n` would."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("public, home", CONTRACT.items(), ids=list(CONTRACT))
def test_every_public_import_path_still_imports(public, home):
    assert resolve(public) is resolve(home)


def test_every_path_the_design_names_imports():
    """The contract as the design document writes it (beside this checkout when it is)."""
    design = REPO.parent / "shared" / "DESIGN.md"
    if not design.exists():
        pytest.skip("the design document is not beside this checkout")
    named = sorted(set(re.findall(r"`(policy_service(?:\.\w+)+)", design.read_text())))
    assert len(named) >= 10
    for path in named:
        try:
            importlib.import_module(path)
        except ImportError:
            resolve(path)
