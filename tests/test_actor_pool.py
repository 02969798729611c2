"""ActorPool on a real local Ray, with small actors killed by ray.kill: a death told
apart from an actor's own error and from a hang, the dead member replaced and made
whole within the budget, a replacement that dies starting counted and tried again,
and a spent budget one line naming the actor, its deaths and the budget's key.

(The learners on the pool: test_learner_restarts.py; the PolicyActor: test_restarts.py.)"""

from __future__ import annotations

import os

import pytest
import ray
from fakes import assert_one_line

from policy_service.distributed.actor_pool import (
    ActorDied,
    ActorPool,
    Outcome,
    PoolStopped,
    RestartBudget,
    call_while_restarted,
    gather,
)
from policy_service.errors import RunFailure

# ray_local sends this module's actors by value: workers cannot import it
PICKLE_BY_VALUE = True


@ray.remote(num_cpus=0)
class Counter:
    """Holds a number; dies as it starts when told to (a replacement dying starting)."""

    def __init__(self, die_starting: bool = False):
        if die_starting:
            os._exit(1)
        self.value = 0

    def set(self, value: int) -> int:
        self.value = value
        return value

    def get(self) -> int:
        return self.value

    def fail(self) -> None:
        raise ValueError("the actor's own error")

    def exit(self) -> None:
        """The process ends: calls sent after this one meet the death, or the restart."""
        os._exit(1)

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(seconds)


class CounterFailure(RunFailure):
    """The test role's budget line."""


def counters_pool(deaths_starting: int = 0) -> ActorPool:
    """One Counter; its first `deaths_starting` replacements die as they start."""
    started = []

    def start(slot: int):
        started.append(slot)
        return Counter.remote(die_starting=len(started) <= deaths_starting)

    return ActorPool([Counter.remote()], start, ray.kill, CounterFailure, "replacing it")


def read(pool: ActorPool) -> int:
    """The member's value; its death as ActorDied (what a role tells the pool)."""
    [result] = gather([pool.member().get.remote()])
    if result.outcome is Outcome.DIED:
        raise ActorDied(f"counter died: {type(result.error).__name__}", "counter 0")
    return result.get()


def kill(actor) -> None:
    """ray.kill, returning once the actor is gone (a call sent after the kill could
    otherwise still be served)."""
    ray.kill(actor)
    while gather([actor.get.remote()])[0].outcome is not Outcome.DIED:
        pass


def set_value(value: int, member) -> None:
    ray.get(member.set.remote(value))


PER_CALL = RestartBudget(per_call=2, per_call_key="max_restarts_per_read")


def test_gather_tells_a_death_from_the_actors_own_error_and_a_hang(ray_local):
    alive, dead, hung = Counter.remote(), Counter.remote(), Counter.remote()
    ray.get([alive.set.remote(3), dead.get.remote(), hung.get.remote()])
    kill(dead)
    results = gather([alive.get.remote(), dead.get.remote(), alive.fail.remote()])
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.DIED, Outcome.RAISED]
    assert results[0].get() == 3 and [r.slot for r in results] == [0, 1, 2]
    with pytest.raises(ValueError, match="the actor's own error"):
        results[2].get()
    [asleep] = gather([hung.sleep.remote(60)], timeout_s=0.5)
    assert asleep.outcome is Outcome.HUNG
    # the first failure ends the wait: the others are left unwaited, not called hung
    first = gather([dead.get.remote(), hung.get.remote()], stop_at_failure=True)
    assert [r.outcome for r in first] == [Outcome.DIED, Outcome.UNWAITED]
    for actor in (alive, hung):
        ray.kill(actor)


def test_a_killed_member_is_replaced_made_whole_and_the_call_made_again(ray_local):
    pool = counters_pool()
    try:
        ray.get(pool.member().set.remote(7))
        victim = pool.member()
        kill(victim)
        value = pool.call(
            "read()", lambda: read(pool), PER_CALL, snapshot=lambda _: 7, install=set_value
        )
        assert value == 7 and pool.num_restarts == 1 and pool.member() is not victim
        assert (
            pool.call(
                "read()", lambda: read(pool), PER_CALL, snapshot=lambda _: 0, install=set_value
            )
            == 7
        )
        assert pool.num_restarts == 1  # a call that finds it alive replaces nothing
    finally:
        pool.stop()


def test_a_replacement_started_in_the_background_is_kept_by_the_pool_until_up(ray_local):
    budget = RestartBudget(per_call=2, per_call_key="max_restarts_per_read")
    pool = counters_pool(deaths_starting=1)
    try:
        dead = pool.member()
        kill(dead)
        error = gather([dead.get.remote()])[0].error
        assert error is not None

        def up(_, new):
            return new.set.remote(4)

        pool.replace_in_background(0, "read()", error, budget, "counter 0", up)
        assert pool.member() is dead and pool.starting() == [0]  # the caller goes on meanwhile
        # the first replacement died starting: the pool started the next attempt, installed
        assert pool.install_started(wait=True) == [0]
        assert pool.num_restarts == 2 and pool.starting() == [] and read(pool) == 4
        with pytest.raises(CounterFailure, match=r"^counter 0 died 3 times during one read\(\)"):
            pool.replace_in_background(0, "read()", error, budget, "counter 0", up, attempt=3)
    finally:
        pool.stop()


def test_a_replacement_dying_as_it_starts_is_counted_and_tried_again(ray_local):
    pool = counters_pool(deaths_starting=1)
    try:
        kill(pool.member())
        # the first replacement dies before set(): the install fails with its death
        value = pool.call(
            "read()", lambda: read(pool), PER_CALL, snapshot=lambda _: 5, install=set_value
        )
        assert value == 5 and pool.num_restarts == 2
    finally:
        pool.stop()


def test_a_replacement_waited_for_that_dies_starting_is_the_next_attempt(ray_local):
    pool = counters_pool(deaths_starting=1)
    try:
        dead = pool.member()
        kill(dead)
        error = gather([dead.get.remote()])[0].error
        assert error is not None
        attempt = pool.replace_when_up(
            0, 1, "read()", error, PER_CALL, "counter 0", lambda _, new: new.set.remote(6)
        )
        assert attempt == 2 and pool.num_restarts == 2 and read(pool) == 6
    finally:
        pool.stop()


def test_a_spent_budget_is_one_line_naming_the_actor_its_deaths_and_the_key(ray_local):
    pool = counters_pool(deaths_starting=5)  # every replacement dies starting
    try:
        kill(pool.member())
        with pytest.raises(CounterFailure) as failure:
            pool.call(
                "read()", lambda: read(pool), PER_CALL, snapshot=lambda _: 9, install=set_value
            )
        line = assert_one_line(
            failure.value,
            "counter 0 died 3 times during one read() (2 restarts in all; budgets: "
            "max_restarts_per_read=2); last: ActorDiedError: ",
        )
        assert pool.spent_snapshot == 9, line
        # every later call ends in the same line, as a call from another thread would
        with pytest.raises(CounterFailure, match="^counter 0 died 3 times during one read"):
            pool.call(
                "get()", lambda: read(pool), PER_CALL, snapshot=lambda _: 0, install=set_value
            )
    finally:
        pool.stop()


def test_the_budget_in_all_counts_across_calls_and_a_stopped_pool_is_no_death(ray_local):
    budget = RestartBudget(
        per_call=2, per_call_key="max_restarts_per_read", in_all=1, in_all_key="max_reads_in_all"
    )
    pool = counters_pool()

    def stopped():
        raise PoolStopped("stopped by its owner")

    try:
        kill(pool.member())
        assert (
            pool.call("read()", lambda: read(pool), budget, snapshot=lambda _: 1, install=set_value)
            == 1
        )
        with pytest.raises(PoolStopped):  # not a death: nothing replaced, nothing counted
            pool.call("read()", stopped, budget, snapshot=lambda _: 0, install=set_value)
        assert pool.num_restarts == 1
        kill(pool.member())  # a second call's death: the budget in all is spent
        with pytest.raises(CounterFailure) as failure:
            pool.call("read()", lambda: read(pool), budget, snapshot=lambda _: 1, install=set_value)
        assert_one_line(
            failure.value,
            "counter 0 died 1 times during one read() (1 restarts in all; budgets: "
            "max_restarts_per_read=2, max_reads_in_all=1); last: ActorDied: counter died",
        )
    finally:
        pool.stop()


def test_a_call_is_made_again_while_its_actor_restarts_then_ends_in_the_callers_line(ray_local):
    def gone(error: BaseException) -> CounterFailure:
        return CounterFailure(f"the counter did not answer in 3 attempts: {type(error).__name__}")

    restarted = Counter.options(max_restarts=1).remote()
    ray.get(restarted.set.remote(3))
    restarted.exit.remote()  # Ray restarts it: a fresh counter (ray.kill is asynchronous:
    # a call sent right after it may still reach the old one)
    assert call_while_restarted(lambda: ray.get(restarted.get.remote()), 20, gone) == 0
    with pytest.raises(ValueError, match="the actor's own error"):  # at once, not retried
        call_while_restarted(lambda: ray.get(restarted.fail.remote()), 3, gone)
    dead = Counter.remote()
    kill(dead)
    with pytest.raises(CounterFailure) as failure:
        call_while_restarted(lambda: ray.get(dead.get.remote()), 3, gone)
    assert_one_line(failure.value, "the counter did not answer in 3 attempts: ActorDiedError")
    ray.kill(restarted)
