"""Keep the router listed when file discovery expires its registration.

With file discovery (``DYN_DISCOVERY_BACKEND=file``) Dynamo 1.6.1 keeps each registration as
a file in its store (``DYN_FILE_KV``): ``<store>/v1/<bucket>/<percent-encoded key>``, the
key ending in the instance id in hex. The owner touches its files every few seconds from a
thread of its own, and any process deletes files older than the 10 s lease. A process that
is frozen past the lease (a machine-wide stall, SIGSTOP, a debugger) wakes up with its files
gone, its keep-alive touches nothing, and nothing writes them again: for the router that
means the frontend answers 404 for the model until someone restarts it (seen live, and
once in CI). etcd discovery is not affected (a router frozen 16 s is listed again when it
wakes).

:class:`RegistrationKeeper` copies this process's own files (the keys ending in its
instance id) once they appear and writes back any that goes missing while the router
serves; the keep-alive then touches it again, and the frontend lists the router again.
It relies on the store's layout above; where it finds none of this process's files, it
says so once and does nothing. ``serve`` stops it before the runtime shuts down, so a
router that leaves on purpose is not written back.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote

import structlog

log = structlog.get_logger("dynamo_thunderagent.registration")

# How long serve waits for its own files to appear before it says the store is not as
# expected, and how often the keeper looks: more often until it has copied the instance
# registration, which the runtime writes a moment after the model card (a router frozen
# in that moment, seen in CI, would otherwise come back as a model with no instance).
CAPTURE_TIMEOUT_SECONDS = 30.0
INTERVAL_SECONDS = 1.0
FIRST_INTERVAL_SECONDS = 0.05


def file_store(env: Mapping[str, str]) -> Path | None:
    """The file-discovery store this process registers in (``DYN_FILE_KV``, else Dynamo's
    default under the temporary folder); None with another backend (etcd keeps its own
    leases)."""
    if env.get("DYN_DISCOVERY_BACKEND") != "file":
        return None
    return Path(env.get("DYN_FILE_KV") or Path(tempfile.gettempdir()) / "dynamo_store_kv")


def owned(name: str, instance_id: int) -> bool:
    """Whether the store file ``name`` is a registration of instance ``instance_id``: its
    decoded key ends in the id in hex (``ta/router/generate/ae37...``)."""
    return unquote(name).rsplit("/", 1)[-1] == format(instance_id, "x")


class RegistrationKeeper:
    """This process's registration files, copied, and written back when they go."""

    def __init__(self, store: Path, instance_id: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.instance_id = instance_id
        self.clock = clock
        self.copies: dict[Path, bytes] = {}
        self.restored = 0
        self.last_restored: list[str] = []
        self.last_restored_at: float | None = None
        self.error: str | None = None
        self.closed = False  # serve is stopping: nothing is written back any more
        # Held for each check-and-write of a file and by close(): once close() returns,
        # no write is under way and none starts.
        self._writing = threading.Lock()

    def capture(self) -> int:
        """Copy every file of this instance now in the store (again: a copy read while
        Dynamo was still writing the file is mended by the next); the number of files
        copied so far."""
        buckets = self.store / "v1"
        if not buckets.is_dir():
            return len(self.copies)
        found: dict[Path, bytes] = {}
        for bucket in sorted(p for p in buckets.iterdir() if p.is_dir()):
            for path in bucket.iterdir():
                if owned(path.name, self.instance_id):
                    try:
                        found[path] = path.read_bytes()
                    except FileNotFoundError:
                        continue  # expired between the listing and the read
        # A new dict, swapped in whole: state() reads the copies on the event loop while
        # this runs on a thread.
        self.copies = {**self.copies, **found}
        return len(self.copies)

    def close(self) -> None:
        """Write nothing back from now on (serve stops before the runtime deregisters);
        returns once a write under way has finished."""
        with self._writing:
            self.closed = True

    @property
    def has_instance(self) -> bool:
        """Whether the copies hold this process's instance registration (the ``instances``
        bucket), without which a model card written back lists a model nobody serves."""
        return any(path.parent.name == "instances" for path in self.copies)

    def restore_missing(self) -> list[str]:
        """Write back each copied file that is gone (atomically: a temporary file at the
        store's root, outside the buckets the processes watch, renamed into place); the
        keys written."""
        written: list[str] = []
        for path, data in self.copies.items():
            with self._writing:
                if self.closed:
                    break
                if path.exists():
                    continue
                fd, tmp = tempfile.mkstemp(prefix=".thunderagent-", dir=self.store)
                try:
                    with os.fdopen(fd, "wb") as out:
                        out.write(data)
                    os.replace(tmp, path)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise
            written.append(_key(path))
        if written:
            self.restored += len(written)
            self.last_restored = written
            self.last_restored_at = self.clock()
        return written

    def state(self) -> dict[str, object]:
        """For /state (``registration``)."""
        return {
            "store": str(self.store),
            "instance_id": format(self.instance_id, "x"),
            "keys": sorted(_key(p) for p in self.copies),
            "restored": self.restored,
            "last_restored": self.last_restored,
            "last_restored_ago_s": (None if self.last_restored_at is None
                                    else self.clock() - self.last_restored_at),
            "error": self.error,
        }


async def keep(keeper: RegistrationKeeper, interval: float = INTERVAL_SECONDS,
               capture_timeout: float = CAPTURE_TIMEOUT_SECONDS) -> None:
    """Copy the keeper's files as they appear, then write back any that goes, until
    cancelled. File work runs off the event loop; an error is logged (once until it
    changes) and the loop goes on."""
    started = keeper.clock()
    unwatched_said = False
    while True:
        try:
            count = await asyncio.to_thread(keeper.capture)
            if count == 0 and not unwatched_said and keeper.clock() - started >= capture_timeout:
                unwatched_said = True
                log.warning("registration.unwatched", store=str(keeper.store),
                            instance_id=format(keeper.instance_id, "x"),
                            reason="no registration of this process found in the file "
                                   "store; an expired registration will not be written back")
            written = await asyncio.to_thread(keeper.restore_missing)
            if written:
                log.warning("registration.restored", keys=written,
                            hint="discovery had expired this router's registration (was the "
                                 "process or the machine frozen past the 10 s lease?); "
                                 "written back, so the frontend routes to it again")
            keeper.error = None
        except Exception as error:  # the keeper goes on, whatever the store did
            message = f"{type(error).__name__}: {error}"
            if message != keeper.error:
                log.warning("registration.keep_failed", store=str(keeper.store),
                            error=message)
            keeper.error = message
        early = not keeper.has_instance and keeper.clock() - started < capture_timeout
        await asyncio.sleep(min(interval, FIRST_INTERVAL_SECONDS) if early else interval)


def _key(path: Path) -> str:
    """A store file as its bucket and decoded key (``mdc/ta/router/generate/ae37...``)."""
    return f"{path.parent.name}/{unquote(path.name)}"
