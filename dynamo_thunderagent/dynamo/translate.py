"""Pure translations between Dynamo's wire shapes and the scheduler's inputs.

Shapes (Dynamo 1.6.1, tokenized requests from ``python -m dynamo.frontend``):

* request: ``{"model", "token_ids", "stop_conditions", "sampling_options",
  "output_options", "eos_token_ids", "routing", "extra_args",
  "agent_context": {"session_id", "parent_session_id", "session_final"}, ...}``
* response chunk: ``{"token_ids", "finish_reason", "completion_usage":
  {"prompt_tokens", "completion_tokens", "prompt_tokens_details":
  {"cached_tokens"}}, "routing_data": {"worker_id": {"decode_worker_id",
  "decode_dp_rank", ...}}}``
* model card (per worker id, JSON): ``kv_cache_block_size`` and
  ``runtime_config.{total_kv_blocks, data_parallel_start_rank,
  data_parallel_size}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.classifier import (
    Aborted,
    ClassifyRequest,
    Completed,
    RequestEvent,
    Responding,
    Sent,
)
from dynamo_thunderagent.program import (
    NO_PREFIX,
    PrefixBlocks,
    WorkerKey,
    prefix_ends,
    prefix_levels,
)
from dynamo_thunderagent.selector import WorkerLoad

# The headers a client sends (Dynamo's frontend turns them into ``agent_context``).
SESSION_HEADER = "X-Dynamo-Session-ID"
PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def hash_prefix_blocks(token_ids: Sequence[int], block_tokens: int, max_blocks: int,
                       max_tokens: int = 0) -> PrefixBlocks:
    """Chained hashes of the leading full blocks of ``token_ids``, laid out by
    :func:`prefix_ends`: ``max_blocks`` of one block each, or, with ``max_tokens``, spans
    doubling every 32 hashes within that many tokens (at most ``max_blocks`` hashes).

    Each hash covers the whole prefix up to its end, so two prompts share a hash exactly
    when they share that prefix (a common system prompt), like the engine's prefix cache.
    Only equality matters; the values are process-local.
    """
    hashes = []
    previous = 0
    start = 0
    for end in prefix_ends(block_tokens, max_blocks, max_tokens):
        if end > len(token_ids):
            break
        previous = hash((previous, tuple(token_ids[start:end])))
        hashes.append(previous)
        start = end
    return PrefixBlocks(tuple(hashes), block_tokens, prefix_levels(max_tokens))


def classify_request(request: Mapping[str, Any], request_id: str, *, block_tokens: int = 0,
                     prefix_blocks: int = 0, prefix_tokens: int = 0) -> ClassifyRequest:
    """What the classifier needs from a tokenized request.

    With ``prefix_blocks`` > 0 at most that many chained hashes of the leading blocks are
    included, spanning ``prefix_tokens`` leading tokens where that is > 0 (see
    :func:`hash_prefix_blocks`).
    """
    context = request.get("agent_context") or {}
    session_id = context.get("session_id")
    parent = context.get("parent_session_id")
    if session_id is not None:
        session_id = check_session_id(session_id, SESSION_HEADER)
    if parent is not None:
        parent = check_session_id(parent, PARENT_HEADER)
    token_ids = request.get("token_ids") or []
    return ClassifyRequest(
        request_id=request_id,
        session_id=session_id,
        input_tokens=len(token_ids),
        session_final=_truthy(context.get("session_final", False)),
        parent_session_id=parent,
        prefix=(hash_prefix_blocks(token_ids, block_tokens, prefix_blocks, prefix_tokens)
                if prefix_blocks and block_tokens > 0 and session_id is not None
                else NO_PREFIX),
    )


def pin_request(request: Mapping[str, Any], worker: WorkerKey) -> dict[str, Any]:
    """A copy of ``request`` that the KV router must send to exactly ``worker``."""
    pinned = dict(request)
    routing = dict(pinned.get("routing") or {})
    routing["backend_instance_id"] = worker.worker_id
    routing["dp_rank"] = worker.dp_rank
    pinned["routing"] = routing
    return pinned


def session_final_response(request: Mapping[str, Any]) -> dict[str, Any]:
    """The one chunk that answers a session-final request (no worker involved)."""
    prompt = len(request.get("token_ids") or [])
    return {
        "token_ids": [],
        "finish_reason": "stop",
        "completion_usage": {
            "prompt_tokens": prompt,
            "completion_tokens": 0,
            "total_tokens": prompt,
        },
    }


def served_by(chunk: Mapping[str, Any]) -> WorkerKey | None:
    """The worker/rank that served a chunk, from its routing data."""
    routing = chunk.get("routing_data") or {}
    worker = routing.get("worker_id") or {}
    worker_id = worker.get("decode_worker_id", worker.get("prefill_worker_id"))
    if worker_id is None:
        return None
    rank = worker.get("decode_dp_rank", worker.get("prefill_dp_rank")) or 0
    return WorkerKey(int(worker_id), int(rank))


def engine_error(finish_reason: Any) -> str | None:
    """The engine's message if ``finish_reason`` reports an error, else None.

    Dynamo engines end a refused or failed request with a finish reason that is an
    object, ``{"error": "request rejected: ..."}``, or the string ``"error"``.
    """
    if isinstance(finish_reason, Mapping):
        message = finish_reason.get("error")
        return str(message) if message else repr(dict(finish_reason))
    if isinstance(finish_reason, str) and finish_reason.lower() == "error":
        return "the engine reported an error without a message"
    return None


# X-Dynamo-Session-ID (and the parent id) as the router accepts it: 1 to 256 printable
# ASCII characters, spaces included (readable ids such as "user 42 task 7" are served, as
# stock serves them). Dynamo's frontend already drops empty, blank and non-ASCII values
# (the request then arrives without a session); what reaches the router beyond that (a
# control character, an id of any size) is refused rather than kept as a program key.
SESSION_ID_MAX_LENGTH = 256
_SESSION_ID_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F))


class BadSessionHeader(ValueError):
    """A session header the router refuses; the message says what is allowed."""


def check_session_id(value: Any, header: str) -> str:
    """``value`` as a session id, or raise BadSessionHeader saying what is allowed."""
    text = str(value)
    allowed = (f"{header} must be 1 to {SESSION_ID_MAX_LENGTH} printable ASCII characters "
               "(a UUID, say)")
    if not text or len(text) > SESSION_ID_MAX_LENGTH:
        raise BadSessionHeader(f"{allowed}; got {len(text)} characters")
    bad = next((c for c in text if c not in _SESSION_ID_CHARS), None)
    if bad is not None:
        raise BadSessionHeader(f"{allowed}; got the character {bad!r}")
    if not text.strip():
        raise BadSessionHeader(f"{allowed}, not only spaces")
    return text


def for_frontend(chunk: Mapping[str, Any], serving: WorkerKey | None) -> Mapping[str, Any]:
    """The chunk as the frontend should see it from the router component.

    The worker's ``routing_data.worker_id`` is dropped: the frontend has already
    recorded the router as the request's worker, and a second, different id makes
    its request tracker log "Conflicting request tracker write" twice a request.
    The serving worker/rank still reaches clients (``serving``: on the first chunk
    that names it) under ``engine_data.thunderagent``. Other chunks pass unchanged.
    """
    routing = chunk.get("routing_data")
    if (not routing or "worker_id" not in routing) and serving is None:
        return chunk
    out = dict(chunk)
    if routing and "worker_id" in routing:
        out["routing_data"] = {k: v for k, v in routing.items() if k != "worker_id"}
    return with_serving_worker(out, serving) if serving is not None else out


def with_serving_worker(chunk: Mapping[str, Any], worker: WorkerKey) -> dict[str, Any]:
    """``chunk`` plus the serving worker/rank under ``engine_data.thunderagent``.

    Behind a router component the frontend reports the router's own instance
    as ``nvext.worker_id``; clients that ask for ``nvext.extra_fields:
    ["engine_data"]`` see the real worker here.
    """
    out = dict(chunk)
    engine_data = dict(out.get("engine_data") or {})
    engine_data["thunderagent"] = {"worker_id": worker.worker_id, "dp_rank": worker.dp_rank}
    out["engine_data"] = engine_data
    return out


@dataclass
class StreamTracker:
    """Turns one request's response chunks into lifecycle events, exactly once each.

    ``Sent`` when the serving worker is first known, ``Responding`` at the
    first generated token, then exactly one terminal event: ``Completed`` with
    prompt + generated tokens at the finishing chunk, or ``Aborted`` from
    :meth:`abort` (error, disconnect, cancellation, or a stream that ended
    without a finish reason).
    """

    request_id: str
    prompt_tokens: int
    sent_to: WorkerKey | None = None
    responding: bool = False
    generated_tokens: int = 0
    cached_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    # The engine's prefill time of this request (routing_data.timing), when reported.
    prefill_ms: float | None = None
    terminal: RequestEvent | None = None
    engine_error: str | None = None  # the engine's message, if it ended the stream with one
    _pending: list[RequestEvent] = field(default_factory=list)

    def observe(self, chunk: Mapping[str, Any]) -> list[RequestEvent]:
        """Events this chunk reveals (in order); none after the terminal one."""
        if self.terminal is not None:
            return []
        events: list[RequestEvent] = []
        worker = served_by(chunk)
        if worker is not None and self.sent_to is None:
            self.sent_to = worker
            events.append(Sent(self.request_id, worker))
        tokens = chunk.get("token_ids") or []
        self.generated_tokens += len(tokens)
        if tokens and not self.responding:
            self.responding = True
            events.append(Responding(self.request_id))
        usage = chunk.get("completion_usage") or {}
        if usage:
            self.usage_prompt_tokens = usage.get("prompt_tokens", self.usage_prompt_tokens)
            self.usage_completion_tokens = usage.get(
                "completion_tokens", self.usage_completion_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                self.cached_tokens = int(details["cached_tokens"])
        timing = (chunk.get("routing_data") or {}).get("timing") or {}
        if timing.get("prefill_time_ms") is not None:
            self.prefill_ms = float(timing["prefill_time_ms"])
        finish = chunk.get("finish_reason")
        error = engine_error(finish)
        if error is not None:
            # The engine refused or failed the request: nothing new is in its cache.
            self.engine_error = error
            self.terminal = Aborted(self.request_id, f"engine error: {error}")
            events.append(self.terminal)
        elif finish is not None:
            events.append(self._complete())
        return events

    def _complete(self) -> Completed:
        """The ``Completed`` event, now the terminal one: prompt + tokens generated."""
        prompt = self.usage_prompt_tokens or self.prompt_tokens
        completed = Completed(self.request_id, int(prompt) + int(self.output_tokens),
                              self.cached_tokens)
        self.terminal = completed
        return completed

    @property
    def output_tokens(self) -> int:
        """Tokens generated so far (the engine's usage count when it is larger)."""
        return max(self.generated_tokens, self.usage_completion_tokens or 0)

    @property
    def uncached_tokens(self) -> int | None:
        """Prompt tokens the engine had to prefill (None until usage is known)."""
        if self.cached_tokens is None:
            return None
        return max(0, (self.usage_prompt_tokens or self.prompt_tokens) - self.cached_tokens)

    def rerouted(self) -> None:
        """The turn goes on on another worker (failover): its next chunk that names a
        worker is a ``Sent`` again, so that the scheduler follows the program there."""
        self.sent_to = None

    def abort(self, reason: str) -> list[RequestEvent]:
        """The terminal event if the stream ended any other way; else nothing."""
        if self.terminal is not None:
            return []
        self.terminal = Aborted(self.request_id, reason)
        return [self.terminal]

    def cut_by_the_frontend(self, reason: str, *, stop_strings: bool) -> list[RequestEvent]:
        """The terminal event when the frontend ends the stream before its finish: its
        client went away, or, for a request with stop strings (``stop_strings``), the text
        reached one. Dynamo's frontend matches stop strings in the text itself and then
        drops the stream as it does for a client that leaves; the two look the same here.
        With stop strings and tokens streamed the turn is ``Completed`` with the tokens
        streamed so far (they are in the worker's cache either way, and an agent's next
        turn extends them); else it is ``Aborted``, as :meth:`abort`."""
        if self.terminal is not None:
            return []
        if not (stop_strings and self.responding):
            return self.abort(reason)
        return [self._complete()]


def asks_for_stop_strings(request: Mapping[str, Any]) -> bool:
    """Whether a request (the frontend's preprocessed dict) asks to stop at any string,
    which Dynamo's frontend, not the engine, then watches for."""
    stop = (request.get("stop_conditions") or {}).get("stop")
    return bool(stop)


# A worker's card naming more data-parallel ranks than this is not read: no deployment runs
# that many, and each rank becomes a pool the scheduler tracks.
MAX_DP_RANKS = 4096


def capacity_cards(
    model_cards: Mapping[str, str | Mapping[str, Any]],
    unreadable: dict[str, str] | None = None,
) -> dict[WorkerKey, CapacityCard]:
    """Capacity cards per worker/rank from the workers' published model cards.

    A card without ``total_kv_blocks`` (or with a non-positive block size)
    contributes nothing: that worker is live but its capacity is unknown. So does a
    card that cannot be read (not JSON, not an object, a field that is not a whole
    number in its range): it is left out, with why, in ``unreadable`` (worker id ->
    reason) when given, and the other workers' cards still count.
    """
    cards: dict[WorkerKey, CapacityCard] = {}
    for worker_id, raw in model_cards.items():
        try:
            found = _capacity_card(worker_id, raw)
        except ValueError as error:
            if unreadable is not None:
                unreadable[str(worker_id)] = str(error)
            continue
        cards.update(found)
    return cards


def prefill_only_workers(model_cards: Mapping[str, str | Mapping[str, Any]]) -> frozenset[int]:
    """The workers whose model card says they only prefill (``worker_type: "prefill"``, a
    disaggregated deployment's prefill workers, which answer a request with its first token
    alone and leave the rest to a decode worker). A card that cannot be read says nothing."""
    found = set()
    for worker_id, raw in model_cards.items():
        try:
            card = json.loads(raw) if isinstance(raw, str) else raw
            wid = _whole(worker_id, "the worker id")
        except ValueError:
            continue
        kind = card.get("worker_type") if isinstance(card, Mapping) else None
        if isinstance(kind, str) and kind.strip().lower() == "prefill":
            found.add(wid)
    return frozenset(found)


def _capacity_card(worker_id: str, raw: str | Mapping[str, Any]) -> dict[WorkerKey, CapacityCard]:
    """One worker's ranks and their card; ValueError says what cannot be read."""
    wid = _whole(worker_id, "the worker id")
    card = json.loads(raw) if isinstance(raw, str) else raw  # JSONDecodeError is a ValueError
    if not isinstance(card, Mapping):
        raise ValueError(f"the model card is a JSON {type(card).__name__}, not an object")
    runtime = card.get("runtime_config") or {}
    if not isinstance(runtime, Mapping):
        raise ValueError("runtime_config is not an object")
    blocks = runtime.get("total_kv_blocks")
    block_size = card.get("kv_cache_block_size")
    if not blocks or not block_size:
        return {}
    blocks = _whole(blocks, "runtime_config.total_kv_blocks")
    block_size = _whole(block_size, "kv_cache_block_size")
    if blocks == 0 or block_size == 0:
        return {}
    start = _whole(runtime.get("data_parallel_start_rank") or 0,
                   "runtime_config.data_parallel_start_rank")
    size = max(1, _whole(runtime.get("data_parallel_size") or 1,
                         "runtime_config.data_parallel_size"))
    if size > MAX_DP_RANKS:
        raise ValueError(f"runtime_config.data_parallel_size must be at most {MAX_DP_RANKS}, "
                         f"got {size}")
    length = card_context_length(card, runtime) or 0
    return {WorkerKey(wid, rank): CapacityCard(blocks, block_size, length)
            for rank in range(start, start + size)}


def card_context_length(card: Mapping[str, Any], runtime: Mapping[str, Any]) -> int | None:
    """The engine's limit on a prompt (``--max-model-len``) a model card states: its
    ``runtime_config``'s ``context_length``, else the card's own; None where neither is a
    positive whole number."""
    for value in (runtime.get("context_length"), card.get("context_length")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _whole(value: Any, name: str) -> int:
    """``value`` as a whole number >= 0 (an int, or a string of one); else ValueError
    naming ``name``, what is allowed and what it got."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None or number < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r:.60}")
    return number


def worker_loads(
    potential_loads: Iterable[Mapping[str, Any]], live_worker_ids: Iterable[int]
) -> list[WorkerLoad]:
    """Selector candidates: the KV router's per-rank loads, live workers only."""
    live = set(live_worker_ids)
    loads = []
    for row in potential_loads:
        worker_id = int(row["worker_id"])
        if worker_id not in live:
            continue
        loads.append(WorkerLoad(
            worker=WorkerKey(worker_id, int(row.get("dp_rank") or 0)),
            prefill_tokens=int(row.get("potential_prefill_tokens") or 0),
            decode_blocks=int(row.get("potential_decode_blocks") or 0),
        ))
    return sorted(loads, key=lambda load: load.worker)
