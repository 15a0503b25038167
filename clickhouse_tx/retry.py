"""The one retry helper: bounded attempts, bounded total time, full-jitter backoff.

Only errors a predicate accepts are retried. By default that is
:class:`~clickhouse_tx.errors.TransientError` and the builtin connection errors;
:class:`~clickhouse_tx.errors.OutcomeUnknownError` is never retried by default,
even though it subclasses nothing retryable: an operation whose effect may have
happened is resolved by a lookup in the caller, not repeated blindly.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import random
import time
from typing import Callable, TypeVar

from clickhouse_tx.errors import OutcomeUnknownError, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Set while :func:`retry_call` runs its function: the loop that owns the retries of
#: that call. The client's own retry of reads (``Target.read_retry``) stands aside
#: under it, so a call is retried by one loop, never by one inside another.
_IN_RETRY: contextvars.ContextVar[bool] = contextvars.ContextVar("clickhouse_tx_in_retry", default=False)


def inside_retry() -> bool:
    """True while a :func:`retry_call` in this thread (or task) is running its function."""
    return _IN_RETRY.get()


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry. Plain data: picklable, shipped to executors with the writer.

    Attributes
    ----------
    max_attempts:
        Calls in total (1 = no retry).
    max_total_s:
        No retry starts after this many seconds since the first call, and no sleep
        is allowed to cross it.
    base_delay_s, max_delay_s:
        Attempt ``n`` (1-based) sleeps ``uniform(0, min(max_delay_s, base_delay_s * 2**(n-1)))``
        ("full jitter").
    """

    max_attempts: int = 5
    max_total_s: float = 60.0
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_total_s < 0 or self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays and max_total_s must be >= 0")

    def backoff_cap(self, failed_attempts: int) -> float:
        """Upper bound of the sleep after ``failed_attempts`` failures (>= 1)."""
        return min(self.max_delay_s, self.base_delay_s * float(2 ** (failed_attempts - 1)))


#: Retries nothing: for tests and for operations that must not be repeated.
NO_RETRY = RetryPolicy(max_attempts=1, max_total_s=0.0)


def is_transient(exc: BaseException) -> bool:
    """Default predicate: definitely-not-done connection-level failures."""
    if isinstance(exc, OutcomeUnknownError):
        return False
    return isinstance(exc, (TransientError, ConnectionError))


def is_transient_or_unknown(exc: BaseException) -> bool:
    """For idempotent operations (reads, rollback, mark_done): repeating is harmless."""
    return isinstance(exc, OutcomeUnknownError) or is_transient(exc)


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    retry_on: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: Callable[[], float] = random.random,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    what: str | None = None,
) -> T:
    """Call ``fn`` until it returns, an error ``retry_on`` rejects, or the policy runs out.

    The last error is re-raised unchanged. Only :class:`Exception` is caught: a
    ``BaseException`` (KeyboardInterrupt, a simulated crash) always passes through.
    ``what`` (a label such as ``"registry read"``) logs every retry at WARNING through
    :func:`logging_on_retry` when no ``on_retry`` is given: production retries are
    never silent.
    """
    if on_retry is None and what is not None:
        on_retry = logging_on_retry(what, policy)
    start = clock()
    failures = 0
    while True:
        token = _IN_RETRY.set(True)
        try:
            return fn()
        except Exception as exc:
            failures += 1
            if not retry_on(exc) or failures >= policy.max_attempts:
                raise
            delay = rng() * policy.backoff_cap(failures)
            if clock() - start + delay > policy.max_total_s:
                raise
            failed = exc
        finally:
            _IN_RETRY.reset(token)
        if on_retry is not None:
            on_retry(failures, failed, delay)
        sleep(delay)


def logging_on_retry(
    what: str, policy: RetryPolicy, logger: logging.Logger = log
) -> Callable[[int, BaseException, float], None]:
    """An ``on_retry`` that logs one WARNING per retry: what, attempt/limit, the error.

    The error is logged by its message, which the project builds without passwords
    (URLs pass through :func:`clickhouse_tx.client.http.safe_url`).
    """

    def on_retry(failures: int, exc: BaseException, delay: float) -> None:
        logger.warning(
            "%s failed (attempt %d of %d), retrying in %.2f s: %s: %s",
            what,
            failures,
            policy.max_attempts,
            delay,
            type(exc).__name__,
            exc,
        )

    return on_retry
