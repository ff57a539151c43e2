"""A loopback-only ZMQ event-plane broker for the local stack.

Why it exists: in Dynamo 1.6.1 every event publisher in *direct* mode (KV events, forward-pass
metrics, active sequences, session affinity) binds its PUB socket on the wildcard address and
only *advertises* ``DYN_EVENT_PLANE_HOST``. With ``DYN_ZMQ_BROKER_URL`` set, publishers and
subscribers instead *connect* to a broker, so the broker's two sockets, bound here on
127.0.0.1, are the only event-plane listeners of the whole stack.

The broker is a plain XSUB/XPUB forwarder: publishers connect to the XSUB side, subscribers to
the XPUB side, and subscriptions flow upstream so publishers only send what someone reads.

``python -m dynamo_thunderagent.stack.zmq_broker XSUB_PORT XPUB_PORT``
"""

from __future__ import annotations

import argparse
import sys

import zmq

LOOPBACK = "127.0.0.1"


def broker_url(xsub_port: int, xpub_port: int) -> str:
    """The ``DYN_ZMQ_BROKER_URL`` value that points Dynamo processes at this broker."""
    return f"xsub=tcp://{LOOPBACK}:{xsub_port},xpub=tcp://{LOOPBACK}:{xpub_port}"


def run_broker(xsub_port: int, xpub_port: int) -> None:
    """Forward messages between the two loopback sockets until the context is terminated."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    xsub = ctx.socket(zmq.XSUB)
    xpub = ctx.socket(zmq.XPUB)
    # Dynamo publishers use a large send high-water mark; match it so bursts of KV events
    # under load are buffered here rather than dropped.
    for sock in (xsub, xpub):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
    xsub.bind(f"tcp://{LOOPBACK}:{xsub_port}")
    xpub.bind(f"tcp://{LOOPBACK}:{xpub_port}")

    # No signal handlers: the broker holds no state, so SIGTERM's default action (exit) is the
    # right shutdown, and SIGINT surfaces as KeyboardInterrupt out of the proxy loop.
    print(f"zmq broker ready {broker_url(xsub_port, xpub_port)}", flush=True)
    try:
        zmq.proxy(xsub, xpub)
    except (KeyboardInterrupt, zmq.ContextTerminated):
        pass
    finally:
        xsub.close(0)
        xpub.close(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Loopback XSUB/XPUB broker for Dynamo's event plane"
    )
    parser.add_argument("xsub_port", type=int)
    parser.add_argument("xpub_port", type=int)
    args = parser.parse_args(argv)
    run_broker(args.xsub_port, args.xpub_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
