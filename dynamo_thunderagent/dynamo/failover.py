"""Failover's pure parts: what a worker's error says, and how a turn goes on elsewhere.

When the stream of the worker serving a turn fails, the router (``router._fail_over``) asks
here whether the error is the worker's at all (:func:`may_fail_over`: not a refusal),
whether it says the worker is gone (:func:`worker_lost`: it is then put aside for a while),
which worker that was when the KV router placed the request itself
(:func:`address_in_error`, :func:`worker_at`), and what to send the next worker so that the
client sees one stream (:class:`Continuation`).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamo_thunderagent.program import WorkerKey

# A turn that streamed more tokens than this cannot go on on another worker: its tokens are
# not kept (8 bytes each, so at most 512 KiB per request in flight).
CONTINUATION_MAX_TOKENS = 65_536

# Errors from the KV router's stream that say the request itself, or a deliberate refusal,
# ended it (Dynamo's exception classes, by name): another worker would do the same.
_NOT_THE_WORKER = frozenset({"InvalidArgument", "Cancelled", "RouterQueueLimitExceeded"})
# Errors that say the worker is gone or unreachable (Dynamo's classes; Dynamo 1.6.1 raises
# plain exceptions whose message starts "Unavailable:" for a broken or refused connection,
# and "DeadlineExceeded: TCP request to ..." for a request a worker's TCP server never
# acknowledged, as a stopped one does; a live one acknowledges before its engine sees it).
# WorkerUnavailable is not one: it says no worker on the route can serve yet, not which.
_WORKER_LOST = frozenset({"CannotConnect", "Disconnected", "ConnectionTimeout",
                          "EngineShutdown", "StreamIncomplete"})
_LOST_PREFIXES = ("Unavailable:", "DeadlineExceeded: TCP request to ")
# An error a worker's own handler sent: Dynamo 1.6.1 passes it on as text, "Unavailable:
# Backend<kind>: ...". Of those kinds, the ones named in _WORKER_LOST say that its engine
# is gone; the others (an exception in its handler, a slow engine, a refusal) come from a
# worker that is there and answers. (A worker on Dynamo's Python backend framework sends
# an InvalidArgument as that class and other errors as "ValueError: Internal: ...", which
# say nothing of a lost worker either: tests/e2e/fault_engine.py.)
_BACKEND_ERROR = re.compile(r"\bBackend([A-Z][A-Za-z]*): ")
_BACKEND_REFUSAL = "BackendInvalidArgument: "
# The router reads the KV router's stream on demand (router.DEMAND_DRIVEN). Read so, Dynamo
# 1.6.1's binding passes a worker's errors on as a plain exception whose text starts with
# the kind of Dynamo's error, where its read-ahead raised the class of that name: a
# worker's refusal arrives as "InvalidRequest: <reason>" (the wire's name for an
# InvalidArgument), not as an InvalidArgument. These are the kinds read from such text.
_KIND_IN_TEXT = re.compile(r"([A-Z][A-Za-z]*): ")
_REFUSAL_KINDS = frozenset({"InvalidArgument", "InvalidRequest"})
_KINDS_IN_TEXT = _NOT_THE_WORKER | _WORKER_LOST | _REFUSAL_KINDS


def _kind(error: BaseException) -> tuple[str, str]:
    """The kind of Dynamo's error ``error`` is, and what it says: its class's name and
    text, or, for a plain exception whose text starts with one of the kinds in
    ``_KINDS_IN_TEXT`` and a colon, that kind and the text after it."""
    text = str(error)
    if type(error) in (Exception, ValueError, RuntimeError):
        match = _KIND_IN_TEXT.match(text)
        if match is not None and match.group(1) in _KINDS_IN_TEXT:
            return match.group(1), text[match.end():]
    return type(error).__name__, text


def may_fail_over(error: BaseException) -> bool:
    """Whether a stream that ended with ``error`` may go on on another worker: not a
    refusal, Dynamo's own classes or a worker's (an unsupported option, a grammar that does
    not parse: Dynamo 1.6.1 passes these as text that holds "BackendInvalidArgument: ",
    or, read on demand, as text that starts "InvalidRequest: ")."""
    kind, _ = _kind(error)
    return (kind not in _NOT_THE_WORKER and kind not in _REFUSAL_KINDS
            and _BACKEND_REFUSAL not in str(error))


def worker_lost(error: BaseException) -> bool:
    """Whether ``error`` says the worker itself is gone or unreachable (so it is avoided
    for a while), rather than that this one request failed on it: never a refusal, which a
    live worker sends (Dynamo 1.6.1 passes a worker's own as "Unavailable: " text), nor
    any other error a worker's handler sent unless it says its engine is gone."""
    if not may_fail_over(error):
        return False
    sent = _BACKEND_ERROR.search(str(error))
    if sent is not None:
        return sent.group(1) in _WORKER_LOST
    return (_kind(error)[0] in _WORKER_LOST
            or isinstance(error, (ConnectionError, TimeoutError))
            or str(error).startswith(_LOST_PREFIXES))


def refusal(error: BaseException) -> str | None:
    """What a refusal of the request itself says, for its client: Dynamo's
    ``InvalidArgument`` (or, read on demand, the text after "InvalidRequest: "), or a
    worker's own (the ``message`` of the JSON Dynamo 1.6.1 passes on after
    "BackendInvalidArgument: ", else the text there). None for any other error."""
    kind, said = _kind(error)
    if kind in _REFUSAL_KINDS:
        return said
    text = str(error)
    at = text.find(_BACKEND_REFUSAL)
    if at < 0:
        return None
    said = text[at + len(_BACKEND_REFUSAL):].strip()
    try:
        body = json.loads(said)
    except ValueError:
        return said
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) and message else said


# Dynamo 1.6.1's connection and deadline errors name the worker's request-plane address:
# "TCP connection to 127.0.0.1:45289 failed", "TCP request to 127.0.0.1:43629 timed out".
_ADDRESS_IN_ERROR = re.compile(r"\bTCP (?:connection|request) to (\S+:\d+)\b")


def address_in_error(error: BaseException) -> str | None:
    """The ``host:port`` a Dynamo connection or deadline error names, if any."""
    match = _ADDRESS_IN_ERROR.search(str(error))
    return None if match is None else match.group(1)


def worker_at(address: str, instances: Iterable[tuple[int, str]]) -> int | None:
    """The id of the instance, among ``(id, transport address)`` pairs, whose request-plane
    address is ``address`` (a TCP transport address is ``host:port/...``); None if none or
    several. Dynamo calls that format no stable parse target: if it changes, nothing
    matches, and the worker stays unknown as it was before this lookup."""
    ids = {worker_id for worker_id, transport in instances
           if transport.split("/", 1)[0] == address}
    return ids.pop() if len(ids) == 1 else None


def _continuable_midway(request: Mapping[str, Any]) -> bool:
    """Whether a request's output can be resumed from tokens already streamed: not where
    the engine must see the output from its start (a grammar, a thinking budget, prompt
    log-probabilities, several choices)."""
    sampling = request.get("sampling_options") or {}
    output = request.get("output_options") or {}
    stop = request.get("stop_conditions") or {}
    return (sampling.get("guided_decoding") is None and (sampling.get("n") or 1) <= 1
            and output.get("prompt_logprobs") is None
            and stop.get("max_thinking_tokens") is None)


@dataclass
class Continuation:
    """A request's tokens streamed so far, so that its turn can go on on another worker
    when the one serving it fails (the router's failover).

    The client sees one stream. The next worker is asked for the original prompt plus
    the tokens already streamed, within what is left of the token budget, and the usage
    it reports is put back in terms of the original request (:meth:`as_one_stream`).
    """

    request: Mapping[str, Any]
    streamed: array[int] = field(default_factory=lambda: array("q"))
    carried: int = 0  # tokens streamed before the attempt now running began
    failovers: int = 0
    total: int = 0  # tokens streamed to the client, kept or not
    overflowed: bool = False  # more than CONTINUATION_MAX_TOKENS streamed: not kept
    last_error: str | None = None  # the error the last attempt ended with
    failed_workers: set[int] = field(default_factory=set)  # ids that failed this turn
    # The worker/rank and prompt tokens of a failover sent but not yet answered (the
    # router counts them as load there until the KV router does).
    pending: tuple[WorkerKey, int] | None = None

    def carry(self, chunk: Mapping[str, Any]) -> None:
        """Note the tokens of a chunk about to reach the client."""
        tokens = chunk.get("token_ids")
        self.total += len(tokens or ())
        if tokens and not self.overflowed:
            if len(self.streamed) + len(tokens) > CONTINUATION_MAX_TOKENS:
                self.overflowed = True
                self.streamed = array("q")
            else:
                self.streamed.extend(tokens)

    @property
    def budget_spent(self) -> bool:
        """Whether the tokens streamed so far fill the request's ``max_tokens``: a stream
        cut then cost the client nothing but its finish."""
        budget = (self.request.get("stop_conditions") or {}).get("max_tokens")
        return budget is not None and self.total >= int(budget)

    def next_request(self) -> dict[str, Any] | None:
        """The request that goes on where the stream stopped, or None when nothing is
        left to generate (the budget is spent), the stream was too long to keep, or the
        request's output cannot be resumed midway (:func:`_continuable_midway`)."""
        if self.overflowed:
            return None
        request = dict(self.request)
        done = len(self.streamed)
        if done and not _continuable_midway(request):
            return None
        if done:
            stop = dict(request.get("stop_conditions") or {})
            budget = stop.get("max_tokens")
            if budget is not None:
                if int(budget) - done <= 0:
                    return None
                stop["max_tokens"] = int(budget) - done
            if stop.get("min_tokens"):
                stop["min_tokens"] = max(0, int(stop["min_tokens"]) - done)
            request["stop_conditions"] = stop
            request["token_ids"] = [*(self.request.get("token_ids") or []), *self.streamed]
        self.carried = done
        self.failovers += 1
        return request

    def as_one_stream(self, chunk: Mapping[str, Any]) -> Mapping[str, Any]:
        """``chunk`` of a continuation with its usage counted as the original request's:
        the carried tokens are completion, not prompt (cached tokens at most the original
        prompt). Chunks without usage, and every chunk before a failover, pass unchanged."""
        usage = chunk.get("completion_usage")
        if not self.carried or not usage:
            return chunk
        usage = dict(usage)
        carried = self.carried
        if usage.get("prompt_tokens") is not None:
            usage["prompt_tokens"] = max(0, int(usage["prompt_tokens"]) - carried)
        if usage.get("completion_tokens") is not None:
            usage["completion_tokens"] = int(usage["completion_tokens"]) + carried
        details = usage.get("prompt_tokens_details")
        if details and details.get("cached_tokens") is not None and usage.get(
                "prompt_tokens") is not None:
            details = dict(details)
            details["cached_tokens"] = min(int(details["cached_tokens"]),
                                           int(usage["prompt_tokens"]))
            usage["prompt_tokens_details"] = details
        out = dict(chunk)
        out["completion_usage"] = usage
        return out
