"""TowerStack: one SGD step over 1..N devices with one copy of the variables.

The stack splits a batch's units (units.py) evenly over the towers, runs the
loss on every tower device in parallel, and combines what the towers computed
weighted by each tower's count of valid (unmasked) rows, so N towers give
exactly the step of the whole batch:

    grad = sum_t (valid_t / valid) * grad(masked_mean loss on tower t)

for each loss of the loss's list with respect to its own group's variables, clipped
by the group's clip and applied by the group's optimizer (loss_groups.py).

Across learner processes (a `CollectiveGroup`, each member with its own stack)
one all-reduce inside the compiled step sums the valid-row counts and the
count-weighted gradients, statistics and batch-norm moments (batch_norm.py), so
N learners x M towers give the step of the whole batch on one device; a group
of one runs no collective. With `accumulation_steps` K a step runs the towers
on K minibatches and combines them as one. A step reports, per loss group,
"grad_gnorm" (the combined gradient's global norm before clipping) and "cur_lr"
(a scheduled rate is set in the step from the `timestep` variable). Steps are
compiled graphs; a non-finite one is refused or rolled back (finite_guard.py).
Why hand-built towers, not MirroredStrategy: docs/replica_engine.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from policy_service.data.units import (
    LOSS_MASK,
    SEQ_LENS,
    arrange_minibatches,
    check_minibatch_size,
    gather_units,
    interleave_minibatches,
    is_sequence_column,
    pad_units,
    round_up,
    rows_per_unit,
)
from policy_service.engine import batch_norm, finite_guard
from policy_service.engine.batch_norm import BatchNormCapture, batch_norm_layers
from policy_service.engine.collectives import choose_implementation
from policy_service.engine.compiled import FlatCall
from policy_service.engine.devices import TowerDevices
from policy_service.engine.finite_guard import NonFiniteGradientError, NonFiniteUpdateError
from policy_service.engine.loss_groups import LossGroup, resolve_groups
from policy_service.engine.loss_output import PER_ROW, LossExtras, split_loss_output
from policy_service.engine.schedules import schedule_value

LossFn = Callable[[dict], object]  # a loss output (engine/loss_output.py)
StatsFn = Callable[[dict, list, dict], dict]  # (batch, losses, the loss's own stats)


class MissingColumnError(KeyError):
    """The loss asked for a column the train batch does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


def _run_loss(loss_fn: LossFn, batch: dict) -> tuple[list, LossExtras]:
    """Call the loss -> (its losses, its extras); a KeyError for an absent column
    becomes an error naming it."""
    try:
        return split_loss_output(loss_fn(batch))
    except KeyError as err:
        key = err.args[0] if err.args else None
        if isinstance(key, str) and key not in batch:
            raise MissingColumnError(
                f"train batch has no column {key!r}, which the loss needs; "
                f"columns present: {sorted(batch)}"
            ) from None
        raise


@dataclass
class LoadedBuffer:
    """Data already placed on the tower devices, one dict per tower."""

    towers: tuple
    num_rows: int  # over all towers, padding included
    units_per_minibatch: int  # per tower
    num_minibatches: int
    minibatch_rows: int  # over all towers


def _scale(value, weight):
    """weight * value, exactly zero when the weight is 0 even if value is NaN or inf:
    a tower holding only padding must add nothing."""
    value = tf.convert_to_tensor(value)
    return tf.math.multiply_no_nan(value, tf.cast(weight, value.dtype))


class PackedStats(NamedTuple):
    """A tower's scalar statistics as one tensor to move between devices, not one
    per statistic."""

    names: list
    values: tf.Tensor  # <float32>[len(names)]


def _split_stats(stats: dict) -> tuple[dict, dict]:
    """A policy's statistics -> (scalars, per-row outputs: those of shape [rows])."""
    values = {name: tf.convert_to_tensor(value) for name, value in stats.items()}
    for name, value in values.items():
        if value.shape.rank not in (0, 1):
            raise ValueError(
                f"statistic {name!r} must be a scalar or one value per row (shape "
                f"[rows]), got shape {value.shape}"
            )
    scalars = {name: v for name, v in values.items() if v.shape.rank == 0}
    return scalars, {name: v for name, v in values.items() if v.shape.rank == 1}


def _pack_stats(values: dict) -> PackedStats:
    packed = (
        tf.stack([tf.cast(v, tf.float32) for v in values.values()])
        if values
        else tf.zeros([0], tf.float32)
    )
    return PackedStats(list(values), packed)


def _per_row_outputs(per_row: dict) -> dict:
    """The loss's per-row outputs as <float32>[rows] tensors, checked."""
    outputs = {}
    for name, value in per_row.items():
        value = tf.convert_to_tensor(value)
        if value.shape.rank != 1:
            raise ValueError(
                f"per-row output {name!r} must have one value per row "
                f"(shape [rows]), got shape {value.shape}"
            )
        outputs[name] = tf.cast(value, tf.float32)
    return outputs


class TowerResult(NamedTuple):
    """What one tower computed on its shard."""

    valid_rows: tf.Tensor  # <float32>[] rows where loss_mask is True
    # per loss, per trainable variable (None outside the loss's group or out of its reach)
    grads: list
    stats: PackedStats
    state_updates: dict  # id(variable) -> the value the forward pass wrote (BN moments, RNG)
    per_row: dict  # name -> <float32>[shard rows], the loss's per-row outputs


class StepResult(NamedTuple):
    """The towers' results combined into one step."""

    grads: list  # per loss group, per trainable variable: combined and clipped
    stats: dict  # name -> scalar, weighted by valid rows, plus "valid_rows"
    assignments: list  # (variable, new value) for non-trainable state
    finite: tf.Tensor  # <bool>[variables with a gradient]: which gradients are finite


def clip_gradients(grads: list, clip: float | None, method: str) -> list:
    """Clip by global norm, by value, or by each tensor's norm (None grads kept)."""
    if clip is None:
        return grads
    present = [g for g in grads if g is not None]
    if method == "global_norm":
        clipped, _ = tf.clip_by_global_norm(present, clip)
    elif method == "value":
        clipped = [tf.clip_by_value(g, -clip, clip) for g in present]
    elif method == "norm":
        clipped = [tf.clip_by_norm(g, clip) for g in present]
    else:
        raise ValueError(
            f"grad_clip_method must be 'global_norm', 'value' or 'norm', got {method!r}"
        )
    it = iter(clipped)
    return [None if g is None else next(it) for g in grads]


class TowerStack:
    """Replicated loss towers over `tower_devices.devices` sharing one set of variables.

    loss_fn(tower_batch) -> a loss output: scalar losses (one per loss group), maybe
    with LossExtras (engine/loss_output.py).
    stats_fn(tower_batch, losses, loss_stats) -> dict of scalar statistics.
    optimizers: an optimizer, a LossGroup, or a list of either, one per loss
    (engine/loss_groups.py); `grad_clip` is the clip of a group that names none.
    """

    def __init__(
        self,
        tower_devices: TowerDevices,
        model: keras.Model,
        loss_fn: LossFn,
        stats_fn: StatsFn,
        optimizers: Sequence | LossGroup | keras.optimizers.Optimizer,
        *,
        grad_clip: float | None = None,
        grad_clip_method: str = "global_norm",
        l2_coeff: float = 0.0,
        seed: int | None = None,
        accumulation_steps: int = 1,
        collective_group=None,
        target=None,
        batch_norm_sync: bool = True,
        lr_schedule: list | None = None,
        timestep=None,
    ):
        clip_gradients([tf.zeros(1)], grad_clip, grad_clip_method)  # validates the method
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        self.accumulation_steps = int(accumulation_steps)
        self.collective_group = collective_group
        self.batch_norm_sync = bool(batch_norm_sync)
        self.tower_devices = tower_devices
        self.model = model
        self.loss_fn = loss_fn
        self.stats_fn = stats_fn
        self.grad_clip_method = grad_clip_method
        self.l2_coeff = float(l2_coeff)
        # a TargetNetwork (engine/target_network.py) moved after each applied step, or None
        self.target = target
        self.variables = list(model.trainable_variables)
        self.groups = resolve_groups(optimizers, self.variables, grad_clip, lr_schedule)
        self.optimizers = [group.optimizer for group in self.groups]
        # <int64>[] the global timestep that learning-rate schedules read
        self.timestep = timestep
        if timestep is None and any(g.lr_schedule is not None for g in self.groups):
            raise ValueError("a loss group has an lr_schedule, but the stack has no timestep")
        position = {id(v): i for i, v in enumerate(self.variables)}
        # each group's variables as positions in self.variables
        self._group_positions = [[position[id(v)] for v in g.variables] for g in self.groups]
        self._bn_layers = batch_norm_layers(model)
        self._bn_variables = {
            id(v) for layer in self._bn_layers for v in (layer.moving_mean, layer.moving_variance)
        }
        with tf.device(tower_devices.variable_device):
            for i, group in enumerate(self.groups):
                group.optimizer.build(group.variables)
                if group.lr_schedule is not None:  # as RLlib: the schedule's rate from the start
                    group.optimizer.learning_rate.assign(self._learning_rate(i))
            # the loaded epochs' shuffle; its state is part of the policy state
            self.shuffle_rng = tf.random.Generator.from_seed(0 if seed is None else seed)
            # applied steps, which a group applied every N steps counts by; part of the
            # policy state (None when every group is applied at every step)
            self.steps_applied = (
                keras.Variable(0, dtype="int64", trainable=False, name="steps_applied")
                if any(g.every_steps > 1 for g in self.groups)
                else None
            )
        # what a step writes, put back when the step's result is not finite; the
        # floating-point ones are those checked
        self._updated = _unique_variables(
            self.variables
            + list(model.non_trainable_variables)
            + [v for optimizer in self.optimizers for v in optimizer.variables]
            + ([] if target is None else target.variables + [target.age])
            + ([] if self.steps_applied is None else [self.steps_applied])
        )
        self._checked = [v for v in self._updated if tf.as_dtype(v.dtype).is_floating]
        self.buffers: dict[int, LoadedBuffer] = {}
        self._functions: dict = {}
        self._moment_sum = self._make_moment_sum()

    @property
    def num_towers(self) -> int:
        return self.tower_devices.num_towers

    def set_collective_group(self, group) -> None:
        """Combine every later step with the other members of `group` (a connected
        `CollectiveGroup`; None: this stack alone). Compiled steps are rebuilt."""
        self.collective_group = group
        self._moment_sum = self._make_moment_sum()
        self._functions.clear()

    def _make_moment_sum(self) -> batch_norm.MomentSum | None:
        """What sums BN moments over all towers and learners (batch_norm_sync), or
        None where there is nothing to sum: no BN layer, one tower of one learner."""
        if not (
            self.batch_norm_sync and self._bn_layers and self.num_towers * self.num_learners > 1
        ):
            return None
        implementation = (
            choose_implementation(tf.config.list_physical_devices())
            if self.num_learners == 1
            else self.collective_group.implementation
        )
        return batch_norm.MomentSum(self.tower_devices.devices, self.num_learners, implementation)

    @property
    def num_learners(self) -> int:
        group = self.collective_group
        return 1 if group is None or group.world_size is None else int(group.world_size)

    # ----- host side: sharding and placement -------------------------------------

    def shard(self, columns: dict, num_units: int) -> list[dict]:
        """Split units evenly over the towers (units padded to a multiple of N)."""
        unit_rows = rows_per_unit(columns, num_units)
        columns = pad_units(columns, num_units, round_up(num_units, self.num_towers))
        per_tower = round_up(num_units, self.num_towers) // self.num_towers
        shards = []
        for t in range(self.num_towers):
            shards.append(
                {
                    name: (
                        values[t * per_tower : (t + 1) * per_tower]
                        if is_sequence_column(name)
                        else values[t * per_tower * unit_rows : (t + 1) * per_tower * unit_rows]
                    )
                    for name, values in columns.items()
                }
            )
        return shards

    def place(self, shards: list[dict]) -> tuple:
        """Copy each shard onto its tower's device once."""
        placed = []
        for device, shard in zip(self.tower_devices.devices, shards):
            with tf.device(device):
                placed.append(
                    {
                        name: tf.identity(tf.convert_to_tensor(values))
                        for name, values in shard.items()
                    }
                )
        return tuple(placed)

    # ----- one step over whole shards ---------------------------------------------

    def learn(self, shards: tuple) -> dict:
        """One SGD step on the given (placed) shards -> combined statistics."""
        fn = self._function("learn", shards, self._learn_graph)
        return self._finish(fn(shards))

    def compute_gradients(self, shards: tuple) -> tuple[list, dict]:
        """Combined, clipped gradients (no variable changes) and statistics."""
        fn = self._function("grads", shards, self._gradients_graph)
        grads, out = fn(shards)
        out = dict(out)
        self._check_finite(out.pop("_finite"))
        out.pop("_per_row", None)  # returned by learning calls only
        stats = {k: float(v) for k, v in out.items()}
        grads = [[None if g is None else g.numpy() for g in per_loss] for per_loss in grads]
        return (grads[0] if len(grads) == 1 else grads), stats

    def apply_gradients(self, grads: list) -> None:
        """Apply gradients (a list per loss group, or one list for one group), each
        list aligned with the trainable variables (None: not changed)."""
        per_loss = grads if len(self.groups) > 1 else [grads]
        if len(per_loss) != len(self.groups):
            raise ValueError(f"expected {len(self.groups)} gradient lists, got {len(per_loss)}")
        tensors = []
        for i, glist in enumerate(per_loss):
            if len(glist) != len(self.variables):
                raise ValueError(
                    f"gradient list {i} has {len(glist)} entries, expected "
                    f"{len(self.variables)} (one per trainable variable)"
                )
            own = set(self._group_positions[i])
            row: list[tf.Tensor | None] = []
            for j, (g, v) in enumerate(zip(glist, self.variables)):
                if g is None:
                    row.append(None)
                    continue
                if j not in own:
                    raise ValueError(
                        f"gradient list {i} has a gradient for {v.path}, which is not "
                        f"a variable of loss group {i}"
                    )
                g = np.asarray(g, np.float32)
                if g.shape != tuple(v.shape):
                    raise ValueError(
                        f"gradient for {v.path} has shape {g.shape}, expected {tuple(v.shape)}"
                    )
                if not np.all(np.isfinite(g)):
                    raise NonFiniteGradientError(
                        f"gradient for {v.path} contains NaN or inf; weights unchanged"
                    )
                row.append(tf.convert_to_tensor(g))
            tensors.append(row)

        def apply():
            self._apply(tensors, [])
            self._after_applied_step()

        self._check_finite(np.ones(1, bool), self._kept_if_finite(apply)["_kept"])

    # ----- loaded buffers -----------------------------------------------------------

    def load(
        self,
        columns: dict,
        num_units: int,
        rows_per_unit: int,
        minibatch_size: int,
        buffer_index: int,
    ) -> int:
        """Place a whole padded batch on the towers, arranged so that the minibatch
        at row offset k*minibatch_size is exactly rows [k*mb, (k+1)*mb) of the batch.
        Returns the rows loaded over all towers, padding included."""
        check_minibatch_size(
            "minibatch_size",
            minibatch_size,
            learners=1,
            towers=self.num_towers,
            unit_rows=rows_per_unit,
        )
        shards, num_mb = arrange_minibatches(
            columns,
            num_units,
            rows_per_unit,
            minibatch_size,
            self.num_towers,
            self.accumulation_steps,
        )
        units_per_mb = minibatch_size // rows_per_unit
        self.buffers[buffer_index] = LoadedBuffer(
            towers=self.place(shards),
            num_rows=num_mb * minibatch_size,
            units_per_minibatch=units_per_mb // self.num_towers,
            num_minibatches=num_mb,
            minibatch_rows=minibatch_size,
        )
        return self.buffers[buffer_index].num_rows

    def learn_loaded(self, offset: int, buffer_index: int) -> dict:
        """One SGD step on the minibatch starting at row `offset` of a loaded buffer
        (with accumulation: on the K minibatches from there, offset a multiple of
        K x minibatch_size)."""
        buffer = self._buffer(buffer_index)
        step_rows = buffer.minibatch_rows * self.accumulation_steps
        if offset % step_rows or not 0 <= offset < buffer.num_rows:
            accumulated = (
                f" x {self.accumulation_steps} accumulation steps"
                if self.accumulation_steps > 1
                else ""
            )
            raise ValueError(
                f"offset {offset} must be a multiple of minibatch_size "
                f"{buffer.minibatch_rows}{accumulated} below {buffer.num_rows} loaded rows"
            )
        u = buffer.units_per_minibatch
        first = offset // buffer.minibatch_rows * u
        # numpy, not eager TF ops: this runs once per SGD step
        idx = np.broadcast_to(
            np.arange(first, first + self.accumulation_steps * u, dtype=np.int32).reshape(-1, 1, u),
            (self.accumulation_steps, self.num_towers, u),
        )  # [K, towers, u]
        fn = self._function("loaded", buffer.towers, self._loaded_graph)
        return self._finish(fn(buffer.towers, idx))

    def learn_loaded_epochs(self, num_epochs: int, buffer_index: int, shuffle: bool = True) -> dict:
        """`num_epochs` passes of minibatch SGD over a loaded buffer in one compiled
        call; each epoch visits the minibatches of each tower's shard in a fresh
        on-device permutation (or in order when shuffle=False). Returns statistics
        averaged over the steps. Stops at the first non-finite gradient (the steps
        before it stand) and raises; an update that left any variable non-finite
        rolls the whole call back and raises."""
        buffer = self._buffer(buffer_index)
        units = buffer.units_per_minibatch * buffer.num_minibatches
        if shuffle:
            seeds = self.shuffle_rng.make_seeds(num_epochs * self.num_towers)
            keys = tf.transpose(seeds)  # [epochs*towers, 2]
            perms = tf.stack(
                [
                    tf.argsort(tf.random.stateless_uniform([units], keys[i]))
                    for i in range(num_epochs * self.num_towers)
                ]
            )
            order = tf.reshape(tf.cast(perms, tf.int32), [num_epochs, self.num_towers, units])
        else:
            order = tf.tile(
                tf.range(units, dtype=tf.int32)[None, None], [num_epochs, self.num_towers, 1]
            )
        # traced here, not inside the epoch loop's trace: collective keys follow trace order
        self._function("loaded", buffer.towers, self._loaded_graph)
        fn = self._function("epochs", buffer.towers, self._epochs_graph)
        out = fn(buffer.towers, order, tf.constant(buffer.units_per_minibatch, tf.int32))
        out = dict(out)
        steps = int(out.pop("_steps"))
        if "_per_row" in out:  # per tower, in its buffer's layout -> the batch's rows
            out["_per_row"] = {
                name: [
                    interleave_minibatches(
                        [np.asarray(p) for p in per_tower], buffer.num_minibatches
                    )
                ]
                for name, per_tower in out["_per_row"].items()
            }
        try:
            result = self._finish(out)
        except NonFiniteUpdateError:
            raise  # the whole call was rolled back: no step stands
        except NonFiniteGradientError as err:
            err.steps_applied = steps
            raise
        result["num_sgd_steps"] = steps
        return result

    def _buffer(self, buffer_index: int) -> LoadedBuffer:
        if buffer_index not in self.buffers:
            raise ValueError(
                f"no batch loaded into buffer {buffer_index}; "
                f"loaded buffers: {sorted(self.buffers)}"
            )
        return self.buffers[buffer_index]

    # ----- compiled graphs ----------------------------------------------------------

    def _function(self, kind: str, shards: tuple, graph_fn):
        """A tf.function per (kind, column signature) with unknown leading dims, so
        a new batch size never retraces."""
        # called once per SGD step in per-minibatch loops: a cheap key first, the
        # TensorSpecs only for a new one
        key = (
            kind,
            tuple((name, t.dtype, tuple(t.shape[1:])) for name, t in sorted(shards[0].items())),
        )
        if key not in self._functions:
            signature = tuple(
                {
                    name: tf.TensorSpec([None] + list(t.shape[1:]), t.dtype)
                    for name, t in shard.items()
                }
                for shard in shards
            )
            extra = {
                "loaded": [
                    tf.TensorSpec([self.accumulation_steps, self.num_towers, None], tf.int32)
                ],
                "epochs": [
                    tf.TensorSpec([None, self.num_towers, None], tf.int32),
                    tf.TensorSpec([], tf.int32),
                ],
            }.get(kind, [])
            # No AutoGraph: the stack's control flow is explicit (tf.cond, tf.while_loop),
            # and errors raised while tracing (a missing column) keep their type.
            self._functions[key] = FlatCall(
                tf.function(graph_fn, input_signature=[signature] + extra, autograph=False)
            )
        return self._functions[key]

    def trace_count(self) -> int:
        return sum(f.trace_count() for f in self._functions.values())

    def _tower_pass(self, shard_sets: list) -> StepResult:
        """Per tower and per minibatch (K of them with accumulation): losses,
        gradients, stats and BN moments; then weighted by each tower's valid rows,
        combined on the variable device, and combined across learners.

        Each tower weights its own gradients and statistics on its device, so the
        variable device only sums them: on fake GPUs the tensors crossing devices,
        not the arithmetic, are much of what N towers add over one."""
        devices, results = [], []
        with BatchNormCapture(self._bn_layers, self._moment_sum) as capture:
            for shards in shard_sets:
                for device, shard in zip(self.tower_devices.devices, shards):
                    devices.append(device)
                    results.append(self._run_tower(device, shard, capture))
        with tf.device(self.tower_devices.variable_device):
            total = tf.add_n([r.valid_rows for r in results])
            weights = [tf.math.divide_no_nan(r.valid_rows, total) for r in results]
        return self._combine(results, devices, weights, total, capture.momenta)

    def _run_tower(self, device: str, shard: dict, capture: BatchNormCapture) -> TowerResult:
        with tf.device(device):
            batch = dict(shard)
            capture.row_mask = shard[LOSS_MASK]
            valid = tf.reduce_sum(tf.cast(shard[LOSS_MASK], tf.float32))
            with keras.StatelessScope() as scope:
                with tf.GradientTape(persistent=len(self.groups) > 1) as tape:
                    losses, extras = _run_loss(self.loss_fn, batch)
                if len(losses) != len(self.groups):
                    raise ValueError(
                        f"loss returned {len(losses)} losses for "
                        f"{len(self.groups)} optimizer(s) (loss groups)"
                    )
                grads = [
                    self._aligned(i, tape.gradient(loss, group.variables))
                    for i, (loss, group) in enumerate(zip(losses, self.groups))
                ]
                scalars, rows = _split_stats(self.stats_fn(batch, losses, dict(extras.stats)))
                stats = _pack_stats(scalars)
                per_row = _per_row_outputs({**extras.per_row, **rows})
                updates = {
                    id(v): scope.get_current_value(v)
                    for v in self.model.non_trainable_variables
                    if scope.get_current_value(v) is not None
                }
            del tape
            return TowerResult(valid, grads, stats, updates, per_row)

    def _aligned(self, group_index: int, grads: list) -> list:
        """A group's gradients placed at its variables' positions in self.variables
        (None elsewhere)."""
        aligned: list = [None] * len(self.variables)
        for position, grad in zip(self._group_positions[group_index], grads):
            aligned[position] = grad
        return aligned

    def _weighted_terms(self, per_tower: list, weights: list, devices: list) -> list:
        """weight_t * value for every tensor of each tower's nested list, on the
        tower's own device (None stays None). A lone tower holds every valid row
        (weight 1), so its values pass as they are."""
        if len(per_tower) == 1:
            return list(per_tower)

        def scale(value, weight):
            if isinstance(value, (list, tuple)):
                return [scale(v, weight) for v in value]
            return None if value is None else _scale(value, weight)

        terms = []
        for device, value, weight in zip(devices, per_tower, weights):
            with tf.device(device):
                terms.append(scale(value, weight))
        return terms

    def _combine(
        self, results: list, devices: list, weights: list, total, momenta: list
    ) -> StepResult:
        weighted = self._weighted_terms([r.grads for r in results], weights, devices)
        packed = self._weighted_terms([r.stats.values for r in results], weights, devices)
        with tf.device(self.tower_devices.variable_device):
            grads = [
                [
                    None
                    if weighted[0][i][j] is None
                    else self._reduce([w[i][j] for w in weighted], devices)
                    for j in range(len(self.variables))
                ]
                for i in range(len(self.groups))
            ]
            stats = tf.add_n(packed)
            moments = batch_norm.combine_tower_moments(
                self._bn_layers,
                momenta,
                [r.state_updates for r in results],
                lambda per_tower: self._weighted_terms(per_tower, weights, devices),
            )
            grads, stats, moments, total = self._across_learners(grads, stats, moments, total)
            unclipped = [self._with_l2(per_var) for per_var in grads]
            combined = [
                clip_gradients(per_var, group.grad_clip, self.grad_clip_method)
                for per_var, group in zip(unclipped, self.groups)
            ]
            names = results[0].stats.names
            stats = dict(zip(names, tf.unstack(stats, num=len(names))))
            stats["valid_rows"] = total
            norms = []
            for i, per_var in enumerate(unclipped):  # of the combined gradient: exact
                norms.append(tf.linalg.global_norm([g for g in per_var if g is not None]))
                stats[self._group_stat("grad_gnorm", i)] = norms[-1]
                stats[self._group_stat("cur_lr", i)] = tf.cast(self._learning_rate(i), tf.float32)
            if results[0].per_row:  # per minibatch and tower, in batch order; never reduced
                stats["_per_row"] = {
                    name: [r.per_row[name] for r in results] for name in results[0].per_row
                }
            assignments = self._state_assignments(moments, results)
            finite = finite_guard.finite_gradients(combined, norms)
        return StepResult(combined, stats, assignments, finite)

    def _group_stat(self, name: str, group_index: int) -> str:
        """A per-group statistic's name: `name` for one group, `name_i` for several."""
        return name if len(self.groups) == 1 else f"{name}_{group_index}"

    def _learning_rate(self, group_index: int):
        """A group's learning rate in this step: its schedule's at the timestep, or
        the optimizer's own."""
        group = self.groups[group_index]
        if group.lr_schedule is None:
            return group.optimizer.learning_rate
        return schedule_value(group.lr_schedule, self.timestep)

    def _with_l2(self, grads: list) -> list:
        """l2_coeff * weight added to kernel gradients (not biases), before clipping."""
        if not self.l2_coeff:
            return grads
        return [
            g if g is None or len(var.shape) <= 1 else g + self.l2_coeff * var
            for g, var in zip(grads, self.variables)
        ]

    def _reduce(self, terms: list, devices: list | None = None) -> tf.Tensor:
        """Sum per-tower tensors onto the variable device: accumulated minibatches
        first on their own tower's device, then NCCL between real GPUs, else an add
        on the variable device (the tensors are copied there)."""
        if devices is not None and len(terms) > self.tower_devices.num_towers:
            by_device: dict = {}
            for device, term in zip(devices, terms):
                by_device.setdefault(device, []).append(term)
            terms = []
            for device, same_device in by_device.items():
                with tf.device(device):
                    terms.append(tf.add_n(same_device))
        if len(terms) > 1 and self.tower_devices.gradient_reduction == "nccl":
            from tensorflow.python.ops import nccl_ops  # no public API for a reduce to one GPU

            return nccl_ops.reduce_sum(terms)
        return tf.add_n(terms)

    def _across_learners(self, grads: list, stats, moments: list, total):
        """This learner's valid-row count and count-weighted gradients, statistics
        and BN moments (around a shared shift: batch_norm.shifted_for_sum) summed over
        every learner in one all-reduce, then divided by the total count: what one
        device computes on the whole batch."""
        if self.num_learners == 1:
            return grads, stats, moments, total
        shifted, shifts = batch_norm.shifted_for_sum(moments)
        # the all-reduce needs static shapes: a gradient's is its variable's (a model that
        # flattens with reshape(x, [B, -1]), as SAC's does, leaves a kernel's first dim unknown)
        local = [
            tf.ensure_shape(tf.convert_to_tensor(g), var.shape)
            for per_var in grads
            for g, var in zip(per_var, self.variables)
            if g is not None
        ]
        local += [stats] + shifted
        means, total = self.collective_group.all_reduce_weighted_mean(local, total)
        summed = iter(means)
        grads = [[None if g is None else next(summed) for g in per_var] for per_var in grads]
        stats = next(summed)
        return grads, stats, batch_norm.unshifted(moments, shifts, summed), total

    def _state_assignments(self, moments: list, results: list) -> list:
        """(variable, new value) for non-trainable state: BN statistics from the
        combined moments with the layer's momentum; any other state (e.g. RNG)
        from the last tower."""
        assignments = batch_norm.moving_statistics(moments)
        last = results[-1].state_updates
        for var in self.model.non_trainable_variables:
            if id(var) not in self._bn_variables and id(var) in last:
                assignments.append((var, last[id(var)]))
        return assignments

    def _apply_gradients(self, per_group: list) -> None:
        """Each group's gradients onto its variables (None: untouched); a group applied
        every N steps only on the steps where N divides the applied steps so far + 1."""
        for i, (group, grads) in enumerate(zip(self.groups, per_group)):
            pairs = [(g, v) for g, v in zip(grads, self.variables) if g is not None]

            def apply(optimizer=group.optimizer, pairs=pairs, i=i):
                if self.groups[i].lr_schedule is not None:
                    optimizer.learning_rate.assign(self._learning_rate(i))
                optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
                return tf.constant(True)

            if group.every_steps == 1:
                apply()
            else:
                assert self.steps_applied is not None  # kept when a group is delayed
                due = tf.equal((self.steps_applied + 1) % group.every_steps, 0)
                tf.cond(due, apply, lambda: tf.constant(False))

    def _apply(self, grads: list, assignments: list) -> None:
        self._apply_gradients(grads)
        for var, value in assignments:
            var.assign(value)

    def _after_applied_step(self) -> None:
        """What follows a step only once it was applied: the target network's update
        and the count of applied steps (so a skipped or rolled-back step never moves the
        target nor advances a delayed group)."""
        if self.target is not None:
            self.target.after_step()
        if self.steps_applied is not None:
            self.steps_applied.assign_add(1)

    def _step(self, shard_sets: list):
        """Forward/backward on all towers, then apply only if every gradient is finite
        (the same decision on every learner: the gradients are the combined ones)."""
        step = self._tower_pass(shard_sets)

        def apply():
            self._apply(step.grads, step.assignments)
            self._after_applied_step()
            return tf.constant(True)

        with tf.device(self.tower_devices.variable_device):
            tf.cond(tf.reduce_all(step.finite), apply, lambda: tf.constant(False))
        return {**step.stats, "_finite": step.finite}

    def _kept_if_finite(self, run) -> dict:
        """run()'s output, rolled back if it left state non-finite (finite_guard)."""
        return finite_guard.kept_if_finite(
            run, self._updated, self._checked, self.tower_devices.variable_device
        )

    def _learn_graph(self, shards):
        return self._kept_if_finite(lambda: self._step([shards]))

    def _gradients_graph(self, shards):
        step = self._tower_pass([shards])
        return step.grads, {**step.stats, "_finite": step.finite}

    def _loaded_graph(self, buffers, unit_idx):
        """unit_idx <int32>[K, towers, units per tower minibatch]."""
        return self._kept_if_finite(lambda: self._loaded_step(buffers, unit_idx))

    def _loaded_step(self, buffers, unit_idx):
        return self._step(
            [self._gather(buffers, unit_idx[s]) for s in range(self.accumulation_steps)]
        )

    def _gather(self, buffers, unit_idx):
        shards = []
        for t, (device, buffer) in enumerate(zip(self.tower_devices.devices, buffers)):
            with tf.device(device):
                shards.append(gather_units(buffer, unit_idx[t]))
        return tuple(shards)

    def _epochs_graph(self, buffers, order, units_per_mb):
        return self._kept_if_finite(lambda: self._epochs(buffers, order, units_per_mb))

    def _epochs(self, buffers, order, units_per_mb):
        accumulate = self.accumulation_steps
        num_epochs = tf.shape(order)[0]
        steps_per_epoch = tf.shape(order)[2] // (units_per_mb * accumulate)
        total = num_epochs * steps_per_epoch
        template = self._loaded_stats_template(buffers)
        sums = {k: tf.zeros([], tf.float32) for k in template if not k.startswith("_")}
        # each buffer row's per-row outputs from the last step that visited it
        per_row = {
            name: [tf.zeros(tf.shape(b[LOSS_MASK])[:1]) for b in buffers]
            for name in template.get("_per_row", {})
        }

        def body(i, ok, sums, per_row):
            epoch, k = i // steps_per_epoch, i % steps_per_epoch
            shard_sets, unit_sets = [], []
            for s in range(accumulate):
                start = (k * accumulate + s) * units_per_mb
                unit_sets.append(order[epoch, :, start : start + units_per_mb])
                shard_sets.append(self._gather(buffers, unit_sets[-1]))
            stats = self._step(shard_sets)
            finite = tf.reduce_all(stats.pop("_finite"))
            sums = {key: sums[key] + tf.cast(stats[key], tf.float32) for key in sums}
            if per_row:
                per_row = self._kept_rows(per_row, stats["_per_row"], buffers, unit_sets)
            return i + 1, finite, sums, per_row

        steps, ok, sums, per_row = tf.while_loop(
            lambda i, ok, *_: tf.logical_and(i < total, ok),
            body,
            [tf.constant(0), tf.constant(True), sums, per_row],
        )
        out = {k: v / tf.cast(tf.maximum(steps, 1), tf.float32) for k, v in sums.items()}
        if per_row:
            out["_per_row"] = per_row
        # the last step's flags decide the error; a failed step was not applied
        out["_finite"] = tf.reshape(ok, [1])
        out["_steps"] = tf.where(ok, steps, steps - 1)
        return out

    def _loaded_stats_template(self, buffers) -> dict:
        """The statistics (and per-row outputs), learnt by tracing one loaded step
        symbolically."""
        return dict(
            self._function("loaded", buffers, self._loaded_graph).concrete.structured_outputs
        )

    def _kept_rows(self, kept: dict, step_rows: dict, buffers, unit_sets: list) -> dict:
        """`kept` (name -> per tower <float32>[buffer rows]) with the rows of this
        step's units overwritten by the step's per-row outputs."""
        kept = {name: list(per_tower) for name, per_tower in kept.items()}
        for s, units in enumerate(unit_sets):
            for t, (device, buffer) in enumerate(zip(self.tower_devices.devices, buffers)):
                with tf.device(device):
                    layout = {k: buffer[k] for k in (LOSS_MASK, SEQ_LENS) if k in buffer}
                    rows = gather_units(
                        {**layout, "_row": tf.range(tf.shape(buffer[LOSS_MASK])[0])}, units[t]
                    )["_row"]
                    for name in kept:
                        kept[name][t] = tf.tensor_scatter_nd_update(
                            kept[name][t], rows[:, None], step_rows[name][s * self.num_towers + t]
                        )
        return kept

    # ----- results ------------------------------------------------------------------

    def _finish(self, out) -> dict:
        """Statistics as floats, and PER_ROW: per-row outputs concatenated over the
        step's minibatches and towers (the rows in batch order, padding included)."""
        out = dict(out)
        self._check_finite(out.pop("_finite"), out.pop("_kept"))
        per_row = out.pop("_per_row", None)
        result: dict[str, float | dict[str, np.ndarray]] = {k: float(v) for k, v in out.items()}
        if per_row:
            result[PER_ROW] = {
                name: np.concatenate([np.asarray(p) for p in parts])
                for name, parts in per_row.items()
            }
        return result

    def _check_finite(self, finite, kept=None) -> None:
        finite_guard.check_finite(finite, kept, self._checked, self.variables)


def _unique_variables(variables: list) -> list:
    """The variables in order, each once."""
    seen, unique = set(), []
    for var in variables:
        if id(var) not in seen:
            seen.add(id(var))
            unique.append(var)
    return unique
