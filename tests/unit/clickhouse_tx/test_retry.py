"""The retry helper: attempts, total time, jitter, and what it refuses to retry."""

from __future__ import annotations

import dataclasses

import pytest

from clickhouse_tx.errors import NotCommittedError, OutcomeUnknownError, TransientError
from clickhouse_tx.retry import RetryPolicy, is_transient_or_unknown, retry_call


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def failing(n: int, exc: Exception):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= n:
            raise exc
        return "ok"

    return fn, calls


def test_transient_errors_are_retried_until_success() -> None:
    t = FakeTime()
    fn, calls = failing(3, TransientError("refused"))
    assert retry_call(fn, RetryPolicy(max_attempts=5), sleep=t.sleep, clock=t.clock) == "ok"
    assert len(calls) == 4 and len(t.sleeps) == 3


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    t = FakeTime()
    fn, calls = failing(10, ConnectionResetError("reset"))
    with pytest.raises(ConnectionResetError):
        retry_call(fn, RetryPolicy(max_attempts=4), sleep=t.sleep, clock=t.clock)
    assert len(calls) == 4


def test_total_time_is_bounded_even_with_attempts_left() -> None:
    t = FakeTime()
    fn, calls = failing(1000, TransientError("refused"))
    policy = RetryPolicy(max_attempts=1000, max_total_s=3.0, base_delay_s=1.0, max_delay_s=1.0)
    with pytest.raises(TransientError):
        retry_call(fn, policy, sleep=t.sleep, clock=t.clock, rng=lambda: 1.0)
    assert t.now <= 3.0 and len(calls) == 4  # slept 1+1+1, the next sleep would cross 3 s


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    policy = RetryPolicy(max_attempts=8, max_total_s=1e9, base_delay_s=0.5, max_delay_s=4.0)
    for rng_value in (0.0, 0.37, 0.999):
        t = FakeTime()
        fn, _ = failing(7, TransientError("x"))
        retry_call(fn, policy, sleep=t.sleep, clock=t.clock, rng=lambda v=rng_value: v)
        caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
        assert t.sleeps == pytest.approx([rng_value * c for c in caps])


def test_outcome_unknown_is_never_retried_by_default() -> None:
    fn, calls = failing(1, OutcomeUnknownError("reply lost"))
    with pytest.raises(OutcomeUnknownError):
        retry_call(fn, RetryPolicy(max_attempts=5), sleep=lambda s: None)
    assert len(calls) == 1


def test_definite_non_transient_errors_are_not_retried() -> None:
    fn, calls = failing(1, NotCommittedError("rolled back"))
    with pytest.raises(NotCommittedError):
        retry_call(fn, RetryPolicy(max_attempts=5), sleep=lambda s: None)
    assert len(calls) == 1


def test_idempotent_calls_may_opt_in_to_retrying_unknown_outcomes() -> None:
    fn, calls = failing(2, OutcomeUnknownError("reply lost"))
    assert retry_call(fn, RetryPolicy(max_attempts=5), retry_on=is_transient_or_unknown, sleep=lambda s: None) == "ok"
    assert len(calls) == 3


def test_a_simulated_crash_passes_through_untouched() -> None:
    class Crash(BaseException):
        pass

    fn, calls = failing(1, Crash())  # type: ignore[arg-type]
    with pytest.raises(Crash):
        retry_call(fn, RetryPolicy(max_attempts=5), retry_on=lambda e: True, sleep=lambda s: None)
    assert len(calls) == 1


def test_a_policy_is_frozen_and_rejects_nonsense() -> None:
    p = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_attempts = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_inside_retry_is_true_only_while_the_loop_runs_its_function_and_not_while_it_sleeps() -> None:
    from clickhouse_tx.retry import inside_retry

    seen: list[tuple[str, bool]] = []
    t = FakeTime()

    def sleep(s: float) -> None:
        seen.append(("sleep", inside_retry()))
        t.sleep(s)

    def fn() -> str:
        seen.append(("call", inside_retry()))
        if len(seen) < 3:
            raise TransientError("refused")
        return "ok"

    assert not inside_retry()
    assert retry_call(fn, RetryPolicy(max_attempts=5), sleep=sleep, clock=t.clock) == "ok"
    assert seen == [("call", True), ("sleep", False), ("call", True)]
    with pytest.raises(ValueError):
        retry_call(lambda: (_ for _ in ()).throw(ValueError("definite")), RetryPolicy())
    assert not inside_retry()  # reset after a failure too
