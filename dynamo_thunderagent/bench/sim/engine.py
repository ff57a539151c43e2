"""Simulated workers: continuous batching over a paged KV pool, on a fake clock.

The model of one worker (one engine, one KV pool)
-------------------------------------------------
* A request routed to the worker joins its FIFO waiting queue.
* Each engine *pass* schedules, like vLLM v1 with chunked prefill: one token for every
  running request that is decoding, then prompt chunks of running requests still in prefill,
  then requests admitted from the head of the waiting queue while fewer than
  ``max_num_seqs`` run and the pass has token budget left (``max_num_batched_tokens``).
* Admission holds the request's whole context in the KV pool up front: the prompt *and* its
  output blocks (the simulator knows the output length). So a running request never runs out
  of blocks and nothing is preempted; a head request whose blocks do not fit into free plus
  evictable memory waits, and blocks the queue behind it (FCFS, as vLLM does). The cost of
  this choice: memory for outputs is reserved a little early (outputs are ~1% of an agent
  context), and vLLM's recompute-preemption under decode growth is not modelled.
* The cached part of a prompt is what the pool holds *when the request is admitted*, not when
  it was routed: a request that waits in the queue can lose its own cache meanwhile.
* A pass lasts ``TimingModel.pass_seconds(prefill tokens, decoding requests, their KV
  tokens)``. A request whose last prompt chunk is computed emits its first token at the end of
  that pass; a decoding request emits one token per pass.

Speed: a run of pure decode passes is simulated as one *jump*: while no request is in prefill
and the waiting queue cannot change the batch, every pass is the same, so the worker advances
to the pass where the first request finishes. Anything that may change the batch (a request
arriving, a pinned chain expiring) cuts the jump at the end of the pass in progress. The KV
term of a decode pass is taken at the start of the jump (it grows by one token per request
per pass; over a jump of ~100 passes that is < 1% of an agent context).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dynamo_thunderagent.bench.sim.kv import SYSTEM_CHAIN, KvPool
from dynamo_thunderagent.bench.sim.timing import TimingModel


@dataclass(frozen=True)
class EngineConfig:
    """One worker's engine: KV pool geometry, batching limits, timing.

    ``reuse_output``: the client sends the model's reply back verbatim in the next prompt,
    so a turn's generated tokens stay reusable cache (real agents); False models a client
    that substitutes other text of the same length (their KV is then never hit).
    """

    total_blocks: int
    block_size: int
    timing: TimingModel
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    reuse_output: bool = True
    # Host tier (0 blocks: none): blocks per worker, and seconds to copy one token's KV
    # between host and GPU (either way; the request that needs the copy waits for it).
    host_blocks: int = 0
    host_copy_s_per_token: float = 0.0

    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    def fits(self, tokens: int) -> bool:
        """Whether a context of ``tokens`` fits a worker's whole pool, in whole blocks."""
        return math.ceil(tokens / self.block_size) <= self.total_blocks


@dataclass(slots=True)
class SimRequest:
    """One LLM turn of one program, from the agent sending it to its last token.

    Times are simulated seconds; None until the event happened.
    """

    request_id: str
    session_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    system_tokens: int
    sent_at: float
    # Prompt tokens the previous turn of the program left reusable, whole blocks (0 on turn 0).
    reusable_tokens: int = 0
    released_at: float | None = None  # admitted by the arm's gate (= routed)
    worker: int | None = None
    scheduled_at: float | None = None  # admitted into the engine's running batch
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int = 0
    prefill_left: int = 0
    generated: int = 0
    chain_blocks: int = 0
    ready_at: float = 0.0  # admitted, but waits for host-tier copies until then
    loaded_tokens: int = 0  # of cached_tokens, copied back from the host tier

    @property
    def context_tokens(self) -> int:
        """Prompt plus generated tokens: what the program's cache holds after this turn."""
        return self.prompt_tokens + self.output_tokens


class EventLoop:
    """A heap of timed callbacks; ties run in scheduling order (so runs are deterministic)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at simulated time ``when`` (never before ``now``)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, callback))

    def run(self, until: float, done: Callable[[], bool] = lambda: False) -> None:
        """Run events up to time ``until`` (inclusive) or until ``done()``."""
        heap = self._heap
        while heap and heap[0][0] <= until and not done():
            when, _, callback = heapq.heappop(heap)
            self.now = when
            callback()
        if not done() and (not heap or heap[0][0] > until):
            self.now = max(self.now, until)

    @property
    def pending(self) -> int:
        return len(self._heap)


@dataclass
class _Jump:
    start: float
    pass_s: float
    passes: int
    token: int


@dataclass
class WorkerStats:
    passes: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0


class Worker:
    """One engine: a waiting queue, a running batch and a KV pool (module docstring).

    ``on_first_token(request)`` and ``on_finish(request)`` are called at the end of the pass
    that produced the token; a finished request's blocks are already released then.
    ``jumps=False`` simulates every decode pass as its own event (slow; the tests use it to
    check that jumps change nothing).
    """

    def __init__(self, index: int, config: EngineConfig, loop: EventLoop,
                 on_first_token: Callable[[SimRequest], None],
                 on_finish: Callable[[SimRequest], None], *, jumps: bool = True) -> None:
        self.index = index
        self.jumps = jumps
        self.config = config
        self.kv = KvPool(config.total_blocks, config.block_size, config.host_blocks)
        self.loop = loop
        self.queue: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = WorkerStats()
        self._on_first_token = on_first_token
        self._on_finish = on_finish
        self._in_pass = False
        self._token = 0  # invalidates a scheduled pass end when a jump is cut short
        self._jump: _Jump | None = None
        self._pins: dict[str, int] = {}  # chain -> serial of its pending unpin event
        self._pin_serial = 0

    # ---- what routers see ------------------------------------------------------------
    def system_blocks(self, request: SimRequest) -> int:
        return request.system_tokens // self.config.block_size

    def hit_tokens(self, request: SimRequest) -> int:
        """Prompt tokens of ``request`` the pool would serve from cache right now."""
        system, chain = self.kv.hit(self.system_blocks(request), request.session_id)
        return min((system + chain) * self.config.block_size, request.prompt_tokens - 1)

    def prefill_tokens(self) -> int:
        """Uncached prompt tokens routed here and not yet computed (the KV router's view)."""
        queued = sum(r.prompt_tokens - self.hit_tokens(r) for r in self.queue)
        return queued + sum(r.prefill_left for r in self.running)

    def decode_blocks(self) -> int:
        """Blocks of every request routed here and not finished (running or queued)."""
        size = self.config.block_size
        return (self.kv.active_blocks
                + sum(math.ceil(r.prompt_tokens / size) for r in self.queue))

    # ---- requests ----------------------------------------------------------------------
    def fits_ever(self, request: SimRequest) -> bool:
        """False if the request's context exceeds this worker's whole pool."""
        return self.config.fits(request.context_tokens)

    def submit(self, request: SimRequest) -> None:
        request.worker = self.index
        self.queue.append(request)
        self.kick()

    def pin(self, chain: str, seconds: float) -> None:
        """Protect ``chain``'s idle cache for ``seconds`` (the TTL-pinning arm)."""
        if not (seconds > 0 and self.kv.pin(chain)):
            return
        self._pin_serial += 1
        serial = self._pins[chain] = self._pin_serial
        self.loop.at(self.loop.now + seconds, lambda: self._expire_pin(chain, serial))

    def unpin(self, chain: str) -> None:
        self._pins.pop(chain, None)
        if self.kv.unpin(chain):
            self.kick()  # freed memory may admit the queue head

    def retire(self, chain: str) -> None:
        """``chain``'s history was compacted away: its cache becomes garbage here."""
        self._pins.pop(chain, None)
        was_pinned = self.kv.is_pinned(chain)
        self.kv.retire(chain)
        if was_pinned:
            self.kick()  # its blocks became evictable and may admit the queue head

    def _expire_pin(self, chain: str, serial: int) -> None:
        if self._pins.get(chain) == serial:
            self.unpin(chain)

    def kick(self) -> None:
        """Something that may change the batch happened: start a pass or cut a jump."""
        if not self._in_pass:
            self._start_pass()
            return
        jump = self._jump
        if jump is None:
            return  # a single pass: the change is seen when it ends
        now = self.loop.now
        done = int((now - jump.start) / jump.pass_s)
        if jump.start + (done + 1) * jump.pass_s <= now:
            done += 1  # float rounding at a pass boundary
        passes = done + 1
        if passes >= jump.passes:
            return
        self._token += 1
        jump.passes, jump.token = passes, self._token
        token = self._token
        self.loop.at(jump.start + passes * jump.pass_s, lambda: self._end_jump(token))

    # ---- passes ------------------------------------------------------------------------
    def _admit(self, request: SimRequest) -> bool:
        config = self.config
        size = config.block_size
        system_blocks = self.system_blocks(request)
        chain_blocks = max(0, math.ceil(request.context_tokens / size) - system_blocks)
        plan = self.kv.plan(system_blocks, request.session_id, chain_blocks)
        if not plan.fits:
            return False
        plan = self.kv.acquire(system_blocks, request.session_id, chain_blocks)
        self._pins.pop(request.session_id, None)  # an acquired chain is no longer pinned
        request.chain_blocks = chain_blocks
        request.cached_tokens = min(plan.hit_blocks * size, request.prompt_tokens - 1)
        request.loaded_tokens = min(plan.loaded_blocks * size, request.cached_tokens)
        request.prefill_left = request.prompt_tokens - request.cached_tokens
        now = request.scheduled_at = self.loop.now
        copied = (plan.loaded_blocks + plan.offloaded_blocks) * size
        if copied:
            request.ready_at = now + copied * config.host_copy_s_per_token
            self.loop.at(request.ready_at, self.kick)
        return True

    def _start_pass(self) -> None:
        config = self.config
        budget = config.max_num_batched_tokens
        decoding = [r for r in self.running if r.prefill_left == 0]
        budget -= len(decoding)
        chunks: list[tuple[SimRequest, int]] = []
        now = self.loop.now
        for request in self.running:
            if request.prefill_left > 0 and budget > 0 and request.ready_at <= now:
                take = min(request.prefill_left, budget)
                chunks.append((request, take))
                budget -= take
        while (self.queue and budget > 0 and len(self.running) < config.max_num_seqs
               and self._admit(self.queue[0])):
            request = self.queue.popleft()
            self.running.append(request)
            if request.ready_at > now:
                continue  # its host-tier copies end later; that moment kicks a pass
            take = min(request.prefill_left, budget)
            chunks.append((request, take))
            budget -= take
        if not chunks and not decoding:
            self._in_pass = False
            return
        self._in_pass = True
        kv_tokens = sum(r.prompt_tokens + r.generated for r in decoding)
        prefill = sum(take for _, take in chunks)
        pass_s = config.timing.pass_seconds(prefill, len(decoding), kv_tokens)
        self.stats.prefill_tokens += prefill
        self._token += 1
        token = self._token
        passes = min(r.output_tokens - r.generated for r in decoding) if decoding else 1
        if self.jumps and not chunks and passes > 1 and pass_s > 0:
            # Pure decode and the queue cannot join (empty, or its head does not fit):
            # identical passes until the first request finishes (cut by kick()).
            self._jump = _Jump(now, pass_s, passes, token)
            self.loop.at(now + passes * pass_s, lambda: self._end_jump(token))
            return
        self._jump = None
        self.loop.at(now + pass_s, lambda: self._end_pass(token, chunks, decoding, pass_s))

    def _end_jump(self, token: int) -> None:
        jump = self._jump
        if jump is None or jump.token != token:
            return  # superseded by a cut
        self._jump = None
        decoding = [r for r in self.running if r.prefill_left == 0]
        for request in decoding:
            request.generated += jump.passes - 1  # the last pass is applied by _end_pass
        self.stats.passes += jump.passes - 1
        self.stats.busy_s += (jump.passes - 1) * jump.pass_s
        self._end_pass(None, [], decoding, jump.pass_s)

    def _end_pass(self, token: int | None, chunks: list[tuple[SimRequest, int]],
                  decoding: list[SimRequest], pass_s: float) -> None:
        if token is not None and token != self._token:
            return
        now = self.loop.now
        self.stats.passes += 1
        self.stats.busy_s += pass_s
        first: list[SimRequest] = []
        for request, take in chunks:
            request.prefill_left -= take
            if request.prefill_left == 0:
                request.generated += 1
                request.first_token_at = now
                first.append(request)
        for request in decoding:
            request.generated += 1
        finished = [r for r in self.running if r.generated >= r.output_tokens]
        if finished:
            self.running = [r for r in self.running if r.generated < r.output_tokens]
            for request in finished:
                self._release(request)
        self._in_pass = False
        for request in first:
            self._on_first_token(request)
        for request in finished:
            request.finished_at = now
            self._on_finish(request)
        if not self._in_pass:
            self._start_pass()

    def _release(self, request: SimRequest) -> None:
        size = self.config.block_size
        cached = request.context_tokens if self.config.reuse_output else request.prompt_tokens
        keep = max(0, cached // size - self.system_blocks(request))
        self.kv.release(self.system_blocks(request), request.session_id, keep)


@dataclass
class Cluster:
    """The workers of one run, with the views routers and selectors read."""

    workers: list[Worker] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, index: int) -> Worker:
        return self.workers[index]

    @property
    def block_size(self) -> int:
        return self.workers[0].config.block_size

    def check(self) -> None:
        for worker in self.workers:
            worker.kv.check()


__all__ = ["SYSTEM_CHAIN", "Cluster", "EngineConfig", "EventLoop", "SimRequest", "Worker"]
