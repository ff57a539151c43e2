"""What a local stack starts: :class:`StackConfig`, validated against the arm registry."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from dynamo_thunderagent.stack.arms import ARM_NAMES, ARMS, BASELINE_ARM
from dynamo_thunderagent.stack.discovery import DEFAULT_DISCOVERY, DISCOVERY_BACKENDS
from dynamo_thunderagent.stack.tiny_model import MODEL_NAME


@dataclass
class StackConfig:
    """What to start. Defaults give the stock arm with two small mocker workers."""

    arm: str = BASELINE_ARM  # a name in stack.arms.ARMS
    num_workers: int = 2
    num_gpu_blocks: int = 256
    block_size: int = 16
    speedup_ratio: float = 10.0
    mocker_args: list[str] = field(default_factory=list)
    # Worker i's own extra mocker flags, after mocker_args (a flag given again wins): a fleet
    # of unequal workers. Workers past the list get none.
    worker_args: list[list[str]] = field(default_factory=list)
    frontend_args: list[str] = field(default_factory=list)
    # builtin and ours: the router-policy YAML. None: for builtin, BUILTIN_POLICY_YAML written
    # into the run dir; for ours, the project's policies/thunderagent-extended.yaml.
    policy: Path | None = None
    # dynamo-python: extra flags for dynamo.thunderagent_router (e.g. --pause-threshold 0.9).
    router_args: list[str] = field(default_factory=list)
    # ours: the router command line instead of ours (placeholders: see stack.arms.OursArm).
    router_cmd: list[str] | None = None
    http_port: int | None = None
    model_name: str = MODEL_NAME
    model_path: Path | None = None
    run_dir: Path | None = None
    keep_run_dir: bool = True  # False: delete the run dir (logs included) on stop()
    startup_timeout_s: float = 60.0
    stop_grace_s: float = 10.0
    python: str = sys.executable
    # "file": registrations in the run dir, events over ZMQ. "etcd": the stack starts its own
    # etcd and NATS servers on loopback, as the README's deployment runs (stack.discovery).
    discovery: str = DEFAULT_DISCOVERY
    # File discovery: route the event plane through a loopback broker (needs pyzmq). Without
    # it, Dynamo's ZMQ publishers bind 0.0.0.0. (Etcd discovery carries events over NATS.)
    event_broker: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {', '.join(ARM_NAMES)}, got {self.arm!r}")
        if self.discovery not in DISCOVERY_BACKENDS:
            raise ValueError(f"discovery must be one of {', '.join(DISCOVERY_BACKENDS)}, "
                             f"got {self.discovery!r}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if len(self.worker_args) > self.num_workers:
            raise ValueError(f"worker_args lists {len(self.worker_args)} workers, more than "
                             f"num_workers ({self.num_workers})")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        if self.speedup_ratio <= 0:
            raise ValueError(f"speedup_ratio must be > 0, got {self.speedup_ratio}")
        if not ARMS[self.arm].takes_policy and self.policy is not None:
            takers = " and ".join(repr(name) for name, arm in ARMS.items() if arm.takes_policy)
            raise ValueError(f"policy (a router-policy YAML) only applies to arms {takers}")
