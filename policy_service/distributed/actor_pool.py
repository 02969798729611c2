"""The actors of one role, kept alive: the one place that tells an actor's death from
its own error, counts restarts against a budget, waits between attempts, replaces
the dead, and ends the run in one line when the budget is spent.

Why one pool: learners, env runners, the fragment stream, the PolicyActor and the
external env runners each grew their own death test, budget, backoff and failure
line; a fix to one missed the others. RLlib's FaultTolerantActorManager is the
shape: a call gives every actor's result or error, so that its callers need not
catch Ray's errors themselves.

    results = gather(refs, timeout_s)         # one CallResult per actor: OK, RAISED
    [r.get() for r in results]                # (its own code), DIED, HUNG, UNWAITED
    pool = ActorPool([start(0)], start, stop, LearnerFailure, "replacing the learners")
    pool.call("update()", update, budget, snapshot=..., install=...)  # dead: replaced
    pool.replace(0, install)                  # a fresh member, made whole by `install`
    new = pool.start_replacement(slot, attempt, "sample()", error, budget, "env runner 2")
    pool.install(slot, new)                   # once it is up; the caller went on meanwhile
    pool.replace_when_up(slot, 1, "sample()", error, budget, "env runner 2", up)  # waited for
    pool.replace_in_background(slot, "sampling", error, budget, "env runner 2", up)
    pool.install_started(wait=False)          # those up (up(slot, new) resolved) installed
    pool.num_restarts                         # attempts in all, failed starts included

What it owns:
- death detection: `is_actor_death` (the process is gone, not its code's error),
  `died_of_actor_death` (a task failed because an actor *it* called died), and
  `gather`, which sorts every call's outcome;
- the budget (`RestartBudget`: per call, in all, the config keys that set them) and
  the backoff between attempts of one call (`restart_delay_s`: none, then doubling);
- replacement: the old member stopped, a new one started and made whole (`replace`,
  `call`, `replace_when_up`), one thread at a time; or started in the background
  and installed once up (`replace_in_background`, `install_started`; the pool keeps
  them meanwhile); a call that failed on a member another
  thread replaced meanwhile is made again, not counted;
- the "budget spent" line (errors.restart_budget_spent), raised as the role's own
  RunFailure, and raised again by every later call once spent;
- actors Ray restarts in place (`max_restarts`: the PolicyActor, whose handle callers
  hold): `call_retrying_once` waits for the restart, `restarted_in_place_failure`
  words the end from Ray's own count (`gcs_actor_info`); actors someone else replaces
  (Serve's replicas: the external env runners): `call_while_restarted`.

A member is what dies and is replaced as one: the whole learner group (its actors
share a collective: one death restarts all of them, from the driver's copy of
their state), or one env runner per slot (replaced alone, in the background, while
the others sample; the fragment stream's replacements are the env runners').

What it does not own: what a member is and how it is started (`start`), how a
replacement is made whole (the caller's `install`: a state, weights), when calls
are made, and what a role's own errors mean (a learner's CollectivePeerError is a
death the learners tell the pool of, as ActorDied).
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError

from policy_service.errors import RunFailure, own_error, restart_budget_spent

M = TypeVar("M")  # a member: what dies and is replaced as one
R = TypeVar("R")
S = TypeVar("S")  # what a replacement is made from (a learner state)

RESTART_WAIT_S = 120.0  # longest wait for an actor Ray restarts (it rebuilds its policy)


# ----- death detection -----------------------------------------------------------------


def is_actor_death(error: BaseException) -> bool:
    """True when the actor's process is gone; False for an error its own code raised."""
    return isinstance(error, RayActorError) and not isinstance(error, RayTaskError)


def died_of_actor_death(error: BaseException) -> bool:
    """True when a task's code failed because an actor *it* called died."""
    cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
    return cause is not None and (is_actor_death(cause) or died_of_actor_death(cause))


class Outcome(enum.Enum):
    OK = "ok"
    RAISED = "raised"  # the actor's own code raised `error`
    DIED = "died"  # the actor's process is gone
    HUNG = "hung"  # no result before the deadline
    UNWAITED = "unwaited"  # not waited for: an earlier failure ended the wait


class CallResult(NamedTuple):
    """One actor's call: its result, or why there is none."""

    slot: int  # the call's place in the calls made (an actor's rank)
    outcome: Outcome
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def get(self):
        """The result, or the call's error raised (OK or RAISED/DIED only)."""
        if self.error is not None:
            raise self.error
        if not self.ok:
            raise RuntimeError(f"call {self.slot} has no result: {self.outcome.value}")
        return self.value


def gather(
    refs: Sequence[ray.ObjectRef], timeout_s: float | None = None, *, stop_at_failure=False
) -> list[CallResult]:
    """Every call's CallResult, by index, as they finish. `timeout_s`: calls not done by
    then are HUNG. stop_at_failure: the first failure ends the wait (the others may be
    blocked on the failed actor, e.g. in a collective), leaving the rest UNWAITED."""
    index_of = {ref: index for index, ref in enumerate(refs)}
    results: dict[int, CallResult] = {}
    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    left = Outcome.UNWAITED
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        if not ready:  # the deadline passed
            left = Outcome.HUNG
            break
        index = index_of[ready[0]]
        try:
            results[index] = CallResult(index, Outcome.OK, ray.get(ready[0]))
        except RayError as error:
            died = Outcome.DIED if is_actor_death(error) else Outcome.RAISED
            results[index] = CallResult(index, died, error=error)
            if stop_at_failure:
                break
    for ref in pending:
        results[index_of[ref]] = CallResult(index_of[ref], left)
    return [results[index] for index in range(len(refs))]


def raise_own_error(results: Sequence[CallResult]) -> None:
    """Raise the first error an actor's own code raised among `results`; deaths, hangs
    and calls not waited for are left to the caller."""
    for result in results:
        if result.outcome is Outcome.RAISED:
            result.get()


# ----- the budget ----------------------------------------------------------------------


@dataclass(frozen=True)
class RestartBudget:
    """Restarts allowed within one call (per member) and in all, each with the config
    key that sets it (named by the budget line); None: no such limit."""

    per_call: int | None = None
    per_call_key: str = ""
    in_all: int | None = None
    in_all_key: str = ""

    def keys(self) -> dict[str, int]:
        limits = {self.per_call_key: self.per_call, self.in_all_key: self.in_all}
        return {key: limit for key, limit in limits.items() if limit is not None}

    def allows(self, attempt: int, restarts_in_all: int) -> bool:
        """Whether attempt `attempt` (1, 2, ... within one call) may be made now."""
        within_call = self.per_call is None or attempt <= self.per_call
        return within_call and (self.in_all is None or restarts_in_all < self.in_all)


def restart_delay_s(attempt: int, first_s: float = 0.25, longest_s: float = 4.0) -> float:
    """The wait before restart attempt `attempt` (1, 2, ...): none, then doubling, capped."""
    return 0.0 if attempt <= 1 else min(longest_s, first_s * 2 ** (attempt - 2))


def backoff_delays(attempts: int) -> list[float]:
    """The waits before each of `attempts` restart attempts (restart_delay_s)."""
    return [restart_delay_s(attempt) for attempt in range(1, attempts + 1)]


# ----- members the driver replaces -----------------------------------------------------


class ActorDied(RuntimeError):
    """A member's actor died (or failed with a death's consequence): the pool replaces
    the member. `who`: the actor as the budget line names it ("learner 1")."""

    def __init__(self, message: str, who: str):
        super().__init__(message)
        self.who = who


class PoolStopped(RuntimeError):
    """A call on members already stopped (by the pool's owner, or replaced meanwhile
    by another thread)."""


class _Starting(NamedTuple):
    """A replacement started in the background: installed once `ready` resolves."""

    member: Any
    ready: ray.ObjectRef
    attempt: int
    during: str
    budget: RestartBudget
    who: str
    up: Callable[[int, Any], ray.ObjectRef]


class ActorPool(Generic[M]):
    """Members by slot, each replaced when a call finds it dead, within a budget.

    members: the caller's list by slot, kept (not copied: the pool replaces members in
    it, the caller reads it); start(slot) -> a new member; stop(member) ends one
    (idempotent); failure(line) -> the role's RunFailure; replacing: what the pool's
    log line says it does."""

    def __init__(
        self,
        members: list[M],
        start: Callable[[int], M],
        stop: Callable[[M], None],
        failure: Callable[[str], RunFailure],
        replacing: str,
    ):
        self._members = members
        self._start, self._stop, self._failure_type = start, stop, failure
        self._replacing = replacing
        self.num_restarts = 0  # attempts in all: one that died starting counts
        self.spent_snapshot: Any = None  # what the last replacement was to hold, once spent
        self._failure: RunFailure | None = None  # the budget line, for every later call
        self._starting: dict[int, _Starting] = {}  # replacements started in the background
        # held while a member is replaced: a caller on another thread (the async learner
        # thread, the driver) waits for the new one instead of calling the stopped one
        self._lock = threading.RLock()

    def member(self, slot: int = 0) -> M:
        """The member in `slot` now; while another thread replaces it, the new one."""
        with self._lock:
            return self._members[slot]

    def replace(self, slot: int, install: Callable[[M], None]) -> None:
        """Stop the member in `slot`, start a new one and `install` what it must hold (on
        an error there it is stopped too); the failure line is cleared."""
        with self._lock:
            self._stop(self._members[slot])
            self._failure = None
            self.num_restarts += 1  # an attempt counts, as one that dies starting does
            self._members[slot] = self._start(slot)
            try:
                install(self._members[slot])
            except BaseException:
                self._stop(self._members[slot])
                raise

    def start_replacement(
        self,
        slot: int,
        attempt: int,
        during: str,
        error: BaseException,
        budget: RestartBudget,
        who: str,
    ) -> M:
        """Attempt `attempt` (1, 2, ... within one call) at replacing the dead member in
        `slot`, not waited for: the dead one is stopped; the budget spent -> the role's
        RunFailure (the line); else, after the attempt's backoff, a new member starts
        and is returned. The caller goes on with the others and `install`s it once up."""
        with self._lock:
            self._stop(self._members[slot])
            if slot in self._starting:  # replaced now: the one still starting is not needed
                self._stop(self._starting.pop(slot).member)
            if not budget.allows(attempt, self.num_restarts):
                self._failure = self._failure_type(
                    restart_budget_spent(
                        who, attempt, during, self.num_restarts, budget.keys(), error
                    )
                )
                raise self._failure from None
            time.sleep(restart_delay_s(attempt))
            self._announce(who, during, error, attempt, budget)
            self.num_restarts += 1
            return self._start(slot)

    def install(self, slot: int, member: M) -> None:
        """A started replacement takes its slot."""
        with self._lock:
            self._members[slot] = member

    def replace_when_up(
        self,
        slot: int,
        attempt: int,
        during: str,
        error: BaseException,
        budget: RestartBudget,
        who: str,
        up: Callable[[int, M], ray.ObjectRef],
    ) -> int:
        """Replace the dead member in `slot` now: attempt `attempt` (start_replacement),
        installed once `up(slot, new member)` resolves; one that dies starting is
        stopped and the next attempt made, within `budget`. -> the attempt that took
        the slot."""
        while True:
            member = self.start_replacement(slot, attempt, during, error, budget, who)
            [started] = gather([up(slot, member)])
            if started.outcome is not Outcome.DIED:
                if started.outcome is Outcome.RAISED:  # reachable from nowhere else
                    self._stop(member)
                started.get()  # its own code's error raised
                self.install(slot, member)
                return attempt
            self._stop(member)
            attempt, error = attempt + 1, started.error or error

    def replace_in_background(
        self,
        slot: int,
        during: str,
        error: BaseException,
        budget: RestartBudget,
        who: str,
        up: Callable[[int, M], ray.ObjectRef],
        attempt: int = 1,
    ) -> None:
        """Start replacing the dead member in `slot` (start_replacement), not waited for:
        the caller goes on with the others; `install_started` puts it in its slot once
        `up(slot, new member)` resolves."""
        member = self.start_replacement(slot, attempt, during, error, budget, who)
        self._starting[slot] = _Starting(member, up(slot, member), attempt, during, budget, who, up)

    def starting(self) -> list[int]:
        """The slots whose replacement is starting in the background."""
        return sorted(self._starting)

    def install_started(self, wait: bool) -> list[int]:
        """The replacements started in the background that are up take their slots
        (`wait`: all of them, waiting for those starting); one that died starting is
        stopped and the next attempt started, within its budget. -> the slots filled."""
        filled: list[int] = []
        while self._starting:
            starting = list(self._starting.items())
            results = gather([started.ready for _, started in starting], None if wait else 0)
            if all(result.outcome is Outcome.HUNG for result in results):
                break
            for (slot, started), result in zip(starting, results):
                if result.outcome is Outcome.HUNG:  # still starting
                    continue
                del self._starting[slot]
                if result.outcome is Outcome.DIED:
                    assert result.error is not None
                    self._stop(started.member)
                    self.replace_in_background(
                        slot,
                        started.during,
                        result.error,
                        started.budget,
                        started.who,
                        started.up,
                        started.attempt + 1,
                    )
                    continue
                if result.outcome is Outcome.RAISED:  # reachable from nowhere else
                    self._stop(started.member)
                result.get()  # its own code's error raised
                self.install(slot, started.member)
                filled.append(slot)
        return filled

    def call(
        self,
        during: str,
        call: Callable[[], R],
        budget: RestartBudget,
        *,
        snapshot: Callable[[M], S],
        install: Callable[[S, M], None],
        slot: int = 0,
    ) -> R:
        """call() -> its result. A member that died (ActorDied) is replaced, made whole
        by install(snapshot(dead member), new member) (the snapshot taken once: a failed
        replacement has a fresh one), and the call made again, within `budget`; a
        replacement that dies starting counts and is tried again after a backoff. Then
        the role's RunFailure, the budget line. `call` reads the member each time."""
        attempts: int = 0
        taken: tuple[S] | None = None
        error: BaseException
        while True:
            called = self.member(slot)
            try:
                return call()
            except (ActorDied, PoolStopped) as failed:
                error = failed
            with self._lock:
                if self._failure is not None:  # spent by a call on another thread
                    raise self._failure_type(str(self._failure)) from None
                if self._members[slot] is not called:  # replaced meanwhile by another thread
                    continue
                if not isinstance(error, ActorDied):  # stopped by the pool's owner
                    raise error
                who = error.who
                if taken is None:
                    taken = (snapshot(called),)
                while True:
                    attempts += 1
                    if not budget.allows(attempts, self.num_restarts):
                        self.spent_snapshot = taken[0]  # what every replacement was to hold
                    try:  # the budget spent: the line
                        member = self.start_replacement(slot, attempts, during, error, budget, who)
                        self.install(slot, member)
                        install(taken[0], member)
                        break
                    except (ActorDied, RayError) as died_starting:
                        self._stop(self._members[slot])
                        error = died_starting

    def _announce(
        self, who: str, during: str, error: BaseException, attempt: int, budget: RestartBudget
    ) -> None:
        """Our line beside Ray's "(raylet) A worker died ...": the fault is handled."""
        if budget.in_all is not None:
            count = f"restart {self.num_restarts + 1} of at most {budget.in_all}"
        else:
            count = f"restart {attempt} of at most {budget.per_call} in one call"
        print(
            f"policy-service: {who} died during {during} ({type(own_error(error)).__name__}); "
            f"{self._replacing} ({count})",
            file=sys.stderr,
            flush=True,
        )

    def stop(self) -> None:
        """End every member, and the replacements starting (idempotent)."""
        with self._lock:
            for member in self._members:
                self._stop(member)
            for started in self._starting.values():
                self._stop(started.member)
            self._starting.clear()


# ----- actors Ray restarts in place ------------------------------------------------------


def call_retrying_once(method, *args, **kwargs):
    """ray.get(method.remote(*args, **kwargs)), sent once more if the actor died meanwhile
    (a restartable actor serves the second call after its restart).

    While Ray restarts the actor, calls fail at once with ActorUnavailableError
    without running; the second call is re-sent, with backoff, until the actor is
    up or RESTART_WAIT_S passed. An actor dead for good raises ActorDiedError.
    """
    try:
        return ray.get(method.remote(*args, **kwargs))
    except RayActorError as error:
        if not is_actor_death(error):
            raise
    deadline = time.monotonic() + RESTART_WAIT_S
    delay = 0.05
    while True:
        try:
            return ray.get(method.remote(*args, **kwargs))
        except ActorUnavailableError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(1.0, delay * 2)


def call_while_restarted(
    call: Callable[[], R], attempts: int, failure: Callable[[BaseException], Exception]
) -> R:
    """call(), made again while someone else restarts the actor it reaches (Serve
    replacing a dead replica): a RayActorError (dead, or unavailable while restarting)
    is waited out with the pool's backoff (restart_delay_s), `attempts` calls at most;
    then failure(the last error) is raised. The actor's own errors are raised at once."""
    last: RayActorError | None = None
    for delay in backoff_delays(attempts):
        time.sleep(delay)
        try:
            return call()
        except RayActorError as error:
            last = error
    if last is None:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    raise failure(last) from None


def gcs_actor_info(actor) -> dict:
    """What the GCS holds on `actor` ("State", "NumRestarts", ...). Read from the GCS
    itself: Ray's public state API goes through the dashboard, which is off."""
    from ray._private import state

    return state.actors(actor_id=actor._actor_id.hex()) or {}


def restarts_by_ray(actor) -> int:
    """How often Ray restarted `actor`, as the GCS counts it (also the restarts that
    died before running any code)."""
    return int(gcs_actor_info(actor).get("NumRestarts", 0))


def restarted_in_place_failure(
    role: str, info: dict, budget: RestartBudget, during: str, error: BaseException
) -> str:
    """The line for an actor Ray restarts in place that a retried call found gone:
    still not back (Ray not done with it), or dead for good, its restarts (`info`, the
    GCS's) spent. The budget is for the actor's whole run: every restart followed a
    death."""
    restarts = int(info.get("NumRestarts", 0))
    if info.get("State") != "DEAD":
        return (
            f"{role} did not answer after restart {restarts} (found gone by {during}, "
            f"retried for up to {RESTART_WAIT_S:g} s; Ray state "
            f"{info.get('State', 'unknown')}); last: {type(error).__name__}"
        )
    return restart_budget_spent(
        role, restarts + 1, f"run, found dead by {during}", restarts, budget.keys(), error
    )
