"""TFPolicy: the public policy API (RLlib's method names) on top of a TowerStack.

A concrete policy overrides `loss(model, dist_class, train_batch)` and
optionally `stats`, `postprocess_trajectory`, `extra_action_out`,
`make_dist_class`, `make_model`, `optimizer` (one per loss, each maybe a LossGroup: the variables
that loss trains, engine/loss_groups.py) and `target_network_update` (a target
copy of the model, moved inside the compiled step, that the loss reads with
`target_model_out`). The loss gets one tower's shard as a dict of
tensors with a boolean "loss_mask" column (False on padding), calls
`model(train_batch, training=True)`, and reduces with `masked_mean`.

The loss is traced without AutoGraph (so an error such as a missing column
keeps its type): branch on tensors with tf.cond/tf.where, not Python `if`.
Acting runs on the first tower device with training=False; learning runs
on all towers. Both are compiled once per column signature: batch sizes
never retrace.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf
import tree

from policy_service.config import ConfigError, from_dict
from policy_service.data import nests, observation_filters, sequencing, spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import (
    TrainColumns,
    TrainLayout,
    nest_columns,
    prepare_train_columns,
)
from policy_service.data.units import LOSS_MASK
from policy_service.engine import devices
from policy_service.engine.compiled import FlatCall, VariableWriter
from policy_service.engine.finite_guard import NonFiniteGradientError
from policy_service.engine.fixed_rows import FixedRowsCall, XlaTwins, has_convolutions
from policy_service.engine.optimizers import FusedAdam
from policy_service.engine.schedules import schedule_value
from policy_service.engine.target_network import TargetNetwork, TargetUpdate
from policy_service.engine.towers import TowerStack
from policy_service.io import checkpoints
from policy_service.io.space_codec import space_from_json, space_to_json
from policy_service.policy import (
    action_masks,
    call_arguments,
    distributions,
    exploration,
    model_hooks,
    models,
)
from policy_service.policy.batch_learning import BatchLearning, sampler_grad_updates
from policy_service.policy.learning_results import (
    NUM_GRAD_UPDATES_LIFETIME,
    first_rows,
    rllib_layout,
    valid_rows_only,
)
from policy_service.policy.policy_config import PolicyConfig


class TFPolicy(BatchLearning):
    """A TF2/Keras policy that acts on one device and learns on a tower stack."""

    config_class = PolicyConfig
    # the train-batch columns the loss reads (name -> LossColumn), checked before any
    # tensor work so a bad batch is an error naming the column ("obs" always is)
    loss_columns: dict = {}
    # an "action_mask" observation entry masks the model's action distribution inputs
    # (action_masks.py); False: a policy whose losses read more of the model refuses it
    takes_action_masks: bool = True

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | PolicyConfig | None = None,
    ):
        self.config = from_dict(self.config_class, config)
        self.observation_space = observation_space
        self.action_space = action_space
        self.preprocessor = spaces.make_preprocessor(observation_space)
        # the driver's copy on a learner: applied to raw observations in compute_actions
        self.observation_filter = observation_filters.make_filter(
            self.config.observation_filter, observation_space
        )
        self.tower_devices = devices.resolve_devices(self.config.num_gpus, self.config._fake_gpus)
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        self._action_leaves = spaces.action_leaves(action_space)  # checked once, here
        self._action_specs = spaces.action_leaf_specs(action_space)
        self.dist_class = self.make_dist_class()
        self.num_outputs = self.dist_class.required_input_dim(action_space)
        self.exploration = exploration.make_exploration(
            action_space, self.config.exploration_config
        )
        self.global_timestep = 0
        self.num_grad_updates = 0
        # what the last learning call learned from: its TrainColumns, or the gradient
        # lists it applied (last_gradients)
        self._last_learned: TrainColumns | list | None = None
        # by loaded buffer: the sampler count of the batch in it (learn_on_loaded_batch's lead)
        self._loaded_sampler_counts: dict[int, float | None] = {}
        with tf.device(self.tower_devices.variable_device):
            self.model = action_masks.masked_model(
                models.follow_call_convention(self.make_model()), self
            )
            self._initial_state = models.initial_state(self.model)
            # a lazily built model creates its variables here, before any list of them is taken
            models.check_model(
                self.model, self._example_input_dict(rows=2), self.num_outputs, self._initial_state
            )
            self._action_rng = tf.random.Generator.from_seed(
                self.config.seed if self.config.seed is not None else np.random.randint(2**31)
            )
            optimizers = self.optimizer()
            # the global timestep as the compiled steps read it (schedules), set from
            # `global_timestep` before each learning call that finds it changed
            self.timestep_variable = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._timestep_in_variable = 0
        self._weight_variables = [v for v in self.model.variables if not _is_rng_state(v)]
        # the model's Keras seed generators (a loss's samples, dropout): policy state, by position
        self._model_rngs = {
            f"model_{i}": v
            for i, v in enumerate(v for v in self.model.variables if _is_rng_state(v))
        }
        self._weight_names = _unique(models.weight_names(self.model, self._weight_variables))
        self._weights_writer: VariableWriter | None = None  # compiled on first set_weights
        update = self.target_network_update()
        self.target_network = (
            None
            if update is None
            else TargetNetwork(
                self.model, self._weight_variables, update, self.tower_devices.variable_device
            )
        )
        self.towers = TowerStack(
            self.tower_devices,
            self.model,
            self._tower_loss,
            self._tower_stats,
            optimizers,
            grad_clip=self.config.grad_clip,
            grad_clip_method=self.config.grad_clip_method,
            l2_coeff=self.config.l2_coeff,
            seed=self.config.seed,
            accumulation_steps=self.config.num_grad_accumulation_steps,
            target=self.target_network,
            batch_norm_sync=self.config.batch_norm_sync,
            lr_schedule=self.config.lr_schedule,
            timestep=self.timestep_variable,
        )
        if self.config.lr_schedule is not None and all(
            g.lr_schedule is None for g in self.towers.groups
        ):
            raise ConfigError(
                f"config.lr_schedule is not supported by {type(self).__name__}, whose "
                "optimizers are loss groups with their own learning rates (give each "
                f"LossGroup its lr_schedule), got {self.config.lr_schedule!r}"
            )
        self._optimizers = self.towers.optimizers
        self._action_fn = self._compile_action_fn()
        self._xla: XlaTwins | None = None  # act_with_xla
        self._logp_fn = self._compile_logp_fn()

    # ----- what a concrete policy overrides -------------------------------------------

    def loss(self, model: keras.Model, dist_class, train_batch: dict):
        """A scalar loss tensor, or a list with one loss per optimizer; either may come
        as `(losses, LossExtras(stats, per_row))` with what else it computed."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss()")

    def stats(self, train_batch: dict) -> dict:
        """Scalar statistics, combined over towers by valid rows (a loss may return its
        own in LossExtras.stats instead)."""
        return {}

    def extra_action_out(self, input_dict: dict, model_out: dict, dist) -> dict:
        """Extra per-row tensors returned by compute_actions."""
        return {}

    def postprocess_trajectory(
        self, batch: SampleBatch, other_agent_batches=None, episode=None
    ) -> SampleBatch:
        """Add columns (advantages, targets) to one trajectory chunk; default: none."""
        return batch

    def postprocess_trajectories(self, batches: list[SampleBatch]) -> list[SampleBatch]:
        """`postprocess_trajectory` of each chunk (a multi-agent fragment's chunks of one
        policy); a policy may do them together, e.g. one forward pass for all."""
        return [self.postprocess_trajectory(batch) for batch in batches]

    def after_async_update(self, stats: dict) -> None:
        """Called on every learner after each asynchronous update (update_on_fragments)
        with its combined statistics, e.g. to adapt a coefficient; default: nothing."""

    def make_dist_class(self) -> type[distributions.ActionDistribution]:
        """The action distribution class: config.model.custom_action_dist's when set,
        else the space's (dist_class_for)."""
        name = self.config.model.custom_action_dist
        if name is not None:
            return distributions.custom_action_dist(name)
        return distributions.dist_class_for(self.action_space)

    def make_model(self) -> keras.Model:
        """The catalog's (or custom) model for the preprocessed observations; the space
        carries `original_space`, so Dict/Tuple parts get their own encoders."""
        obs_space = spaces.model_input_space(self.preprocessor)
        return models.build_model(obs_space, self.action_space, self.num_outputs, self.config.model)

    def target_network_update(self) -> TargetUpdate | None:
        """Opt in to a target copy of the model (read in the loss with
        `target_model_out`): TargetUpdate(every_steps, tau). None (default): no target."""
        return None

    def optimizer(self):
        """One Keras optimizer, or a list with one per loss; each may be a
        LossGroup(optimizer, variables, grad_clip, every_steps) so that its loss
        trains only those variables (engine/loss_groups.py)."""
        kind, lr = self.config.optimizer, self.config.lr
        if kind == "adam":
            return FusedAdam(lr, epsilon=self.config.adam_epsilon)
        if kind == "rmsprop":
            return keras.optimizers.RMSprop(lr)
        return keras.optimizers.SGD(lr)

    # ----- acting -------------------------------------------------------------------

    @property
    def devices(self) -> list[str]:
        return list(self.tower_devices.devices)

    def is_recurrent(self) -> bool:
        return self.num_state_tensors() > 0

    def num_state_tensors(self) -> int:
        return len(self._initial_state)

    def get_initial_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self._initial_state]

    def variables(self) -> list[keras.Variable]:
        """The model's variables, in get_weights() order (RLlib's Policy.variables());
        Keras 3 variables, each holding its tf.Variable as `.value`."""
        return list(self._weight_variables)

    def get_exploration_state(self) -> dict:
        """The exploration's state (RLlib's name): e.g. OU noise's, epsilon's timestep."""
        return self.exploration.get_state()

    def compute_actions(
        self,
        obs_batch,
        state_batches=None,
        prev_action_batch=None,
        prev_reward_batch=None,
        explore=None,
        timestep=None,
        **kwargs,
    ):
        """-> (actions [B, ...], state_outs [num_state_tensors x [B, cell]], extra dict)."""
        obs = self.observation_filter(self.preprocessor.transform(obs_batch), update=False)
        batch_size = obs.shape[0]
        inputs = self.acting_inputs(
            obs, state_batches, prev_action_batch, prev_reward_batch, batch_size
        )
        if explore is None:
            explore = self.config.explore
        explore = call_arguments.flag(explore, "explore")
        if timestep is None:
            timestep = self.global_timestep
        timestep = call_arguments.count(timestep, "timestep")
        # None above the twins' largest row count: the executor's function
        xla = None if self._xla is None else self._xla.for_rows(batch_size)
        with tf.device(self.tower_devices.devices[0]):
            if xla is None:
                actions, state_outs, extra = self._action_fn(*inputs, explore, np.int64(timestep))
            else:
                actions, state_outs, extra = xla(batch_size, *inputs, explore, np.int64(timestep))
        self.global_timestep += batch_size
        outputs = (
            self._action_arrays(actions),
            [s.numpy() for s in state_outs],
            {k: v.numpy() for k, v in extra.items()},
        )
        padded = xla is not None and batch_size < xla.rows
        return nests.row_range(outputs, 0, batch_size) if padded else outputs

    def compute_actions_from_input_dict(
        self, input_dict: dict, explore=None, timestep=None, **kwargs
    ):
        """compute_actions on the columns of `input_dict`: one step per row."""
        if SampleBatch.OBS not in input_dict:
            raise ValueError(f"input_dict has no 'obs'; it has {sorted(input_dict)}")
        seq_lens = input_dict.get(SampleBatch.SEQ_LENS)
        if seq_lens is not None:
            rows = len(tree.flatten(input_dict[SampleBatch.OBS])[0])
            lengths = numeric_array(seq_lens, "input_dict['seq_lens']").reshape(-1)
            if len(lengths) != rows or np.any(lengths != 1):
                raise ValueError(
                    f"input_dict['seq_lens'] must be 1 for each of the {rows} rows (acting "
                    f"takes one step per row), got {lengths.tolist()}"
                )
        states = [
            input_dict[f"state_in_{i}"]
            for i in range(self.num_state_tensors())
            if f"state_in_{i}" in input_dict
        ] or None
        return self.compute_actions(
            input_dict[SampleBatch.OBS],
            states,
            input_dict.get(SampleBatch.PREV_ACTIONS),
            input_dict.get(SampleBatch.PREV_REWARDS),
            explore=explore,
            timestep=timestep,
        )

    def compute_single_action(
        self, obs, state=None, explore=None, prev_action=None, prev_reward=None, timestep=None
    ):
        """One unbatched observation -> (action, state_out list, extra), unbatched."""
        obs_batch = tree.map_structure(lambda o: np.asarray(o)[None], obs)
        if state is not None and not isinstance(state, (list, tuple)):
            raise ValueError(
                f"state must be a list of arrays, one per state tensor, got {type(state).__name__}"
            )
        # batches of one, converted (and named when they cannot be) by compute_actions
        states = None if state is None else [[s] for s in state]
        prev_a = (
            None
            if prev_action is None
            else tree.map_structure(lambda a: np.asarray(a)[None], prev_action)
        )
        prev_r = None if prev_reward is None else [prev_reward]
        actions, state_outs, extra = self.compute_actions(
            obs_batch, states, prev_a, prev_r, explore=explore, timestep=timestep
        )
        return (
            tree.map_structure(lambda a: a[0], actions),
            [s[0] for s in state_outs],
            {k: v[0] for k, v in extra.items()},
        )

    def compute_log_likelihoods(
        self,
        actions,
        obs_batch,
        state_batches=None,
        prev_action_batch=None,
        prev_reward_batch=None,
        **kwargs,
    ):
        """log pi(a|s) <float32>[B] of the given actions under the current weights."""
        obs = self.observation_filter(self.preprocessor.transform(obs_batch), update=False)
        spaces.check_actions(self.action_space, actions, check_bounds=False)
        inputs = self.acting_inputs(
            obs, state_batches, prev_action_batch, prev_reward_batch, obs.shape[0]
        )
        with tf.device(self.tower_devices.devices[0]):
            return self._logp_fn(*inputs, self.checked_actions(actions, "actions")).numpy()

    def acting_inputs(
        self, obs, state_batches, prev_actions, prev_rewards, batch_size: int
    ) -> tuple:
        """Preprocessed observations and optional acting inputs -> the numpy tuple
        (obs, states, prev_actions, prev_rewards) matching `acting_signature()`:
        missing states are the initial state, missing previous actions and rewards zeros."""
        n = self.num_state_tensors()
        if state_batches is not None and not isinstance(state_batches, (list, tuple, np.ndarray)):
            raise ValueError(
                "state_batches must be a list of arrays, one per state tensor, got "
                f"{type(state_batches).__name__}"
            )
        if state_batches is None or len(state_batches) == 0:
            states = [np.repeat(s[None], batch_size, axis=0) for s in self._initial_state]
        else:
            if len(state_batches) != n:
                raise ValueError(f"expected {n} state tensors, got {len(state_batches)}")
            states = [
                numeric_array(s, f"state_in_{i}").astype(np.float32)
                for i, s in enumerate(state_batches)
            ]
            for i, (s, init) in enumerate(zip(states, self._initial_state)):
                if s.shape != (batch_size,) + init.shape:
                    raise ValueError(
                        f"state_in_{i} has shape {s.shape}, expected {(batch_size,) + init.shape}"
                    )
                if not np.all(np.isfinite(s)):
                    row = int(np.argwhere(~np.isfinite(s))[0][0])
                    raise ValueError(f"state_in_{i} has NaN or inf (first at row {row})")
        if prev_actions is None:
            prev_actions = spaces.zero_actions(self.action_space, batch_size)
        if prev_rewards is None:
            prev_rewards = np.zeros(batch_size, np.float32)
        prev_rewards = numeric_array(prev_rewards, "prev_reward_batch", check_kind=False)
        if prev_rewards.shape not in ((batch_size,), (batch_size, 1)):
            raise ValueError(
                f"prev_reward_batch has shape {prev_rewards.shape}, expected "
                f"({batch_size},) (one reward per observation)"
            )
        if prev_rewards.dtype.kind not in "iuf" or not np.all(np.isfinite(prev_rewards)):
            raise ValueError(
                "prev_reward_batch must hold finite numbers, got "
                f"{prev_rewards.dtype} values {prev_rewards.ravel()[:4]}"
            )
        return (
            obs,
            tuple(states),
            self.checked_actions(prev_actions, "prev_action_batch", batch_size),
            prev_rewards.astype(np.float32).reshape(batch_size),
        )

    def checked_actions(self, actions, column: str, batch_size: int | None = None):
        """A batch of actions (nested like the space) as the compiled functions take
        them: each leaf of its spec's dtype, after a structure, shape (B rows, when
        given) and finiteness check; an error names the column and leaf."""
        values = spaces.action_leaf_values(self.action_space, actions, column)
        arrays = []
        for (path, _), (dtype, shape), value in zip(
            self._action_leaves, self._action_specs, values
        ):
            array = numeric_array(value, spaces.action_leaf_column(column, path), check_kind=False)
            rows = array.shape[0] if batch_size is None and array.ndim else batch_size
            if array.shape != (rows, *shape):
                raise ValueError(
                    f"{spaces.action_leaf_column(column, path)} has shape {array.shape}, "
                    f"expected {(rows, *shape)} (one action per observation)"
                )
            if array.dtype.kind not in "iuf" or (
                array.dtype.kind == "f" and not np.all(np.isfinite(array))
            ):
                raise ValueError(
                    f"{spaces.action_leaf_column(column, path)} must hold finite numbers, "
                    f"got dtype {array.dtype}"
                )
            arrays.append(array.astype(dtype, copy=False))
        return spaces.nest_actions(self.action_space, arrays)

    def _action_arrays(self, actions):
        """Computed actions (tensors, nested like the space) as numpy arrays of the
        space's dtypes."""
        leaves = tf.nest.flatten(actions)
        return spaces.nest_actions(
            self.action_space,
            [
                a.numpy().astype(dtype, copy=False)
                for a, (dtype, _) in zip(leaves, self._action_specs)
            ],
        )

    def _example_input_dict(self, rows: int) -> dict:
        """An acting input dict of `rows` zero observations (initial states)."""
        obs = np.zeros((rows,) + tuple(self.preprocessor.shape), np.float32)
        inputs = self.acting_inputs(obs, None, None, None, rows)
        return self.acting_input_dict(*tree.map_structure(tf.convert_to_tensor, inputs))

    def acting_signature(self) -> list:
        """TensorSpecs of the acting inputs: obs <float32>[B, *obs], states (tuple of
        <float32>[B, *state]), prev_actions [B, *action] (nested like the action space)
        and prev_rewards <float32>[B]."""
        return [
            tf.TensorSpec((None,) + tuple(self.preprocessor.shape), tf.float32),
            tuple(tf.TensorSpec((None,) + s.shape, tf.float32) for s in self._initial_state),
            models.action_tensor_specs(self.action_space),
            tf.TensorSpec((None,), tf.float32),
        ]

    def acting_input_dict(self, obs, states, prev_actions, prev_rewards) -> dict:
        """The model's input dict for acting: one-step sequences when recurrent."""
        input_dict = {
            SampleBatch.OBS: obs,
            SampleBatch.PREV_ACTIONS: prev_actions,
            SampleBatch.PREV_REWARDS: prev_rewards,
        }
        if states:
            input_dict[SampleBatch.SEQ_LENS] = tf.ones(tf.shape(obs)[:1], tf.int32)
            input_dict.update({f"state_in_{i}": s for i, s in enumerate(states)})
        return input_dict

    def _act_graph(self, obs, states, prev_actions, prev_rewards, explore, timestep):
        """The acting computation, traced by `_compile_action_fn` (and by XLA for an env
        runner's fixed rows, `act_with_xla`)."""
        seed = self._action_rng.make_seeds(1)[:, 0]  # in-graph: no extra eager op per call
        input_dict = self.acting_input_dict(obs, states, prev_actions, prev_rewards)
        out = self.model(input_dict, training=False)
        dist = self.dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        actions, logp = self.exploration.choose(dist, explore, timestep, seed)
        extra = {
            SampleBatch.ACTION_DIST_INPUTS: out[SampleBatch.ACTION_DIST_INPUTS],
            SampleBatch.ACTION_LOGP: logp,
            SampleBatch.ACTION_PROB: tf.exp(logp),
        }
        if SampleBatch.VF_PREDS in out:
            extra[SampleBatch.VF_PREDS] = out[SampleBatch.VF_PREDS]
        extra.update(self.extra_action_out(input_dict, out, dist))
        return actions, list(out.get("state_out", [])), extra

    def _action_signature(self) -> list:
        return self.acting_signature() + [tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.int64)]

    def _compile_action_fn(self):
        # No AutoGraph, as in the training step (towers.py): acting is tf.where, and
        # converting every function it calls made each policy's build ~0.1 s slower
        return FlatCall(
            tf.function(self._act_graph, input_signature=self._action_signature(), autograph=False)
        )

    def act_with_xla(self, *row_counts: int, when_first_used: bool = False) -> bool:
        """Act on calls of up to max(row_counts) rows through XLA twins of the acting
        function, one per row count (engine/fixed_rows.py: a call pads to the smallest
        that fits); larger calls keep TensorFlow's executor. An env runner names its
        vector's size; a server a ladder of batch sizes, each compiled `when_first_used`
        (~0.35 s on a CPU, paid by the first call of its size, on whichever thread makes
        it). -> whether it acts through XLA (at first use: whether it will try): not
        when the config's `acting_xla` is off, nor for a model with convolutions, which
        XLA runs slower on CPUs, nor when XLA cannot compile it (one warning, then the
        executor for every size)."""
        if not getattr(self.config, "acting_xla", False):
            return False
        if has_convolutions(self._action_fn.concrete.graph):
            return False
        self._xla = XlaTwins(self._compile_xla_twin, row_counts, when_first_used)
        return not self._xla.failed

    def xla_twins(self) -> dict[int, FixedRowsCall]:
        """The XLA twins compiled so far, by their row count."""
        return {} if self._xla is None else dict(self._xla.compiled)

    def _compile_xla_twin(self, rows: int) -> FixedRowsCall | None:
        rng_state = self._action_rng.state.numpy()  # the compiling call draws no sample
        with tf.device(self.tower_devices.devices[0]):
            twin = FixedRowsCall.compile(
                self._act_graph, self._action_signature(), rows, f"{type(self).__name__}'s acting"
            )
        self._action_rng.state.assign(rng_state)
        return twin

    def _compile_logp_fn(self):
        def logp(obs, states, prev_actions, prev_rewards, actions):
            input_dict = self.acting_input_dict(obs, states, prev_actions, prev_rewards)
            out = self.model(input_dict, training=False)
            return self.dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(actions)

        signature = self.acting_signature() + [models.action_tensor_specs(self.action_space)]
        return tf.function(logp, input_signature=signature, autograph=False)

    def action_trace_count(self) -> int:
        return self._action_fn.trace_count()

    # ----- learning: `update` is the one path; the RLlib-named methods wrap it ------------

    def scheduled(self, value: float, schedule: list | None):
        """A coefficient as the compiled loss reads it: `value`, or with a schedule
        ([[timestep, value], ...], schedules.py) its value at the global timestep."""
        if schedule is None:
            return value
        return schedule_value(schedule, self.timestep_variable)

    def _tower_loss(self, batch):
        columns = _loss_columns(batch)
        output = self.loss(self.model, self.dist_class, columns)
        return model_hooks.with_custom_loss(self.model, output, columns)

    def _tower_stats(self, batch, losses, loss_stats: dict) -> dict:
        stats = {
            **self.stats(_loss_columns(batch)),
            **loss_stats,
            **model_hooks.model_metrics(self.model),
        }
        stats.setdefault("total_loss", tf.add_n(losses))
        return stats

    @classmethod
    def prepare_train_batch(
        cls, batch: SampleBatch, layout: TrainLayout, fixed_seq_len: bool = False
    ) -> TrainColumns:
        """The batch as the tower stack takes it: checked (`loss_columns`),
        preprocessed, padded columns with "loss_mask" (sequences of max_seq_len
        steps when `fixed_seq_len`). A subclass adds its own checks here: a
        LearnerGroup prepares batches with it in the driver, for any learners."""
        if isinstance(batch, dict) and SampleBatch.SEQ_LENS in batch:
            batch = batch if isinstance(batch, SampleBatch) else SampleBatch(batch)
            sequencing.check_padding_is_empty(batch)
        return prepare_train_columns(
            batch, layout, loss_columns=cls.loss_columns, fixed_seq_len=fixed_seq_len
        )

    def train_layout(self) -> TrainLayout:
        """What `prepare_train_batch` needs to know of this policy."""
        return TrainLayout(
            self.preprocessor,
            self.action_space,
            self.num_state_tensors(),
            self.config.model.max_seq_len,
            self.num_outputs,
        )

    def train_columns(self, batch: SampleBatch, fixed_seq_len: bool = False) -> TrainColumns:
        return type(self).prepare_train_batch(batch, self.train_layout(), fixed_seq_len)

    def _learn(
        self, batch: SampleBatch, num_epochs: int | None, shuffle: bool, buffer_index: int
    ) -> dict:
        train = self.train_columns(batch, fixed_seq_len=num_epochs is not None)
        return valid_rows_only(
            self.update_on_train_columns(train, num_epochs, shuffle, buffer_index), train
        )

    def update_on_train_columns(
        self,
        train: TrainColumns,
        num_epochs: int | None,
        shuffle: bool,
        buffer_index: int,
        minibatch_size: int | None = None,
    ) -> dict:
        """`update` on a batch `prepare_train_batch` made -> statistics, with PER_ROW
        over all of `train`'s rows (padding included). minibatch_size: rows per
        minibatch on this policy's towers (default: the config's; a learner of N
        takes 1/N of the group's)."""
        self._last_learned = train
        if num_epochs is None:
            self._sync_timestep()
            stats = self.towers.learn(self._placed(train))
            self.num_grad_updates += 1
        else:
            call_arguments.num_epochs(num_epochs, self.config.num_epochs)
            self.load_train_columns_into_buffer(train, buffer_index, minibatch_size)
            stats = self.learn_on_loaded_epochs(num_epochs, buffer_index, shuffle)
        stats[NUM_GRAD_UPDATES_LIFETIME] = self.num_grad_updates
        return first_rows(stats, len(train.columns[LOSS_MASK]))

    def compute_gradients(self, batch: SampleBatch):
        """-> (combined, clipped gradients aligned with model.trainable_variables, stats)."""
        return self.compute_gradients_on_train_columns(self.train_columns(batch))

    def compute_gradients_on_train_columns(self, train: TrainColumns):
        self._sync_timestep()
        return self.towers.compute_gradients(self._placed(train))

    def _sync_timestep(self) -> None:
        """The timestep variable (what schedules read) set to `global_timestep`, which
        acting and the algorithm's counts move, when it changed since the last call."""
        if self.global_timestep != self._timestep_in_variable:
            self.timestep_variable.assign(self.global_timestep)
            self._timestep_in_variable = self.global_timestep

    def _placed(self, train: TrainColumns) -> tuple:
        return self.towers.place(self.towers.shard(train.columns, train.units))

    def apply_gradients(self, gradients) -> None:
        gradients = call_arguments.gradient_lists(gradients)
        self._sync_timestep()
        self.towers.apply_gradients(gradients)
        self.num_grad_updates += 1
        self._last_learned = gradients

    def last_gradients(self) -> dict[str, np.ndarray]:
        """For TensorBoard: the gradients of the last learning call by trainable
        variable name ("<i>/<name>" with several loss groups, i the group): the
        combined, clipped gradients of its batch at the present weights, or the
        gradients it applied; {} before any. The model's seed generators are put back
        afterwards, so a run that looks at its gradients trains as one that does not."""
        if self._last_learned is None:
            return {}
        if isinstance(self._last_learned, TrainColumns):
            seeds = [v.numpy() for v in self._model_rngs.values()]
            grads, _ = self.compute_gradients_on_train_columns(self._last_learned)
            for variable, value in zip(self._model_rngs.values(), seeds):
                variable.assign(value)
        else:
            grads = self._last_learned
        per_group = grads if len(self.towers.groups) > 1 else [grads]
        names = dict(zip(map(id, self._weight_variables), self._weight_names))
        trainable = [names[id(v)] for v in self.towers.variables]
        return {
            name if len(per_group) == 1 else f"{i}/{name}": np.asarray(g)
            for i, group in enumerate(per_group)
            for name, g in zip(trainable, group)
            if g is not None
        }

    def load_batch_into_buffer(self, batch: SampleBatch, buffer_index: int = 0) -> int:
        """Pad, shard and place a batch on the tower devices -> rows loaded (padding in)."""
        rows = self.load_train_columns_into_buffer(
            self.train_columns(batch, fixed_seq_len=True), buffer_index
        )
        self._loaded_sampler_counts[buffer_index] = sampler_grad_updates(batch)
        return rows

    def load_train_columns_into_buffer(
        self, train: TrainColumns, buffer_index: int = 0, minibatch_size: int | None = None
    ) -> int:
        """minibatch_size: rows per minibatch on this policy's towers (default: the
        config's; a learner of N takes 1/N of the group's)."""
        self._last_learned = train
        rows = self.towers.load(
            train.columns,
            train.units,
            train.rows_per_unit,
            minibatch_size or self.config.minibatch_size,
            call_arguments.buffer_index(buffer_index),
        )
        self._loaded_sampler_counts[buffer_index] = None  # prepared columns name no sampler
        return rows

    def get_num_samples_loaded_into_buffer(self, buffer_index: int = 0) -> int:
        buffer = self.towers.buffers.get(call_arguments.buffer_index(buffer_index))
        return 0 if buffer is None else buffer.num_rows

    def learn_on_loaded_batch(self, offset: int = 0, buffer_index: int = 0) -> dict:
        """One SGD step on the minibatch at row `offset` of the loaded buffer (with
        num_grad_accumulation_steps K: on the K minibatches from there) -> statistics
        in RLlib's layout (learning_results.rllib_layout), the lead over the sampler
        of the batch `load_batch_into_buffer` loaded included."""
        self._sync_timestep()
        stats = self.towers.learn_loaded(
            call_arguments.count(offset, "offset"), call_arguments.buffer_index(buffer_index)
        )
        self.num_grad_updates += 1
        return rllib_layout(
            {**stats, NUM_GRAD_UPDATES_LIFETIME: self.num_grad_updates},
            self._loaded_sampler_counts.get(buffer_index),
        )

    def learn_on_loaded_epochs(
        self, num_epochs: int | None = None, buffer_index: int = 0, shuffle: bool = True
    ) -> dict:
        """All epochs of minibatch SGD over a loaded buffer in one compiled call."""
        epochs = call_arguments.num_epochs(num_epochs, self.config.num_epochs)
        buffer_index = call_arguments.buffer_index(buffer_index)
        self._sync_timestep()
        try:
            stats = self.towers.learn_loaded_epochs(epochs, buffer_index, shuffle)
        except NonFiniteGradientError as err:
            self.num_grad_updates += err.steps_applied
            raise
        self.num_grad_updates += stats["num_sgd_steps"]
        return stats

    # ----- the target network (when the policy opts in) --------------------------------

    def target_model_out(self, input_dict: dict) -> dict:
        """The model's outputs under the target weights (training=False, no gradient);
        for the loss, which may call it on any tower, e.g. on {"obs": new_obs}."""
        return self._target().outputs(input_dict)

    def target_call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), a function of the model (SAC's Q networks), under the
        target weights, no gradient; for the loss, like target_model_out."""
        return self._target().call(fn, *args, **kwargs)

    def get_target_weights(self) -> dict[str, np.ndarray]:
        """The target's values, named as get_weights() names the model's."""
        return {name: v.numpy() for name, v in zip(self._weight_names, self._target().variables)}

    @property
    def target_age(self) -> int:
        """Applied SGD steps since the target last moved."""
        return int(self._target().age.numpy())

    def _target(self) -> TargetNetwork:
        if self.target_network is None:
            raise ValueError(
                f"{type(self).__name__} keeps no target network "
                "(its target_network_update() returns None)"
            )
        return self.target_network

    # ----- weights and state ----------------------------------------------------------

    def get_weights(self) -> dict[str, np.ndarray]:
        """Every model variable (batch-norm statistics included) by its unique path."""
        return {name: v.numpy() for name, v in zip(self._weight_names, self._weight_variables)}

    def set_weights(self, weights: dict[str, np.ndarray], new_rate: float = 1.0) -> None:
        """Set all model variables to new_rate * given + (1 - new_rate) * current
        (Coach's soft update; 1.0 replaces them); checks everything before changing
        anything. Integer variables, if any, take the given value."""
        new_rate = check_new_rate(new_rate)
        targets = dict(zip(self._weight_names, self._weight_variables))
        arrays = _checked_arrays(targets, weights, "weights")
        if new_rate < 1.0:
            arrays = {
                name: _blend(value, targets[name].numpy(), new_rate)
                for name, value in arrays.items()
            }
        if self._weights_writer is None:
            self._weights_writer = VariableWriter(self._weight_variables)
        self._weights_writer([arrays[name] for name in self._weight_names])

    def _optimizer_variables(self) -> dict:
        # by position only: Keras names optimizer slots after the optimizer's and the
        # model's auto-numbered names, which differ between processes and policies;
        # shapes are still checked on restore
        return {
            f"optimizer_{i}/{j}": v
            for i, opt in enumerate(self._optimizers)
            for j, v in enumerate(opt.variables)
        }

    def get_state(self) -> dict:
        """Weights, optimizer variables, exploration and RNG state, global timestep, and
        the observation filter's statistics (MeanStdFilter)."""
        return {
            "weights": self.get_weights(),
            "optimizer_variables": {k: v.numpy() for k, v in self._optimizer_variables().items()},
            "rng": {
                "action": self._action_rng.state.numpy(),
                "shuffle": self.towers.shuffle_rng.state.numpy(),
                **{name: v.numpy() for name, v in self._model_rngs.items()},
            },
            "exploration": self.exploration.get_state(),
            "global_timestep": int(self.global_timestep),
            "num_grad_updates": int(self.num_grad_updates),
            **self._target_state(),
            **observation_filters.filter_state(self.observation_filter),
            **self._steps_applied_state(),
            "config": _config_to_json(self.config),
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "policy_class": checkpoints.class_path(type(self)),
        }

    def _target_state(self) -> dict:
        if self.target_network is None:
            return {}
        return {"target_weights": self.get_target_weights(), "target_age": self.target_age}

    def _steps_applied_state(self) -> dict:
        counter = self.towers.steps_applied
        return {} if counter is None else {"steps_applied": int(counter.numpy())}

    def check_state(self, state: dict) -> None:
        """Raise, naming the entry, if `state` cannot be set on this policy."""
        self._checked_state(state)
        observation_filters.checked_filter_stats(self.observation_filter, state)
        self.check_extra_state(state)

    def check_extra_state(self, state: dict) -> None:
        """Check the entries a subclass adds to get_state(); set_state calls it before
        it changes anything, so an override keeps set_state all-or-nothing."""

    def set_state(self, state: dict) -> None:
        """Set a get_state() result: all of it, or (on any bad entry) nothing."""
        targets, arrays, new_exploration = self._checked_state(state)
        filter_stats = observation_filters.checked_filter_stats(self.observation_filter, state)
        self.check_extra_state(state)
        _assign(targets, arrays)
        if filter_stats is not None:
            self.observation_filter.sync(filter_stats)
        if new_exploration is not None:
            self.exploration = new_exploration
            self._action_fn = self._compile_action_fn()
            if self._xla is not None:
                self._xla = self._xla.rebuilt()
        self.global_timestep = int(state["global_timestep"])
        self.num_grad_updates = int(state.get("num_grad_updates", 0))

    def _checked_state(self, state: dict) -> tuple[dict, dict, object]:
        """(variables, their checked new values, the new exploration or None)."""
        if not isinstance(state, dict):
            raise TypeError(f"policy state must be a dict, got {type(state).__name__}")
        missing = [
            k for k in ("weights", "optimizer_variables", "global_timestep") if k not in state
        ]
        if missing:
            raise ValueError(f"policy state is missing {missing}")
        named, own = state.get("policy_class"), checkpoints.class_path(type(self))
        if named is not None and checkpoints.current_class_path(named) != own:
            raise ValueError(f"policy state is of {named}, not of this policy's class {own}")
        for key in ("global_timestep", "num_grad_updates", "target_age", "steps_applied"):
            value = state.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(
                    f"policy state entry {key!r} must be an integer >= 0, got {value!r}"
                )
        for group in ("weights", "optimizer_variables", "rng", "target_weights"):
            if not isinstance(state.get(group, {}), dict):
                raise TypeError(
                    f"policy state entry {group!r} must be a dict of arrays, "
                    f"got {type(state[group]).__name__}"
                )
        targets = {
            **{f"weights/{k}": v for k, v in zip(self._weight_names, self._weight_variables)},
            **{f"optimizer/{k}": v for k, v in self._optimizer_variables().items()},
        }
        values = {
            **{f"weights/{k}": v for k, v in state["weights"].items()},
            **{f"optimizer/{k}": v for k, v in state["optimizer_variables"].items()},
        }
        self._add_target_state(state, targets, values)
        self._add_steps_applied(state, targets, values)
        rngs = state.get("rng", {})
        for name, rng in (("action", self._action_rng), ("shuffle", self.towers.shuffle_rng)):
            if name in rngs:
                targets[f"rng/{name}"] = rng.state
                values[f"rng/{name}"] = _checked_rng_state(rngs[name], name)
        for name, variable in self._model_rngs.items():
            if name in rngs:
                targets[f"rng/{name}"] = variable
                values[f"rng/{name}"] = np.asarray(rngs[name])
        arrays = _checked_arrays(targets, values, "policy state")
        new_exploration = None
        if "exploration" in state:
            try:
                new_exploration = exploration.make_exploration(
                    self.action_space, state["exploration"]
                )
            except (TypeError, ValueError) as err:
                raise ValueError(f"policy state entry 'exploration': {err}") from None
        return targets, arrays, new_exploration

    def _add_target_state(self, state: dict, targets: dict, values: dict) -> None:
        """Add the target's variables and new values (and its age) to what set_state assigns."""
        if self.target_network is None:
            if state.get("target_weights"):
                raise ValueError(
                    "policy state has 'target_weights' but this policy keeps no target network"
                )
            return
        missing = [k for k in ("target_weights", "target_age") if k not in state]
        if missing:
            raise ValueError(
                f"policy state is missing {missing} (this policy keeps a target network)"
            )
        targets.update(
            {
                f"target_weights/{k}": v
                for k, v in zip(self._weight_names, self.target_network.variables)
            }
        )
        values.update({f"target_weights/{k}": v for k, v in state["target_weights"].items()})
        targets["target_age"] = self.target_network.age
        values["target_age"] = np.int64(state["target_age"])

    def _add_steps_applied(self, state: dict, targets: dict, values: dict) -> None:
        """Add the applied-step count (kept when a loss group is applied every N steps)."""
        counter = self.towers.steps_applied
        if counter is None:
            if "steps_applied" in state:
                raise ValueError(
                    "policy state has 'steps_applied' but no loss group of this policy "
                    "is applied every N steps"
                )
            return
        if "steps_applied" not in state:
            raise ValueError(
                "policy state is missing ['steps_applied'] (a loss group of this policy "
                "is applied every N steps)"
            )
        targets["steps_applied"] = counter
        values["steps_applied"] = np.int64(state["steps_applied"])

    @classmethod
    def from_state(cls, state: dict) -> TFPolicy:
        """A new policy (of the class named in the state) with that exact state."""
        named = checkpoints.resolve_class(
            state.get("policy_class") or checkpoints.class_path(cls), TFPolicy
        )
        if not issubclass(named, cls):
            raise ValueError(
                f"the state is of {checkpoints.class_path(named)}, which is not "
                f"{checkpoints.class_path(cls)} or a subclass of it"
            )
        policy = named(
            space_from_json(state["observation_space"]),
            space_from_json(state["action_space"]),
            checkpoints.stored_config(state["config"]),
        )
        policy.set_state(state)
        return policy

    def export_checkpoint(self, export_dir: str) -> None:
        """Write the policy state atomically: arrays in npz, the rest in JSON."""
        with checkpoints.atomic_directory(export_dir) as tmp:
            checkpoints.write_policy_state(tmp, self.get_state())

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> TFPolicy:
        return cls.from_state(checkpoints.read_policy_state(checkpoint_dir))

    @classmethod
    def from_rllib_checkpoint(
        cls,
        path: str,
        policy_id: str | None = None,
        config: dict | None = None,
        weight_map: dict[str, str | None] | None = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
    ) -> TFPolicy:
        """A policy of this class from an RLlib old-stack checkpoint (algorithm or policy
        directory), read without running anything in its pickles: RLlib's model and
        training keys, weights, global timestep and MeanStdFilter statistics.
        `config` goes over what RLlib's gives; `weight_map` ({RLlib variable: ours})
        is for a custom model (policy/rllib_import.py maps the catalog models)."""
        from policy_service.policy.rllib_import import policy_from_rllib

        return policy_from_rllib(
            cls,
            path,
            policy_id=policy_id,
            config=config,
            weight_map=weight_map,
            observation_space=observation_space,
            action_space=action_space,
        )

    def export_model(self, export_dir: str, onnx: int | None = None) -> None:
        """A SavedModel acting like compute_actions (explore, timestep, state), and
        model.onnx of the deterministic path with `onnx=OPSET` (see io/export.py)."""
        from policy_service.io.export import export_saved_model

        export_saved_model(self, export_dir, onnx)

    def import_model_from_h5(self, path: str) -> None:
        """Load model weights saved by Keras (`model.save_weights("x.weights.h5")`)."""
        before = self.get_weights()
        try:
            self.model.load_weights(path)
        except Exception:
            self.set_weights(before)
            raise


def _loss_columns(batch: dict) -> dict:
    """A tower's batch as losses and stats read it: observations as floats, nested
    columns put back together."""
    return nest_columns(float_observations(batch))


def float_observations(batch: dict) -> dict:
    """A tower's batch with integer observation columns (uint8 frames, which stay
    compact on their way to the device: spaces.transform_compact) cast to float32,
    as models and losses take observations."""
    cast = {
        column: tf.cast(batch[column], tf.float32)
        for column in (SampleBatch.OBS, SampleBatch.NEXT_OBS)
        if column in batch and batch[column].dtype.is_integer
    }
    return {**batch, **cast} if cast else batch


def numeric_array(value, name: str, check_kind: bool = True) -> np.ndarray:
    """`value` as one numpy array, or a one-line ValueError naming the argument: a
    ragged nest cannot be one array; with check_kind, strings and objects are refused
    (numpy's "could not convert string to float" names nothing)."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{name} cannot be read as one array of numbers ({str(err).splitlines()[0]})"
        ) from None
    if check_kind and array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers, got dtype {array.dtype}")
    return array


def _checked_rng_state(value, name: str) -> np.ndarray:
    """A saved Generator state: integers only (a float such as 1e30 would be cast
    to an arbitrary state)."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or (
        array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max
    ):
        raise ValueError(
            f"policy state entry 'rng/{name}' must hold int64 values (a random "
            f"generator's state), got {array.dtype} {array.ravel()[:3].tolist()}"
        )
    return array.astype(np.int64)


def check_new_rate(new_rate) -> float:
    """set_weights' new_rate: a finite number in (0, 1]."""
    if (
        isinstance(new_rate, (bool, np.bool_))
        or not isinstance(new_rate, (int, float, np.integer, np.floating))
        or not np.isfinite(new_rate)
        or not 0.0 < new_rate <= 1.0
    ):
        raise ValueError(f"new_rate must be a finite number in (0, 1], got {new_rate!r}")
    return float(new_rate)


def _blend(given: np.ndarray, current: np.ndarray, rate: float) -> np.ndarray:
    """rate * given + (1 - rate) * current in the variable's float dtype."""
    if given.dtype.kind != "f":
        return given
    return (rate * given + (1.0 - rate) * current).astype(given.dtype)


def _is_rng_state(variable) -> bool:
    """Keras seed-generator state: RNG bookkeeping, not a weight, and named by a
    process-global counter, so it must not enter weight sync."""
    return variable.path.endswith("seed_generator_state")


def _unique(names: list[str]) -> list[str]:
    """Names made unique by suffixing a repeat with its position."""
    names = list(names)
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            names[i] = f"{name}#{i}"
        seen.add(names[i])
    return names


def _checked_arrays(targets: dict, values, what: str) -> dict:
    """The values as arrays of their variables' dtypes, once every name, shape,
    dtype and value checks out; else an error naming the entry."""
    if not isinstance(values, dict):
        raise TypeError(f"{what} must be a dict of name -> array, got {type(values).__name__}")
    missing = sorted(set(targets) - set(values))
    unexpected = sorted(set(values) - set(targets))
    if missing or unexpected:
        raise ValueError(
            f"{what} do not match the policy: missing {missing}, unexpected {unexpected}"
        )
    arrays = {}
    for name, var in targets.items():
        value = np.asarray(values[name])
        if value.shape != tuple(var.shape):
            raise ValueError(
                f"{what} entry {name!r} has shape {value.shape}, expected {tuple(var.shape)}"
            )
        expected = np.dtype(var.dtype.name if hasattr(var.dtype, "name") else var.dtype)
        if not np.can_cast(value.dtype, expected, casting="same_kind"):
            raise ValueError(f"{what} entry {name!r} has dtype {value.dtype}, expected {expected}")
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise ValueError(f"{what} entry {name!r} contains NaN or inf")
        arrays[name] = value.astype(expected)
    return arrays


def _assign(targets: dict, arrays: dict) -> None:
    for name, var in targets.items():
        var.assign(arrays[name])


def _config_to_json(config) -> dict:
    """The config as JSON holds it: an exploration class given as "type" by its name."""
    as_dict = dataclasses.asdict(config)
    as_dict["exploration_config"] = exploration.named_exploration_config(
        as_dict["exploration_config"]
    )
    return as_dict
