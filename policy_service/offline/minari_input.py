"""Minari datasets as `input`: "minari:<dataset id>" (e.g. "minari:D4RL/door/human-v2").

    policy-service train bc --input minari:cartpole/expert-v0 --env CartPole-v1

The dataset is read from the local Minari store (MINARI_DATASETS_PATH, else
~/.minari/datasets: `minari download ID` fills it where the network allows) with the
`minari` extra installed, converted once to Parquet beside a manifest of the dataset's
spaces (each episode's T steps: obs = observations[:-1], new_obs = observations[1:],
actions, rewards, terminateds, truncateds, eps_id = the episode id, t), and from then
on read as any input. The converted copy lives under MINARI_CACHE (by dataset id and
its size, so a dataset downloaded again is converted again), written under a temp
name and renamed into place. Minari logs no behaviour probabilities: the estimators
that need action_logp refuse such data in one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from policy_service.data.sample_batch import SampleBatch
from policy_service.offline.batches import DEFAULT_POLICY_ID
from policy_service.offline.columns import OfflineDataError
from policy_service.offline.manifest import MANIFEST

PREFIX = "minari:"
MINARI_CACHE = Path(
    os.environ.get(
        "POLICY_SERVICE_MINARI_CACHE", Path.home() / ".cache" / "policy_service" / "minari"
    )
)


def is_minari(entry: Any) -> bool:
    return isinstance(entry, str) and entry.startswith(PREFIX)


def _tree_rows(value: Any, rows: slice) -> Any:
    if isinstance(value, dict):
        return {k: _tree_rows(v, rows) for k, v in value.items()}
    if isinstance(value, tuple | list) and not isinstance(value, np.ndarray):
        return tuple(_tree_rows(v, rows) for v in value)
    return np.asarray(value)[rows]


def minari_directory(entry: str, name: str = "input") -> Path:
    """The Parquet directory of the Minari dataset `entry` ("minari:<id>") names,
    converted on first use; one line naming `name` and the dataset when it cannot be."""
    dataset_id = entry[len(PREFIX) :]
    try:
        import minari  # type: ignore[import-untyped]
    except ImportError:
        raise OfflineDataError(
            f"{name} {entry}: reading Minari datasets needs the minari extra "
            "(pip install 'policy-service[minari]')"
        ) from None
    if dataset_id not in minari.list_local_datasets():
        store = os.environ.get("MINARI_DATASETS_PATH", "~/.minari/datasets")
        raise OfflineDataError(
            f"{name} {entry}: no such dataset in the local Minari store ({store}); "
            f"`minari download {dataset_id}` fetches it where the network allows"
        )
    dataset = minari.load_dataset(dataset_id)
    key = hashlib.sha256(
        f"{dataset_id}|{dataset.total_episodes}|{dataset.total_steps}".encode()
    ).hexdigest()[:12]
    target = MINARI_CACHE / f"{dataset_id.replace('/', '--')}-{key}"
    if (target / DEFAULT_POLICY_ID / MANIFEST).is_file():
        return target
    _convert(dataset, target)
    return target


def _convert(dataset: Any, target: Path) -> None:
    from policy_service.offline.parquet_writer import ParquetExperienceWriter

    spaces = {DEFAULT_POLICY_ID: (dataset.spec.observation_space, dataset.spec.action_space)}
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with ParquetExperienceWriter(temp, spaces) as writer:
            for episode in dataset.iterate_episodes():
                steps = len(episode.rewards)
                if not steps:
                    continue
                writer.write(
                    SampleBatch(
                        {
                            SampleBatch.OBS: _tree_rows(episode.observations, slice(0, steps)),
                            SampleBatch.NEXT_OBS: _tree_rows(
                                episode.observations, slice(1, steps + 1)
                            ),
                            SampleBatch.ACTIONS: _tree_rows(episode.actions, slice(0, steps)),
                            SampleBatch.REWARDS: np.asarray(episode.rewards, np.float32),
                            SampleBatch.TERMINATEDS: np.asarray(episode.terminations, bool),
                            SampleBatch.TRUNCATEDS: np.asarray(episode.truncations, bool),
                            SampleBatch.EPS_ID: np.full(steps, int(episode.id), np.int64),
                            SampleBatch.T: np.arange(steps, dtype=np.int64),
                        }
                    )
                )
        os.replace(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
