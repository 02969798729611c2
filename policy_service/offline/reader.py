"""Reading experiences: `input` (a directory, a glob, or a list of them and of files;
Parquet or RLlib's JSON lines, told by extension; "minari:<id>", a Minari dataset:
minari_input.py) -> batches of N rows per policy id.

`open_experiences` finds the files, reads their manifests and checks everything that
can be checked before any row is handed out: the files are there and readable, the
columns the caller needs are present, manifest spaces agree with spaces the caller
gives, and every logged action is inside its action space (for Parquet by reading the
action columns alone). Each problem is one line naming the file and the column.
`Experiences.iter_batches` then streams SampleBatches through a shuffle buffer, read in
process or, with `num_readers` > 0, by that many Ray Data read tasks: one API, two
sources of the same chunks.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from policy_service.data.sample_batch import SampleBatch
from policy_service.offline.batches import DEFAULT_POLICY_ID
from policy_service.offline.columns import (
    INFOS,
    LeafSpec,
    OfflineDataError,
    columns_from_leaves,
    leaf_from_arrow,
    leaf_specs,
    leaf_value,
    to_arrow,
)
from policy_service.offline.manifest import MANIFEST, PolicyData, differences, read_manifest
from policy_service.offline.minari_input import is_minari, minari_directory
from policy_service.offline.parquet_writer import PARQUET_SUFFIX
from policy_service.offline.read_position import PassPosition
from policy_service.offline.rllib_json import JSON_SUFFIX, parse_line
from policy_service.offline.shuffle import Rows, ShuffleBuffer
from policy_service.offline.space_checks import first_outside

if TYPE_CHECKING:  # Ray Data is heavy to import: only for a read through it
    from policy_service.offline.parquet_row_groups import StartedRead

REQUIRED_COLUMNS = (SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS)
CHUNK_ROWS = 8192  # rows read at a time from a file (or a Ray Data block)
CHECK_ROWS = 2**17  # rows of actions checked at a time when a dataset is opened
_GLOB_CHARS = set("*?[")


@dataclass
class PolicyDataset:
    """One policy's files (all Parquet or all JSON lines), spaces and stored columns."""

    policy_id: str
    format: str
    files: list[Path]
    data: PolicyData
    num_rows: int = 0

    @property
    def observation_space(self) -> gym.Space | None:
        return self.data.observation_space

    @property
    def action_space(self) -> gym.Space | None:
        return self.data.action_space


def _is_data_file(path: Path) -> bool:
    return (
        path.suffix in (PARQUET_SUFFIX, JSON_SUFFIX)
        and path.name != MANIFEST
        and not path.name.startswith((".", "_"))  # temp files of a writer at work
    )


def find_files(
    input: str | os.PathLike | Sequence[str | os.PathLike], name: str = "input"
) -> list[Path]:
    """The data files `input` names: directories searched recursively, globs expanded,
    files taken as given. Nothing found, or a named file missing, is an error naming
    `name` (how the caller's user wrote it, e.g. "config.input")."""
    entries = [input] if isinstance(input, str | os.PathLike) else list(input)
    found: list[Path] = []
    for entry in entries:
        text = os.fspath(entry)
        if is_minari(text):  # a Minari dataset, converted once to Parquet
            directory = minari_directory(text, name)
            found += sorted(p for p in directory.rglob("*") if p.is_file() and _is_data_file(p))
        elif _GLOB_CHARS & set(text):
            matches = [Path(m) for m in sorted(glob.glob(text, recursive=True))]
            found += [m for m in matches if m.is_file() and _is_data_file(m)]
        elif Path(text).is_dir():
            found += sorted(p for p in Path(text).rglob("*") if p.is_file() and _is_data_file(p))
        elif Path(text).is_file():
            if Path(text).suffix not in (PARQUET_SUFFIX, JSON_SUFFIX):
                raise OfflineDataError(f"{text}: expected a .parquet or .json file")
            found.append(Path(text))
        else:
            raise OfflineDataError(f"{name} {text}: no such file or directory")
    if not found:
        raise OfflineDataError(
            f"{name} {input}: no Parquet (.parquet) or JSON lines (.json) files found"
        )
    return list(dict.fromkeys(found))


class Experiences:
    """A checked dataset: policy id -> PolicyDataset. Use `iter_batches` to read it."""

    def __init__(self, policies: dict[str, PolicyDataset]) -> None:
        self.policies = policies

    @property
    def policy_ids(self) -> list[str]:
        return list(self.policies)

    def __getitem__(self, policy_id: str) -> PolicyDataset:
        if policy_id not in self.policies:
            raise OfflineDataError(f"no experiences of policy {policy_id!r}; have "
                                   f"{self.policy_ids}")  # fmt: skip
        return self.policies[policy_id]

    def iter_batches(
        self,
        batch_size: int,
        *,
        policy_id: str = DEFAULT_POLICY_ID,
        shuffle_buffer_size: int = 0,
        seed: int | None = None,
        num_readers: int = 0,
        row_filter: Callable[[SampleBatch], np.ndarray] | None = None,
        transform: Callable[[SampleBatch], SampleBatch] | None = None,
        resume: PassPosition | None = None,
    ) -> BatchStream:
        """One pass over `policy_id`'s rows as SampleBatches of `batch_size` rows (the
        last may be short). With a shuffle buffer, the file order is shuffled too and
        each batch is drawn from the buffered rows; `seed` makes it repeatable.
        `num_readers` > 0 reads through Ray Data with that many read tasks (in the
        order blocks arrive: a resumed read is exact only in process).
        `row_filter(chunk) -> bool mask` keeps rows, then `transform(chunk) -> batch`
        (e.g. postprocessing by episode) changes them, each on chunks in file order
        before the shuffle buffer. `resume`: go on from a BatchStream's `position()`
        (the same seed, batch size and shuffle buffer size)."""
        dataset = self[policy_id]
        rng, files, read = _start_pass(dataset, seed, shuffle_buffer_size, num_readers)
        return _batch_stream(dataset, files, rng, read, batch_size, shuffle_buffer_size,
                             num_readers, row_filter, transform, resume)  # fmt: skip

    def iter_passes(
        self,
        batch_size: int,
        *,
        seeds: Iterable[int | None],
        policy_id: str = DEFAULT_POLICY_ID,
        shuffle_buffer_size: int = 0,
        num_readers: int = 0,
        row_filter: Callable[[SampleBatch], np.ndarray] | None = None,
        transform: Callable[[SampleBatch], SampleBatch] | None = None,
        resume: PassPosition | None = None,
    ) -> Generator[BatchStream, None, None]:
        """Pass after pass, one per seed: each the BatchStream `iter_batches` gives for
        it (`resume`: the first's). Through Ray Data (Parquet, `num_readers` > 0) a
        pass's read starts when the pass before it is handed out, so that its fixed
        start (Ray Data's executor, the tasks' dispatch, the first blocks) overlaps that
        pass; its tasks wait for the CPUs the pass before holds. One pass is read ahead
        at most. A pass handed out is the caller's to close, as iter_batches' is, and is
        closed when the next is asked for; the read ahead is closed with the iterator
        (or when it is garbage collected)."""
        dataset = self[policy_id]
        upcoming = iter(seeds)
        seed = next(upcoming, _NO_SEED)
        ahead = None
        if seed is not _NO_SEED:
            ahead = _start_pass(dataset, seed, shuffle_buffer_size, num_readers)
        try:
            while ahead is not None:
                rng, files, read = ahead
                stream = _batch_stream(dataset, files, rng, read, batch_size,
                                       shuffle_buffer_size, num_readers, row_filter,
                                       transform, resume)  # fmt: skip
                resume, ahead = None, None
                seed = next(upcoming, _NO_SEED)
                if seed is not _NO_SEED:  # the next pass's read starts now
                    ahead = _start_pass(dataset, seed, shuffle_buffer_size, num_readers)
                yield stream
                stream.close()
        finally:
            if ahead is not None and ahead[2] is not None:
                ahead[2].close()


_NO_SEED = object()  # the seeds ended


def _start_pass(
    dataset: PolicyDataset, seed: Any, shuffle_buffer_size: int, num_readers: int
) -> tuple[np.random.Generator, list[Path], StartedRead | None]:
    """A pass's generator (file order, shuffle draws) and file order; through Ray Data
    (Parquet), its read, started."""
    rng = np.random.default_rng(seed)
    files = list(dataset.files)
    if shuffle_buffer_size:
        files = [files[i] for i in rng.permutation(len(files))]
    read = None
    if num_readers > 0 and dataset.format == "parquet":
        # only when asked: Ray Data is heavy to import
        from policy_service.offline.parquet_row_groups import StartedRead

        names = [s.name for s in dataset.data.columns]
        read = StartedRead([str(f) for f in files], names, num_readers, CHUNK_ROWS)
    return rng, files, read


def _batch_stream(
    dataset: PolicyDataset,
    files: list[Path],
    rng: np.random.Generator,
    read: StartedRead | None,
    batch_size: int,
    shuffle_buffer_size: int,
    num_readers: int,
    row_filter: Callable[[SampleBatch], np.ndarray] | None,
    transform: Callable[[SampleBatch], SampleBatch] | None,
    resume: PassPosition | None,
) -> BatchStream:
    """One pass over `files` in this order (iter_batches): its chunks from `read`, from
    Ray Data's JSON read or from this process, then the shuffle buffer."""
    if read is not None:
        chunks = _ray_parquet_chunks(read, dataset.data.columns, f"{len(files)} Parquet files")
    elif num_readers > 0:
        chunks = _ray_json_chunks(files, dataset, num_readers)
    elif dataset.format == "parquet":
        chunks = _parquet_chunks(files, dataset.data.columns)
    else:
        chunks = _json_chunks(files, dataset)
    counted = CountedChunks(chunks)
    buffer = ShuffleBuffer(batch_size, shuffle_buffer_size, rng)
    if resume is not None:
        counted.skip(resume.chunks_read, str(files[0].parent))
        rng.bit_generator.state = resume.rng_state
        buffer.restore(resume.ready, resume.held)
    changed: Iterator[Rows] = counted
    if row_filter is not None or transform is not None:
        changed = _changed_chunks(counted, row_filter, transform, str(files[0].parent))
    ended = resume is not None and resume.ended
    return BatchStream(changed, counted, buffer, ended=ended, read=read)


class CountedChunks:
    """Chunks of rows, counted as they are taken (a read position's place in a pass)."""

    def __init__(self, chunks: Iterator[Rows]) -> None:
        self.chunks = chunks
        self.count = 0

    def __iter__(self) -> Iterator[Rows]:
        return self

    def __next__(self) -> Rows:
        chunk = next(self.chunks)
        self.count += 1
        return chunk

    def skip(self, count: int, where: str) -> None:
        """Read past `count` chunks (a resumed pass's, kept or trained on already)."""
        for _ in range(count):
            if next(self, None) is None:
                raise OfflineDataError(
                    f"{where}: the files end before the resumed read position ({count} "
                    f"chunks of {CHUNK_ROWS} rows): resume with the input the run read"
                )

    def close(self) -> None:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()


class BatchStream:
    """One pass's SampleBatches (an iterator), and where it stands between two of them
    (`position`, a PassPosition) for a read that goes on later."""

    def __init__(
        self,
        chunks: Iterator[Rows],
        counted: CountedChunks,
        buffer: ShuffleBuffer,
        ended: bool = False,
        read: StartedRead | None = None,
    ) -> None:
        self._chunks = chunks
        self._counted = counted
        self._buffer = buffer
        self._ended = ended
        self._read = read  # Ray Data's execution, stopped by close()

    def __iter__(self) -> Iterator[SampleBatch]:
        return self

    def __next__(self) -> SampleBatch:
        while not self._buffer.ready:
            if self._ended:
                raise StopIteration
            chunk = next(self._chunks, None)
            if chunk is None:
                self._buffer.drain()
                self._ended = True
            else:
                self._buffer.add(chunk)
        # leaves of one count, dtypes and shapes as stored: checked where they were read
        return SampleBatch.from_checked_rows(columns_from_leaves(self._buffer.ready.pop(0)))

    def position(self) -> PassPosition:
        return PassPosition(
            self._counted.count,
            dict(self._buffer.rng.bit_generator.state),
            self._ended,
            list(self._buffer.ready),
            self._buffer.held_rows(),
        )

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        self._counted.close()
        if self._read is not None:
            self._read.close()


def _changed_chunks(
    chunks: Iterable[Rows],
    row_filter: Callable[[SampleBatch], np.ndarray] | None,
    transform: Callable[[SampleBatch], SampleBatch] | None,
    where: str,
) -> Iterator[Rows]:
    """Each chunk as a SampleBatch, filtered and transformed, back as leaves (a
    transform may add columns: they are stored leaves from then on)."""
    for chunk in chunks:
        batch = SampleBatch.from_checked_rows(columns_from_leaves(chunk))
        if row_filter is not None:
            keep = np.asarray(row_filter(batch), bool)
            if not keep.all():
                chunk = {spec: _rows_of(leaf, keep) for spec, leaf in chunk.items()}
                batch = SampleBatch.from_checked_rows(columns_from_leaves(chunk))
        if not batch.count:
            continue
        if transform is not None:
            batch = transform(batch)
            chunk = {spec: leaf_value(batch, spec) for spec in leaf_specs(batch, where)}
        yield chunk


def _rows_of(leaf: Any, keep: np.ndarray) -> Any:
    return [x for x, k in zip(leaf, keep) if k] if isinstance(leaf, list) else leaf[keep]


def open_experiences(
    input: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    spaces: Mapping[str, tuple[gym.Space | None, gym.Space | None]] | None = None,
    require: Iterable[str] = (),
    name: str = "input",
) -> Experiences:
    """The experiences `input` names, checked whole before any row is read.

    `spaces`: policy id -> (observation space, action space) the caller trains with;
    they must agree with the manifest's, and stand in where there is none (RLlib's own
    JSON files). `require`: columns needed beyond obs, actions and rewards (e.g.
    "action_logp" for MARWIL or an estimator)."""
    required = tuple(dict.fromkeys((*REQUIRED_COLUMNS, *require)))
    given = dict(spaces or {})
    files = find_files(input, name)
    policies: dict[str, PolicyDataset] = {}
    for path in files:
        if path.suffix == PARQUET_SUFFIX:
            _add_parquet(policies, path, given)
        else:
            _add_json(policies, path, given, required)
    for dataset in policies.values():
        _check_observation_shape(dataset)
        if dataset.format == "parquet":
            _check_parquet(dataset, required)
    return Experiences(policies)


def _check_observation_shape(dataset: PolicyDataset) -> None:
    """A Box observation space's shape against the stored obs rows' shape."""
    space = dataset.observation_space
    if not isinstance(space, gym.spaces.Box):
        return
    for spec in dataset.data.columns:
        if spec.path in ((SampleBatch.OBS,), (SampleBatch.NEXT_OBS,)) and spec.shape != space.shape:
            raise OfflineDataError(
                f"{dataset.files[0]}: column {spec.name!r}: rows of shape {list(spec.shape)}, "
                f"observation_space {space} has shape {list(space.shape)}"
            )


def _manifest_data(manifest_path: Path, given: Mapping) -> dict[str, PolicyData]:
    manifest = read_manifest(manifest_path)
    for pid, data in manifest.policies.items():
        if pid in given:
            problem = differences(manifest_path, pid, data, PolicyData(*given[pid]))
            if problem:
                raise OfflineDataError(problem)
    return manifest.policies


def _dataset(policies: dict, pid: str, fmt: str, data: PolicyData, path: Path) -> PolicyDataset:
    if pid not in policies:
        policies[pid] = PolicyDataset(pid, fmt, [], data)
    dataset = policies[pid]
    if dataset.format != fmt:
        raise OfflineDataError(f"{path}: policy {pid!r} has {dataset.format} files too; "
                               "read one format at a time")  # fmt: skip
    problem = differences(path, pid, dataset.data, data)
    if problem:
        raise OfflineDataError(f"{problem} (beside {dataset.files[0]})")
    dataset.files.append(path)
    return dataset


def _add_parquet(policies: dict, path: Path, given: Mapping) -> None:
    manifest_path = path.parent / MANIFEST
    if not manifest_path.is_file():
        raise OfflineDataError(f"{path}: no {MANIFEST} beside it (its spaces and columns)")
    manifest = _manifest_data(manifest_path, given)
    if len(manifest) != 1:
        raise OfflineDataError(f"{manifest_path}: expected one policy beside Parquet files, "
                               f"got {sorted(manifest)}")  # fmt: skip
    ((pid, data),) = manifest.items()
    try:
        metadata = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError) as err:
        raise OfflineDataError(_unreadable(path, [], err)) from None
    dataset = _dataset(policies, pid, "parquet", data, path)
    dataset.num_rows += metadata.num_rows


def _check_parquet(dataset: PolicyDataset, required: tuple[str, ...]) -> None:
    stored = {spec.path[0] for spec in dataset.data.columns}
    action_specs = [s for s in dataset.data.columns if s.path[0] == SampleBatch.ACTIONS]
    for path in dataset.files:
        for column in required:
            if column not in stored:
                raise OfflineDataError(f"{path}: column {column!r} missing (required)")
        schema = pq.ParquetFile(path).schema_arrow
        for spec in dataset.data.columns:
            if spec.name not in schema.names:
                raise OfflineDataError(f"{path}: column {spec.name!r} missing (in {MANIFEST})")
        if dataset.action_space is not None:
            offset = 0  # rows of the file before this chunk
            for leaves in _parquet_chunks([path], action_specs, CHECK_ROWS):
                columns = columns_from_leaves(leaves)
                _check_actions(path, dataset.action_space, columns, offset)
                offset += len(next(iter(leaves.values())))


def _check_actions(
    where: Any, space: gym.Space, columns: Mapping[str, Any], offset: int = 0
) -> None:
    hit = first_outside(space, columns[SampleBatch.ACTIONS])
    if hit is not None:
        row, action = offset + hit[0], hit[1]
        action = action.tolist() if isinstance(action, np.ndarray | np.generic) else action
        raise OfflineDataError(
            f"{where}: column 'actions': row {row} holds {action!r}, outside {space}"
        )


def _parquet_chunks(
    files: list[Path], specs: list[LeafSpec], rows: int = CHUNK_ROWS
) -> Iterator[Rows]:
    names = [s.name for s in specs]
    for path in files:
        try:
            for record_batch in pq.ParquetFile(path).iter_batches(rows, columns=names):
                yield _leaves(record_batch, specs, path)
        except (pa.ArrowException, OSError) as err:
            raise OfflineDataError(_unreadable(path, names, err)) from None


def _unreadable(path: Path, names: list[str], err: BaseException) -> str:
    """One line naming the file and, when one column alone fails to read (a corrupt
    page under an intact footer), that column."""
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    for name in names:
        try:
            pq.ParquetFile(path).read(columns=[name])
        except (pa.ArrowException, OSError):
            return f"{path}: column {name!r}: not readable ({first_line})"
    return f"{path}: not a readable Parquet file ({first_line})"


def _leaves(table: pa.RecordBatch | pa.Table, specs: list[LeafSpec], where: Any) -> Rows:
    return {spec: leaf_from_arrow(_one_array(table.column(spec.name)), spec, str(where))
            for spec in specs}  # fmt: skip


def _one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A column of one chunk as that chunk (combining even one chunk copies it)."""
    if isinstance(column, pa.ChunkedArray) and column.num_chunks == 1:
        return column.chunk(0)
    return column


def _ray_parquet_chunks(
    blocks: Iterable[pa.Table], specs: list[LeafSpec], where: str
) -> Iterator[Rows]:
    """Ray Data's blocks (parquet_row_groups.py's read tasks, each streaming its share
    of the files' row groups), a block's columns turned into arrays once (views where
    Arrow allows), then cut into chunks by views."""
    grid = 0  # rows handed out, modulo CHUNK_ROWS
    for block in blocks:
        for batch in block.to_batches():  # one, unless Ray merged or cut blocks
            leaves = _leaves(batch, specs, where)
            start = 0
            while start < batch.num_rows:
                # chunks end on multiples of CHUNK_ROWS rows of the whole stream, also
                # after a short block: batches of a divisor of it stay views of one chunk
                stop = min(batch.num_rows, start + CHUNK_ROWS - grid)
                yield {spec: leaf[start:stop] for spec, leaf in leaves.items()}
                grid = (grid + stop - start) % CHUNK_ROWS
                start = stop


# --------------------------------------------------------------------------------------
# RLlib's JSON lines
# --------------------------------------------------------------------------------------


def _json_lines(path: Path) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield f"{path} line {number}", line


def _add_json(policies: dict, path: Path, given: Mapping, required: tuple[str, ...]) -> None:
    """Parse the whole file once: columns, row counts and actions checked up front.
    Without a manifest, a policy's columns are those every one of its lines holds."""
    manifest_path = path.parent / MANIFEST
    manifest = _manifest_data(manifest_path, given) if manifest_path.is_file() else {}
    found: dict[str, PolicyData] = {}
    rows: dict[str, int] = {}
    for where, line in _json_lines(path):
        for pid, columns in parse_line(line, where).items():
            for column in required:
                if column not in columns:
                    raise OfflineDataError(f"{where}: column {column!r} missing (required)")
            data = manifest.get(pid) or PolicyData(*given.get(pid, (None, None)))
            specs = data.columns or leaf_specs(columns, where)
            leaves = _json_leaves(columns, specs, data.action_space, where)
            rows[pid] = rows.get(pid, 0) + len(next(iter(leaves.values())))
            if pid not in found:
                found[pid] = PolicyData(data.observation_space, data.action_space, specs,
                                        data.weights_version)  # fmt: skip
            elif not data.columns:  # no manifest: keep the columns every line holds
                found[pid].columns = [s for s in found[pid].columns if s in specs]
    for pid, data in found.items():
        _dataset(policies, pid, "rllib_json", data, path).num_rows += rows[pid]


def _json_leaves(
    columns: Mapping[str, Any], specs: list[LeafSpec], space: gym.Space | None, where: str
) -> Rows:
    """One line's rows of a policy as the leaves `specs` name, in their dtypes; every
    leaf must be there, with one count of rows, and actions inside `space`."""
    leaves: Rows = {}
    for spec in specs:
        try:
            value = leaf_value(columns, spec)
        except (KeyError, IndexError, TypeError):
            raise OfflineDataError(f"{where}: column {spec.name!r} missing") from None
        if spec.name != INFOS:
            value = np.asarray(value)
            if value.shape[1:] != spec.shape or not np.can_cast(
                value.dtype, np.dtype(spec.dtype), "same_kind"
            ):
                raise OfflineDataError(
                    f"{where}: column {spec.name!r}: expected rows of {spec.describe()}, "
                    f"got {value.dtype}{list(value.shape[1:])}"
                )
            value = value.astype(spec.dtype, copy=False)
        leaves[spec] = value
    counts = {spec.name: len(v) for spec, v in leaves.items()}
    if len(set(counts.values())) > 1:
        raise OfflineDataError(f"{where}: columns of different row counts {counts}")
    if space is not None and SampleBatch.ACTIONS in columns:
        _check_actions(where, space, columns)
    return leaves


def _json_chunks(files: list[Path], dataset: PolicyDataset) -> Iterator[Rows]:
    for path in files:
        for where, line in _json_lines(path):
            columns = parse_line(line, where).get(dataset.policy_id)
            if columns is not None:
                yield _json_leaves(columns, dataset.data.columns, dataset.action_space, where)


def json_lines_to_arrow(
    lines: pa.Table, policy_id: str, specs: list[LeafSpec], where: str
) -> pa.Table:
    """Ray Data lines of text (column "text") -> `policy_id`'s rows in the stored
    Arrow layout of `specs`: parsed, unpacked with the safe unpickler and checked in the
    read task, so the driver only turns columns into arrays, as for Parquet."""
    tables = [to_arrow(columns_from_leaves(_empty_leaves(specs)), specs)]
    for line in lines.column("text").to_pylist():
        if line.strip():
            columns = parse_line(line, where).get(policy_id)
            if columns is not None:
                leaves = _json_leaves(columns, specs, None, where)
                tables.append(to_arrow(columns_from_leaves(leaves), specs))
    return pa.concat_tables(tables)


def _empty_leaves(specs: list[LeafSpec]) -> Rows:
    return {s: [] if s.dtype == "json" else np.zeros((0, *s.shape), s.dtype) for s in specs}


def _ray_json_chunks(files: list[Path], dataset: PolicyDataset, readers: int) -> Iterator[Rows]:
    """JSON lines through Ray Data: `read_text` tasks (Arrow's JSON reader cannot type
    RLlib's lines, whose columns are packed strings or ragged infos), each batch of
    lines parsed in a task by `json_lines_to_arrow`."""
    import ray.data

    specs = dataset.data.columns
    where = f"{dataset.policy_id}'s JSON lines"
    parse = functools.partial(
        json_lines_to_arrow, policy_id=dataset.policy_id, specs=specs, where=where
    )
    rows = ray.data.read_text([str(f) for f in files], concurrency=readers).map_batches(
        parse, batch_format="pyarrow", concurrency=readers
    )
    for table in rows.iter_batches(batch_size=CHUNK_ROWS, batch_format="pyarrow"):
        yield _leaves(table, specs, where)
