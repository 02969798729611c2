"""An exact resume of an offline run: the checkpoint keeps the read position (pass,
chunks read, shuffle buffer, generators; policy_service/offline/read_position.py), so
k iterations, save, restore in a new algorithm and N - k more give the weights of N
iterations straight, through a shuffle buffer, a pass's end and MARWIL's postprocessing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from offline_datasets import episodes, multi_agent_bc_config, scripted_output, write

from algorithms.bc import BC
from algorithms.marwil import MARWIL, MARWILConfig, MARWILPolicy
from policy_service.config import from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.offline import read_position
from policy_service.offline.offline_runner_type import build

ITERATIONS, SAVED_AT = 7, 3  # 7 x 64 rows: past the end of the 400 rows' first pass


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    return write(tmp_path_factory.mktemp("logged"), [episodes(10, 0), episodes(10, 1)])


def config(logged, **changes) -> dict:
    return {
        "input": str(logged),
        "train_batch_size": 64,
        "minibatch_size": 32,
        "num_epochs": 2,
        "shuffle_buffer_size": 100,
        "seed": 0,
        "model": {"fcnet_hiddens": [8]},
        **changes,
    }


def runners(logged, **changes):
    """The runners a MARWIL run reads with: its postprocessing (returns bootstrapped by
    the value head) runs on each chunk before the shuffle buffer."""
    return build(from_dict(MARWILConfig, config(logged, **changes)), MARWILPolicy, 0, env=None)


def weights_after(
    algo_cls, config: dict, iterations: int, restore: str | None = None, save_at=None, save_to=None
) -> dict:
    """Each policy's weights after `iterations` (from `restore` if given), saving to
    `save_to` after `save_at` of them (a save must not move the reading either)."""
    algo = algo_cls(config)
    try:
        if restore is not None:
            algo.restore(restore)
        for iteration in range(1, iterations + 1):
            algo.train()
            if iteration == save_at:
                algo.save(str(save_to))
        return {p: algo.get_policy(p).get_weights() for p in config.get("policies") or [None]}
    finally:
        algo.stop()


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for policy_id in a:
        assert a[policy_id].keys() == b[policy_id].keys()
        for name in a[policy_id]:
            np.testing.assert_array_equal(a[policy_id][name], b[policy_id][name], err_msg=name)


@pytest.mark.parametrize("saved_at", [3, 7])  # before a pass's end; with its rows carried
def test_the_read_goes_on_where_the_checkpoint_left_it(logged, tmp_path, saved_at):
    """The runners alone: k samples, the position saved and loaded, a new reader (of
    the files moved elsewhere) set to it gives the rows (and their postprocessed
    columns) the first one goes on with."""
    first = runners(logged, shuffle_buffer_size=100, train_batch_size=64)
    for _ in range(saved_at):
        first.sample()
    assert (first.read_positions()["default_policy"].carried is not None) == (saved_at == 7)
    entry = read_position.save(first.read_positions(), tmp_path)
    moved = shutil.copytree(logged, tmp_path / "moved")  # the same files elsewhere
    second = runners(moved, shuffle_buffer_size=100, train_batch_size=64)
    second.set_read_positions(read_position.load(tmp_path, json.loads(json.dumps(entry))))
    for _ in range(10 - saved_at):  # 640 of the 400 rows: into the second pass
        expected, got = first.sample()[0], second.sample()[0]
        assert got.keys() == expected.keys()
        for column in expected:
            np.testing.assert_array_equal(got[column], expected[column], err_msg=column)
    assert first.passes == second.passes == 1
    first.stop()
    second.stop()


def test_a_resume_in_a_later_pass_reads_the_passes_the_run_went_on_with(logged, tmp_path):
    """The reader asks for the next pass's seed one pass early (its read starts as the
    pass before begins): positions saved in passes 1 and 2 and at pass 3's very end,
    restored, give the rows the run went on with, across the ends of passes after it."""
    first = runners(logged, shuffle_buffer_size=100, train_batch_size=64)
    saved_at = {7: 1, 13: 2, 25: 3}  # sample -> its pass (400 rows: 25 x 64 end pass 3)
    straight, entries = [], {}
    for i in range(28):
        if i in saved_at:
            assert first.passes == saved_at[i]
            (tmp_path / str(i)).mkdir()
            entries[i] = json.dumps(read_position.save(first.read_positions(), tmp_path / str(i)))
        straight.append(first.sample()[0])
    first.stop()
    assert first.passes == 4
    for i in saved_at:
        second = runners(logged, shuffle_buffer_size=100, train_batch_size=64)
        second.sample()  # a runner reading already, its pass read ahead
        second.set_read_positions(read_position.load(tmp_path / str(i), json.loads(entries[i])))
        for expected in straight[i:]:
            got = second.sample()[0]
            assert got.keys() == expected.keys()
            for column in expected:
                np.testing.assert_array_equal(got[column], expected[column], err_msg=column)
        assert second.passes == 4
        second.stop()


@pytest.mark.slow  # 9-11 s on 2 busy cores (load 7.5): 3 MARWIL algorithms
def test_k_iterations_save_restore_and_the_rest_give_the_straight_runs_weights(logged, tmp_path):
    """MARWIL: a shuffle buffer, postprocessing with the value head of its time, the
    moving average of squared advantages, a pass's end between the save and the end."""
    checkpoint = tmp_path / "ckpt"
    straight = weights_after(MARWIL, config(logged), ITERATIONS, save_at=SAVED_AT,
                             save_to=checkpoint)  # fmt: skip
    resumed = weights_after(MARWIL, config(logged), ITERATIONS - SAVED_AT, str(checkpoint))
    assert_same(straight, resumed)
    # the same checkpoint without its read position reads from the start: other weights
    shutil.copytree(checkpoint, tmp_path / "no_position")
    state_file = tmp_path / "no_position" / "algorithm_state.json"
    state = json.loads(state_file.read_text())
    del state["input_position"]
    state_file.write_text(json.dumps(state))
    from_start = weights_after(MARWIL, config(logged), ITERATIONS - SAVED_AT,
                               str(tmp_path / "no_position"))  # fmt: skip
    with pytest.raises(AssertionError):
        assert_same(straight, from_start)


@pytest.mark.slow  # 9-11 s on 2 busy cores (load 7.5): 2 BC algorithms of two policies
def test_a_multi_agent_run_resumes_each_policys_reading(tmp_path):
    scripted_output(tmp_path / "data", episodes=30, correct=0.5)  # 240 rows per policy
    ma = multi_agent_bc_config(tmp_path / "data", shuffle_buffer_size=50, num_epochs=2)
    straight = weights_after(BC, ma, 5, save_at=2, save_to=tmp_path / "ckpt")
    assert_same(straight, weights_after(BC, ma, 3, str(tmp_path / "ckpt")))


def test_a_changed_train_batch_size_reads_on_with_the_same_rows(logged, tmp_path):
    """Another sample size (a PBT explore) goes on from the same place in the pass:
    the rows kept are drawn anew, none lost or read twice."""
    first = runners(logged, shuffle_buffer_size=100, train_batch_size=64)
    seen = [row for _ in range(3) for row in ordered_rows(first.sample()[0])]
    entry = read_position.save(first.read_positions(), tmp_path)
    first.stop()
    second = runners(logged, shuffle_buffer_size=100, train_batch_size=50)
    second.set_read_positions(read_position.load(tmp_path, json.loads(json.dumps(entry))))
    for _ in range(4):  # 200 of the pass's last 208 rows
        seen += ordered_rows(second.sample()[0])
    seen += ordered_rows(second.sample()[0])[:8]  # its first 8: the pass's last rows
    second.stop()
    assert len(seen) == len(set(seen)) == 400  # every logged row once


def ordered_rows(batch) -> list:
    return list(zip(batch[SampleBatch.EPS_ID].tolist(), batch[SampleBatch.T].tolist()))


def test_a_read_position_of_other_files_is_one_line(logged, tmp_path):
    algo = BC(config(logged))
    try:
        algo.train()
        checkpoint = algo.save(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    other = write(tmp_path / "other", [episodes(10, 2)])
    algo = BC(config(other))
    try:
        before = algo.get_policy().get_weights()
        with pytest.raises(CheckpointFileError) as err:
            algo.restore(checkpoint)
        after = algo.get_policy().get_weights()
    finally:
        algo.stop()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"{checkpoint}/algorithm_state.json: input_position: the read position is of files ['part-"
    )
    assert message.endswith("resume with the input the run read")
    assert_same({"p": before}, {"p": after})  # nothing was assigned


def test_an_iteration_that_failed_after_reading_leaves_no_checkpoint(logged, tmp_path):
    """save_after_failure writes the last whole iteration only when nothing moved since:
    a sample moved the read position, so it writes none (the run resumes from its last
    checkpoint, whose position is that iteration's)."""
    algo = BC(config(logged))
    try:
        algo.train()

        def failing_update(learners, batch):
            raise RuntimeError("the learner failed")

        algo.update_on_batch = failing_update  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            algo.train()
        assert algo.save_after_failure(str(tmp_path / "after_failure")) is None
    finally:
        algo.stop()
