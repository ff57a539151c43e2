"""The environment every process of the stack starts with.

Everything binds 127.0.0.1: the HTTP servers via flags, the request plane and system servers
via ``DYN_*_HOST`` variables, and the event plane through a loopback ZMQ broker (see
``zmq_broker``), because direct-mode ZMQ publishers bind the wildcard address. Discovery goes
through files under the run dir, so stacks started side by side never see each other; with
etcd discovery (see ``discovery``) the stack's own etcd and NATS servers, on loopback ports of
their own, take the place of the files and the ZMQ event plane.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dynamo_thunderagent.stack.topology import LOOPBACK

# Never inherited from the caller's shell: an arm that wants one sets it itself.
_SCOPED_KEYS = ("DYN_NAMESPACE", "DYN_NAMESPACE_WORKER_SUFFIX", "DYN_ROUTER_ENDPOINT")


def stack_env(
    run_dir: Path,
    kv_dir: Path,
    extra_env: Mapping[str, str],
    inherited: Mapping[str, str],
    discovery_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment shared by every process: file discovery, TCP + ZMQ, loopback only.

    ``discovery_env`` (etcd discovery's settings) replaces file discovery and the ZMQ event
    plane. ``inherited`` is the caller's environment (``os.environ``); ``extra_env`` is
    applied last.
    """
    env = dict(inherited)
    for key in _SCOPED_KEYS:
        env.pop(key, None)
    env.update(
        {
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(kv_dir),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "zmq",
            "DYN_TCP_RPC_HOST": LOOPBACK,
            "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK,
            "DYN_EVENT_PLANE_HOST": LOOPBACK,
            "DYN_SYSTEM_HOST": LOOPBACK,
            "HOME": str(run_dir / "home"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    # Dynamo's own log lines without colour codes: the logs go to files that people grep
    # (the caller's setting wins).
    env.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")
    if discovery_env is not None:
        del env["DYN_FILE_KV"]
        env.update(discovery_env)
    # Children run in the run dir; make this package importable there even when it is not
    # installed (e.g. `python -m dynamo_thunderagent.stack.zmq_broker` from a checkout).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra_env)
    return env
