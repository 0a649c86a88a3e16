"""Usage that cannot be skipped: the model side writes one ledger row per request, however
the request ends.

Only the model deployment knows what a request cost when it ends early: the router's call
is cancelled (the client went away, or the router's backstop timeout fired) and gets no
answer back. So the router hands every model call a ``RequestContext`` (who pays, the
reservation to settle, the prefix-cache salt), and ``UsageRecorder`` runs the call:

- it enforces the request timeout itself, so the engine request is cancelled and its slot
  freed at the next step (504, billed what was processed);
- it meters the work as it happens: the work gets a ``BilledCall`` (the context and its
  ``UsageMeter``) as an argument, and the ``EngineClient`` adds each chunk's running counts to
  its meter, the decision service its result, so a cancelled or failed request is
  billed the tokens it processed: 499 for a client that went away, the error's status for a
  failure after generation (a json_schema answer that fails validation is a 502, billed);
- it writes the row in a ``finally`` through a detached task that a second cancellation
  cannot stop, retrying a failed write; a row the store still cannot take goes to the
  replica's spool on disk (``spool.LedgerSpool``), written to the store once it is back; a
  successful answer whose row could be neither written nor spooled is a 503, never a silent
  200.

A prompt whose request is cancelled after it reached the engine is billed in full: the step
loop may have read any part of it by then.

One case the model side cannot cover: its replica dies (its node is lost) in the middle of a
stream, and its meter with it. The router bills that one (``bill_if_replica_lost``): every
content chunk carries its running usage (the router strips it on the wire), so the router
knows the counts of the last chunk it passed on, and writes them when the stream fails with
Ray's "the actor is gone" (503, what the client's error event says). Rows are keyed by the
request id (``RequestContext.request_id``) and the ledger keeps the first row of an id, so a
replica that wrote its row before dying, or was not dead after all, is never billed twice.
The router's row is ``delivered``: where the replica's row counts more (it generated the
whole answer and billed it, then died with chunks still on their way to the router), the
row is cut to what the client got and the difference refunded. A plain (unary) call whose
replica dies delivers nothing, even where the replica billed the whole answer just before
(``bill_lost_answer``): its client gets a 503, and the row is cut to nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from serve_app.auth.records import Usage
from serve_app.engine.protocol import SHARED_CACHE
from serve_app.errors import ServiceError, UpstreamTimeoutError, UpstreamUnavailableError
from serve_app.serving.spool import LedgerSpool

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_GONE = 499  # nginx's status for a client that closed the connection first
# A stream whose replica died: billed by the router, with the status of the client's error
# event (serve_app.http.errors maps Ray's actor errors to it).
REPLICA_LOST = UpstreamUnavailableError.status_code
WRITE_ATTEMPTS = 3
WRITE_RETRY_S = 0.2
# How often a replica's ledger spool is written to the store while it holds rows.
SPOOL_FLUSH_S = 5.0


@dataclass(frozen=True)
class RequestContext:
    """What the router tells a model deployment about one request (picklable), created after
    auth and passed as an argument all the way to the engine: no ambient state decides whose
    cache a request reads or who pays for it.

    ``grant``: the auth service's grant (account, key, reservation). ``cache_salt``: the
    prefix-cache partition (``cache_salt_for``), never left out. ``deadline``: when the
    request's time is up (``time.time()``), counted from the router, so time spent queued for a
    replica counts; None: ``timeout_s`` from when work starts. ``request_id``: the request's
    key in the ledger (one row per id), new for every context. ``delivered``: set on the
    router's own row of a call whose replica died (``Usage.delivered``).
    """

    grant: Any
    model: str
    endpoint: str
    cache_salt: str
    deadline: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    delivered: bool = False


@dataclass
class UsageMeter:
    """Tokens one request has processed so far (running totals)."""

    input_tokens: int = 0
    output_tokens: int = 0

    def update(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens = max(self.input_tokens, input_tokens)
        self.output_tokens = max(self.output_tokens, output_tokens)


@dataclass(frozen=True)
class BilledCall:
    """One model call as the model deployment runs it: for whom (``context``) and what it has
    processed so far (``meter``, which the ledger row records however the call ends)."""

    context: RequestContext
    meter: UsageMeter

    @property
    def cache_salt(self) -> str:
        return self.context.cache_salt


def detached(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``work`` in a task of its own, outside the current request's context.

    Serve keeps its request context in a context variable, which a task copies, and when a
    request is cancelled (its client went away) it cancels the request's calls to other
    deployments that are still waiting for a replica. A ledger write or a refund a cancelled
    request starts must outlive it, so it runs in an empty context: a call of no request."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


def cache_salt_for(account_id: int, shared: bool) -> str:
    """The one rule for salts: the account's id, unless the operator shares the cache."""
    return SHARED_CACHE if shared else f"account-{account_id}"


class _Outcome:
    """The status a ledger row records for the work inside ``with outcome:``: 200, the
    error's own status, 499 for a client that went away, 500 for anything unexpected. A
    timeout leaves the block as ``UpstreamTimeoutError`` (504)."""

    def __init__(self) -> None:
        self.status = 500

    def __enter__(self) -> _Outcome:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> bool:
        if error is None:
            self.status = 200
        elif isinstance(error, TimeoutError):
            self.status = UpstreamTimeoutError.status_code
            raise UpstreamTimeoutError() from None
        elif isinstance(error, asyncio.CancelledError | GeneratorExit):
            self.status = CLIENT_GONE
        elif isinstance(error, ServiceError):
            self.status = error.status_code
        return False  # the error goes on to the caller


Write = Callable[[RequestContext, int, int, int], Awaitable[None]]


def ledger_write(auth: Any) -> Write:
    """``write(context, input_tokens, output_tokens, status)`` through the auth deployment's
    handle ``auth`` (its ``record_usage``, keyed by the request id); None: nothing is billed
    (a deployment built on its own)."""

    async def write(context: RequestContext, input_tokens: int, output_tokens: int, status: int):
        if auth is not None:
            usage = Usage(
                context.model,
                context.endpoint,
                input_tokens,
                output_tokens,
                status,
                context.request_id,
                delivered=context.delivered,
            )
            await auth.record_usage.remote(context.grant, usage)

    return write


class Ledger:
    """Writes ledger rows with ``write`` (``ledger_write``): each in a task of its own that
    cancelling the caller cannot stop (``detached``: not even Serve cancelling the request's
    calls), a failed write retried, and one that still fails kept
    in ``spool`` (None: lost, and the request a 503) until a background flush writes it."""

    def __init__(self, write: Write, spool: LedgerSpool | None = None) -> None:
        self.write = write
        self.spool = spool
        self._detached: set[asyncio.Task] = set()
        self._flusher: asyncio.Task | None = None

    def start_flushing(self) -> None:
        """Flush the spool every ``SPOOL_FLUSH_S`` from now on, on the running loop (also
        adopting rows a dead replica on this machine left behind)."""
        if self.spool is not None and (self._flusher is None or self._flusher.done()):
            self._flusher = detached(self._flush_forever())

    async def _flush_forever(self) -> None:
        assert self.spool is not None
        while True:
            await asyncio.sleep(SPOOL_FLUSH_S)
            if not self.spool.held() and not self.spool.orphans():
                continue
            try:
                written = await self.spool.flush(self.write)
                if written:
                    logger.info("ledger spool: %d rows written to the store", written)
            except Exception as error:  # the store is still away: next time
                logger.warning("ledger spool not flushed yet: %s", type(error).__name__)

    async def settle(self, call: BilledCall, status: int) -> bool:
        """Write ``call``'s row with ``status``; whether it was written (True too when the
        caller was cancelled meanwhile: the task goes on writing)."""
        task = detached(self._write_with_retries(call, status))
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            return True

    async def _write_with_retries(self, call: BilledCall, status: int) -> bool:
        context, meter = call.context, call.meter
        for attempt in range(WRITE_ATTEMPTS):
            try:
                await self.write(context, meter.input_tokens, meter.output_tokens, status)
                return True
            except asyncio.CancelledError:
                # The call was cancelled, not this task (nothing cancels it but the loop's
                # end): a failed write, like any other.
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
                logger.warning(
                    "usage write cancelled (attempt %d of %d)", attempt + 1, WRITE_ATTEMPTS
                )
            except Exception:
                logger.warning("usage write failed (attempt %d of %d)", attempt + 1, WRITE_ATTEMPTS)
                await asyncio.sleep(WRITE_RETRY_S * (attempt + 1))
        return await self._keep(call, status)

    async def _keep(self, call: BilledCall, status: int) -> bool:
        """The row in the spool, for the flusher to write once the store is back."""
        context, meter = call.context, call.meter
        if self.spool is not None:
            try:
                row = (context, meter.input_tokens, meter.output_tokens, status)
                await asyncio.to_thread(self.spool.keep, row)
                self.start_flushing()
                logger.warning("usage of a %s request kept in the ledger spool", context.endpoint)
                return True
            except Exception:
                logger.exception("the ledger spool failed too")
        logger.error("usage of a %s request was not recorded", context.endpoint)
        return False


class UsageRecorder:
    """Runs model calls under the request timeout and writes their ledger rows.

    ``write(context, input_tokens, output_tokens, status)`` stores one row (``ledger_write``);
    ``timeout_s`` is the request deadline.
    """

    def __init__(self, write: Write, timeout_s: float, spool: LedgerSpool | None = None) -> None:
        self.ledger = Ledger(write, spool)
        self.timeout_s = timeout_s

    def time_left(self, context: RequestContext) -> float:
        """Seconds the request may still run. A request whose deadline passed while it waited
        for a replica (one starting after a node was lost) is refused before any work and
        billed nothing: its router has given up on it, or is about to (a 503 to the client),
        so an answer now would be billed and never delivered."""
        if context.deadline is None:
            return self.timeout_s
        left = min(self.timeout_s, context.deadline - time.time())
        if left <= 0:
            raise UpstreamUnavailableError("The request waited too long for a replica. Retry.")
        return left

    async def run(self, context: RequestContext, work: Callable[[BilledCall], Awaitable[T]]) -> T:
        """Await ``work(call)`` and bill what it processed."""
        time_left = self.time_left(context)
        call = BilledCall(context, UsageMeter())
        outcome = _Outcome()
        try:
            with outcome:
                async with asyncio.timeout(time_left):
                    result = await work(call)
        finally:
            written = await self.ledger.settle(call, outcome.status)
        if not written:
            raise UpstreamUnavailableError("Usage could not be recorded. Retry.")
        return result

    async def stream(
        self, context: RequestContext, chunks: Callable[[BilledCall], AsyncIterator[T]]
    ) -> AsyncIterator[T]:
        """Yield ``chunks(call)`` and bill them; the deadline bounds the whole stream."""
        deadline = asyncio.get_running_loop().time() + self.time_left(context)
        call = BilledCall(context, UsageMeter())
        outcome = _Outcome()
        iterator = chunks(call)
        try:
            with outcome:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            chunk = await anext(iterator)
                    except StopAsyncIteration:
                        break
                    yield chunk
        finally:
            await _close(iterator)
            written = await self.ledger.settle(call, outcome.status)
        if not written:
            raise UpstreamUnavailableError("Usage could not be recorded.")


async def bill_if_replica_lost(
    chunks: AsyncIterator[T],
    ledger: Ledger,
    context: RequestContext,
    replica_lost: Callable[[BaseException], bool],
) -> AsyncIterator[T]:
    """Pass a model deployment's stream on, and bill what it delivered if its replica dies.

    Each chunk carries the running ``usage`` of the work behind it; once the consumer asks
    for the next chunk, the last one was passed on. If the stream then fails with an error
    that says the replica is gone (``replica_lost``: the caller's reading of its transport's
    errors, ``http.errors.replica_lost`` for Ray's), the row for those counts is written
    (503, the status of the error event the client gets) before the error goes on, preceded
    by a usage chunk of the same counts (``choices`` empty; sent where the client asked for
    usage) unless the replica's own usage chunk was passed on already. A stream that failed
    before any chunk delivered nothing and is not billed; any other failure is the
    replica's to bill.
    """
    delivered: Any = None  # the last chunk passed on that carries usage
    try:
        async for chunk in chunks:
            yield chunk
            if getattr(chunk, "usage", None) is not None:
                delivered = chunk
    except Exception as error:
        if delivered is None or not replica_lost(error):
            raise
        logger.warning("a %s stream lost its replica; billing what it delivered", context.endpoint)
        counts = UsageMeter(*delivered.usage.token_counts)
        await ledger.settle(BilledCall(replace(context, delivered=True), counts), REPLICA_LOST)
        if delivered.choices:  # else the replica's own usage chunk was the last passed on
            yield delivered.model_copy(update={"choices": []})
        raise
    finally:
        await _close(chunks)


async def bill_lost_answer(ledger: Ledger, context: RequestContext) -> None:
    """A plain call whose replica died: nothing reached the client (a 503), so the request's
    row is the router's ``delivered`` one of no tokens, which also cuts a row the replica
    wrote before it died (its answer lost on the way back) and refunds it."""
    logger.warning("a %s call lost its replica; its answer is not billed", context.endpoint)
    await ledger.settle(BilledCall(replace(context, delivered=True), UsageMeter()), REPLICA_LOST)


async def _close(iterator: Any) -> None:
    """Close the inner generator now (it aborts the engine request), not at GC."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except BaseException:  # closing after a failure: the failure is what matters
            logger.debug("closing a stream failed", exc_info=True)
