"""The paged KV pool of one simulated worker, with prefix caching and LRU eviction.

What is modelled
----------------
Every agent context is a *prefix chain*: the job's shared system prompt followed by the
program's own history (which only grows). The pool caches whole blocks of ``block_size``
tokens. The first ``system_blocks`` full blocks of every context hold the system prompt and
are shared by all programs (one copy per worker); every later block, including the one where
the system prompt ends and the history begins, belongs to one program's chain.

Why chains and not blocks
-------------------------
A real engine (vLLM v1) keeps a hash per block and frees a finished request's blocks onto its
free queue tail-first, so the tail of a context is evicted before its head; a later request
re-acquires the prefix it hits. Under those two rules the blocks of a chain that are still
resident always form a *prefix* of the chain: eviction only ever trims a chain from its tail,
and a request re-acquires its chain from the head. So a chain is fully described by one
number, its resident block count, and the pool's LRU is an ordered map of idle chains rather
than of blocks. That keeps a lookup O(1) instead of O(context blocks), which is what lets a
sweep of thousands of 40k-token turns run in seconds.

States of a chain on a worker: *active* (held by a running request: never evicted), *idle*
(in the LRU, evictable oldest-first, trimmed from its tail), *pinned* (idle but protected
until unpinned: the TTL-pinning arm), or absent. The system chain is shared: it is active
while any running request holds it (reference counted). Programs whose system prompts differ
in length (an imported trace's sessions) share it as far as their prompts agree, a shorter
prompt being a prefix of a longer one: it holds the longest resident prompt's blocks, and
grows when a longer one runs. While any request runs, the blocks beyond the running
prompts' are held too, where a real engine could evict them; only mixed lengths see this.

A hit stops at the first missing block: if the system chain has been trimmed, the program's
own blocks are unreachable (their hashes chain through the missing block) even though they
still occupy memory, exactly as in a hashed prefix cache.

A compaction (the program's history replaced by a summary, ``TurnPlan.compaction``) makes
its old chain garbage: no later prompt extends it, yet a real engine keeps its blocks cached
until the LRU reaches them. :meth:`KvPool.retire` models exactly that: the old chain stays
idle in its LRU place under a key no request uses, and the program starts a new chain.

A host tier (:class:`HostCache`, optional) is what the 1.6.1 mocker models of vLLM's native
offload, as measured here: blocks evicted from the GPU pool are copied to host memory (the
request whose allocation evicted them waits for that copy), and a later request that finds
its context on the host gets it copied back (it waits for that copy, the engine does not)
instead of computing it. Eviction trims a chain from its tail, so what the host holds of a
chain is one range of its blocks; it is usable as long as it starts where the chain's GPU
prefix ends. The host evicts least recently stored chains first, tail first, like the pool.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Final

SYSTEM_CHAIN: Final = ""  # chain key of the shared system prompt (session ids are non-empty)


@dataclass(frozen=True)
class Acquisition:
    """What scheduling one request on this pool would take.

    ``hit_blocks``: leading blocks of the context found cached (system + own chain).
    ``new_blocks``: blocks to take from free or evictable memory.
    ``fits``: whether ``new_blocks`` fit into free + evictable blocks right now.
    """

    system_hit: int
    chain_hit: int
    new_blocks: int
    fits: bool
    # Host tier: chain blocks past the GPU hit copied back from host memory, and (known once
    # acquired) blocks the allocation evicted to host memory.
    loaded_blocks: int = 0
    offloaded_blocks: int = 0

    @property
    def hit_blocks(self) -> int:
        """Leading blocks not computed: found on the GPU or copied back from the host."""
        return self.system_hit + self.chain_hit + self.loaded_blocks


class HostCache:
    """The host-memory tier behind one pool: per chain, one range of offloaded blocks.

    Least recently stored chains are evicted first, each trimmed from its tail.
    Invariant (checked by :meth:`check`): ``used == sum of range lengths <= capacity``.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"need a host tier of > 0 blocks, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._ranges: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.used_blocks = 0

    def reach(self, chain: str, gpu_blocks: int) -> int:
        """How far the host extends a chain whose first ``gpu_blocks`` are on the GPU."""
        held = self._ranges.get(chain)
        if held is None or held[0] > gpu_blocks:
            return gpu_blocks
        return max(gpu_blocks, held[1])

    def store(self, chain: str, start: int, end: int) -> None:
        """Blocks ``[start, end)`` of ``chain`` were copied here (evicted from the GPU)."""
        old = self._ranges.pop(chain, None)
        if old is not None:
            self.used_blocks -= old[1] - old[0]
            if old[0] <= end and start <= old[1]:  # touching or overlapping: one range
                start, end = min(start, old[0]), max(end, old[1])
        end = min(end, start + self.capacity_blocks)
        self._ranges[chain] = (start, end)
        self.used_blocks += end - start
        excess = self.used_blocks - self.capacity_blocks
        while excess > 0:
            key, (first, last) = next(iter(self._ranges.items()))
            taken = min(excess, last - first)
            if taken == last - first:
                del self._ranges[key]
            else:
                self._ranges[key] = (first, last - taken)
            self.used_blocks -= taken
            excess -= taken

    def drop(self, chain: str) -> None:
        """Forget ``chain`` (its history was compacted away: no prompt extends it again)."""
        held = self._ranges.pop(chain, None)
        if held is not None:
            self.used_blocks -= held[1] - held[0]

    def check(self) -> None:
        assert self.used_blocks == sum(end - start for start, end in self._ranges.values())
        assert 0 <= self.used_blocks <= self.capacity_blocks


class KvPool:
    """One worker's KV blocks: free, held by running requests, idle-cached or pinned.

    Invariant (checked by :meth:`check`): ``free + active + idle + pinned == total``.
    """

    def __init__(self, total_blocks: int, block_size: int, host_blocks: int = 0) -> None:
        if total_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need total_blocks > 0 and block_size > 0, got "
                             f"{total_blocks} x {block_size}")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.free_blocks = total_blocks
        # Idle chains, least recently released first: chain -> resident blocks.
        self._idle: OrderedDict[str, int] = OrderedDict()
        self._pinned: dict[str, int] = {}
        self._active: dict[str, int] = {}  # chain -> blocks held by running requests
        self._refs: dict[str, int] = {}  # chain -> running requests holding it
        self.idle_blocks = 0
        self.pinned_blocks = 0
        self.active_blocks = 0
        self.evicted_blocks = 0  # lifetime count, for reports
        self._retired = 0  # garbage chains made so far (their keys are unique)
        self.host = HostCache(host_blocks) if host_blocks > 0 else None
        self.loaded_blocks = 0  # lifetime counts of the host tier's copies, for reports
        self.offloaded_blocks = 0
        self._offloading = 0  # blocks the allocation in progress evicted to the host

    # ---- queries ------------------------------------------------------------------
    def resident(self, chain: str) -> int:
        """Blocks of ``chain`` resident on this worker (active, idle or pinned)."""
        if chain in self._active:
            return self._active[chain]
        if chain in self._idle:
            return self._idle[chain]
        return self._pinned.get(chain, 0)

    def is_pinned(self, chain: str) -> bool:
        return chain in self._pinned

    def hit(self, system_blocks: int, chain: str) -> tuple[int, int]:
        """Leading cached blocks of a context: ``(system blocks hit, own-chain blocks hit)``.

        The own chain counts only if the whole system prefix is resident (a hashed prefix
        cache stops at the first miss).
        """
        system = min(self.resident(SYSTEM_CHAIN), system_blocks) if system_blocks else 0
        if system < system_blocks:
            return system, 0
        return system, self.resident(chain)

    def plan(self, system_blocks: int, chain: str, chain_blocks: int) -> Acquisition:
        """What holding ``system_blocks`` + ``chain_blocks`` for one request would take.

        The hit is in blocks; the caller turns it into cached tokens (an engine computes at
        least the last prompt token, so a full hit still prefills one token).
        """
        system_hit, resident = self.hit(system_blocks, chain)
        chain_hit = min(resident, chain_blocks)
        # The system chain is one prefix that every program shares as far as their system
        # prompts agree (a shorter one is a prefix of a longer one, as the live driver writes
        # them): a request adds the blocks of its own that are not resident, and the chain
        # keeps the longest prompt's blocks that are.
        system_new = system_blocks - system_hit
        # Blocks of the old chain that are resident but not reused go back to free memory
        # (unreachable after a system-prefix miss, or beyond what this request covers).
        returned = self.resident(chain) - chain_hit
        new_blocks = system_new + (chain_blocks - chain_hit)
        evictable = self.idle_blocks
        if chain in self._idle:
            evictable -= self._idle[chain]  # taken by this request, not evicted
        if system_blocks and SYSTEM_CHAIN in self._idle:
            evictable -= self._idle[SYSTEM_CHAIN]
        fits = new_blocks <= self.free_blocks + returned + evictable
        loaded = 0
        if self.host is not None and system_hit == system_blocks:
            loaded = min(self.host.reach(chain, resident), chain_blocks) - chain_hit
        return Acquisition(system_hit, chain_hit, new_blocks, fits, max(0, loaded))

    # ---- transitions ----------------------------------------------------------------
    def acquire(self, system_blocks: int, chain: str, chain_blocks: int) -> Acquisition:
        """Hold the blocks of one request's context; raises if they do not fit.

        The request's own idle or pinned chain becomes active (its hit part is reused, the
        rest returned), missing blocks come from free memory, then from evicting the least
        recently used idle chains, tail first.
        """
        plan = self.plan(system_blocks, chain, chain_blocks)
        if not plan.fits:
            raise RuntimeError(f"KV pool: {plan.new_blocks} blocks do not fit "
                               f"(free {self.free_blocks}, idle {self.idle_blocks})")
        old = self._take(chain)
        self.free_blocks += old - plan.chain_hit
        if system_blocks:
            # Its resident blocks are the hit, reused; it grows to this request's prompt.
            resident = self._active.pop(SYSTEM_CHAIN, None)
            if resident is None:
                resident = self._take(SYSTEM_CHAIN)
            else:
                self.active_blocks -= resident
            self._hold(SYSTEM_CHAIN, max(resident, system_blocks))
            self._refs[SYSTEM_CHAIN] = self._refs.get(SYSTEM_CHAIN, 0) + 1
        self._hold(chain, chain_blocks)
        self._refs[chain] = self._refs.get(chain, 0) + 1
        self._offloading = 0
        self._allocate(plan.new_blocks)
        self.loaded_blocks += plan.loaded_blocks
        self.offloaded_blocks += self._offloading
        return replace(plan, offloaded_blocks=self._offloading)

    def release(self, system_blocks: int, chain: str, keep_blocks: int,
                pin: bool = False) -> None:
        """A request finished: keep its first ``keep_blocks`` chain blocks cached.

        The rest of the chain (the partial last block, or generated tokens a client does
        not send back) returns to free memory. The chain goes to the LRU tail (or is
        pinned); a system chain no request holds any more goes in after it, so that this
        program's history is evicted before the prefix every program shares.
        """
        held = self._active.pop(chain)
        self.active_blocks -= held
        self._refs.pop(chain)
        keep = min(keep_blocks, held)
        self.free_blocks += held - keep
        if keep > 0:
            if pin:
                self._pinned[chain] = keep
                self.pinned_blocks += keep
            else:
                self._idle[chain] = keep
                self.idle_blocks += keep
        if system_blocks:
            refs = self._refs[SYSTEM_CHAIN] - 1
            if refs:
                self._refs[SYSTEM_CHAIN] = refs
            else:
                del self._refs[SYSTEM_CHAIN]
                blocks = self._active.pop(SYSTEM_CHAIN)
                self.active_blocks -= blocks
                self._idle[SYSTEM_CHAIN] = blocks
                self.idle_blocks += blocks

    def retire(self, chain: str) -> int:
        """The history ``chain`` holds will never be extended again (a compaction): keep its
        idle blocks cached, in their LRU place, as garbage no request can hit; return them.

        A pinned chain loses its protection and goes to the LRU head (as if unpinned). An
        active chain cannot be retired (its program has a turn running).
        """
        if chain in self._active:
            raise RuntimeError(f"KV pool: chain {chain!r} is held by a running request")
        if self.host is not None:
            self.host.drop(chain)
        self._retired += 1
        garbage = f"\0retired-{self._retired}"  # session ids never contain NUL
        if chain in self._idle:
            # Rebuild to keep the LRU order: O(idle chains), once per compaction.
            self._idle = OrderedDict(
                (garbage if key == chain else key, blocks) for key, blocks in self._idle.items()
            )
            return self._idle[garbage]
        if self.unpin(chain):
            blocks = self._idle.pop(chain)
            self._idle[garbage] = blocks
            self._idle.move_to_end(garbage, last=False)
            return blocks
        return 0

    def pin(self, chain: str) -> bool:
        """Protect an idle chain from eviction; False if it is not idle here."""
        blocks = self._idle.pop(chain, None)
        if blocks is None:
            return False
        self.idle_blocks -= blocks
        self._pinned[chain] = blocks
        self.pinned_blocks += blocks
        return True

    def unpin(self, chain: str) -> bool:
        """Make a pinned chain evictable again; False if it is not pinned.

        It goes to the LRU *head* (evicted first): its last use is older than anything
        released while it was pinned. (Chains released before it and still idle are placed
        behind it, a small deviation from exact LRU that keeps this O(1).)
        """
        blocks = self._pinned.pop(chain, None)
        if blocks is None:
            return False
        self.pinned_blocks -= blocks
        self._idle[chain] = blocks
        self._idle.move_to_end(chain, last=False)
        self.idle_blocks += blocks
        return True

    def check(self) -> None:
        """Raise AssertionError if the block ledger does not add up."""
        assert self.idle_blocks == sum(self._idle.values())
        assert self.pinned_blocks == sum(self._pinned.values())
        assert self.active_blocks == sum(self._active.values())
        assert min(self.free_blocks, self.idle_blocks, self.pinned_blocks,
                   self.active_blocks) >= 0
        total = self.free_blocks + self.active_blocks + self.idle_blocks + self.pinned_blocks
        assert total == self.total_blocks, (total, self.total_blocks)
        if self.host is not None:
            self.host.check()

    # ---- internals -------------------------------------------------------------------
    def _take(self, chain: str) -> int:
        """Remove an idle or pinned chain from the cache; return its resident blocks.

        The caller accounts for them (they are reused or returned to free memory).
        """
        blocks = self._idle.pop(chain, None)
        if blocks is not None:
            self.idle_blocks -= blocks
            return blocks
        blocks = self._pinned.pop(chain, None)
        if blocks is not None:
            self.pinned_blocks -= blocks
            return blocks
        return 0

    def _hold(self, chain: str, blocks: int) -> None:
        self._active[chain] = blocks
        self.active_blocks += blocks

    def _allocate(self, blocks: int) -> None:
        """Take ``blocks`` from free memory, evicting idle chains oldest-first, tail-first."""
        if blocks <= self.free_blocks:
            self.free_blocks -= blocks
            return
        blocks -= self.free_blocks
        self.free_blocks = 0
        idle = self._idle
        while blocks > 0:
            chain, resident = next(iter(idle.items()))
            taken = min(resident, blocks)
            if taken == resident:
                del idle[chain]
            else:
                idle[chain] = resident - taken  # trimmed from its tail; keeps its LRU place
            self.idle_blocks -= taken
            self.evicted_blocks += taken
            if self.host is not None:
                self.host.store(chain, resident - taken, resident)
                self._offloading += taken
            blocks -= taken
