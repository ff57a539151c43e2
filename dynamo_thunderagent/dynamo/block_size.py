"""The KV block size the router's KV router hashes prompts with: the workers' own.

Dynamo's ``KvRouter`` is built once with a block size, and it matches the prefix hashes of a
request against the KV events the engines publish, which are hashed with the engines' block
size. With another size nothing matches: requests without a session id (which the KV router
places) lose their prefix-cache affinity, with no error anywhere (seen live: mocker workers
at 64 tokens a block and a router at 16 sent a repeated prompt to the other worker). The
engines' sizes differ (vLLM 16, TensorRT-LLM 32, SGLang 1, the mocker 64 unless told), and
each worker's model card says its own (``kv_cache_block_size``).

So ``serve`` takes the size from the workers' cards when it starts: without ``--block-size``
it waits for a card (up to :data:`WAIT_SECONDS`); with it, a card that says otherwise wins
and the flag is reported as overridden (a card that arrives later does not change the KV
router: with the flag, serve does not wait). Where the cards come to disagree later (workers
started after serve's wait, or restarted with another size), the router cannot rebuild its
KV router; :func:`mismatch` says so for the log, ``/state`` (``kv_router``) and ``doctor``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_BLOCK_SIZE = 16
WAIT_SECONDS = 30.0
POLL_SECONDS = 0.25


def card_block_sizes(model_cards: Mapping[str, str | Mapping[str, Any]]) -> set[int]:
    """The block sizes the workers' model cards state (cards without one say nothing)."""
    sizes = set()
    for raw in model_cards.values():
        try:
            card = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue  # not JSON: it says nothing we can read
        if not isinstance(card, Mapping):
            continue
        size = card.get("kv_cache_block_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            sizes.add(size)
    return sizes


def choose(flag: int | None, seen: set[int]) -> tuple[int, str | None]:
    """The block size to build the KV router with, from ``--block-size`` (None: not given)
    and the sizes the workers' cards state, and what to warn about (None: nothing)."""
    if len(seen) == 1:
        (size,) = seen
        if flag is not None and flag != size:
            return size, (f"--block-size {flag} overridden: the workers' model cards say "
                          f"{size} tokens a KV block, and the KV router must hash prompts "
                          "as the engines do")
        return size, None
    if len(seen) > 1:
        size = flag if flag in seen else min(seen)
        return size, (f"the workers' model cards disagree on the KV block size "
                      f"({', '.join(map(str, sorted(seen)))}); using {size}: requests without "
                      "a session id lose prefix-cache routing on workers of another size "
                      "(serve one block size per model)")
    if flag is not None:
        return flag, None
    return DEFAULT_BLOCK_SIZE, (f"no worker's model card was seen within {WAIT_SECONDS:g} s; "
                                f"assuming {DEFAULT_BLOCK_SIZE} tokens a KV block (pass "
                                "--block-size if the engines use another; a mismatch is "
                                "reported in /state kv_router once their cards arrive)")


def mismatch(kv_router_block_size: int, workers: set[int]) -> str | None:
    """What is wrong when the workers' cards now state another size than the KV router's
    (``workers``: the sizes they state; none yet is no mismatch)."""
    if not workers or workers == {kv_router_block_size}:
        return None
    said = ", ".join(map(str, sorted(workers)))
    return (f"the workers' model cards now say {said} tokens a KV block, the KV router "
            f"hashes with {kv_router_block_size}: requests without a session id lose "
            f"prefix-cache routing on workers of another size; restart serve once the "
            f"workers are up (it reads the size from their cards)")


def report(kv_router_block_size: int, workers: set[int]) -> dict[str, object]:
    """/state ``kv_router``: the KV router's block size, the sizes the workers' cards state
    now, and what is wrong (null when they agree)."""
    return {"block_size": kv_router_block_size, "workers_block_sizes": sorted(workers),
            "mismatch": mismatch(kv_router_block_size, workers)}


async def await_block_size(read_cards: Callable[[], Mapping[str, Any]], flag: int | None,
                           wait: float = WAIT_SECONDS,
                           clock: Callable[[], float] | None = None) -> tuple[int, str | None]:
    """:func:`choose` over the cards ``read_cards`` returns; without ``flag`` it polls until
    a card states a size or ``wait`` seconds have passed."""
    loop = asyncio.get_running_loop()
    now = clock or loop.time
    deadline = now() + wait
    while True:
        seen = card_block_sizes(read_cards())
        if seen or flag is not None or now() >= deadline:
            return choose(flag, seen)
        await asyncio.sleep(POLL_SECONDS)
