"""aiperf's own agentic-coding workload, scaled to a benchmark regime (``bench clients``).

aiperf 0.13 ships a generator of coding-agent sessions (``aiperf synthesize agentic-code``):
multi-turn sessions whose prompts grow by a tool result and the reply each turn, over a
system prompt every session shares and a project context some share, with short agentic
gaps and long human ones between turns, and resets. It writes a Mooncake-format trace
(per-turn token counts, prefix block hashes, delays) that ``aiperf profile`` replays with a
session id on every turn. It is the agent workload a Dynamo user is most likely to run
first, and this project was never tuned on it.

The distributions are those of the dataset aiperf ships (``1k_sessions_200k_ctx``; its
``manifest.json`` gives means, medians and maxima in real tokens and milliseconds), scaled
by the regime's token and time scales (:func:`scaled_config`) so that one mocker token
stands for as many real ones as in ``bench live``. Three departures:

* prompts stop at three quarters of one worker's KV pool (:data:`MAX_PROMPT_SHARE`; 200k real
  tokens would be 20k mocker tokens, more than a calibrated worker holds, and every engine
  refuses a prompt it cannot hold: stock and ours alike answered those turns with an error);
* restarts are off (``restart_initial_probability`` 0): a restarted session reuses its
  parent's last, partial prefix block at a full block's size, which aiperf's replay
  rejects ("hash_id ... requested at 64 tokens but was already materialized at 45");
* the tokenizer is given by a repo id from a hub cache made for the run
  (:func:`tokenizer_cache`): the replay decodes prompts in worker processes that force
  hub offline mode, where a tokenizer given as a folder path fails to load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_thunderagent.dynamo.translate import SESSION_HEADER

# The shipped dataset's distributions at real scale (tokens; delays in ms). Log-normal
# fits from the mean and median, as aiperf derives them when only those are given.
REAL_NEW_TOKENS_PER_TURN = {"mean": 6000.0, "median": 4000.0, "max": 50000.0}
REAL_GENERATION_TOKENS = {"mean": 1000.0, "median": 800.0, "max": 10000.0}
REAL_AGENTIC_DELAY_MS = {"mean": 5000.0, "median": 2000.0}
REAL_HUMAN_DELAY_MS = {"mean": 30000.0, "median": 15000.0}
AGENTIC_FRACTION = 0.7  # the share of gaps that are tool calls, not a person typing
RESET = {"base_probability": 0.05, "context_scaling": 1.5}
REAL_MAX_PROMPT_TOKENS = 200_000
REAL_SHARED_TOKENS = 32_000  # the system prompt every session starts with
REAL_GROUP_TOKENS = 10_000  # a project context shared within a group of sessions
GROUPS = {"num_groups": 100, "zipf_alpha": 0.6}
REAL_SESSION_TOKENS = {"mean": 15000.0, "median": 5000.0, "max": 50000.0}  # unshared start

# A session's prompt never passes this share of one worker's KV pool (a session that reaches
# it retires, as one reaching the real 200k limit does). The SWE trace's largest context is
# 73% of a calibrated worker's pool.
MAX_PROMPT_SHARE = 0.75

TOKENIZER_REPO = "local/stack-model"
_SNAPSHOT = "0" * 40


def _scaled(values: dict[str, float], factor: float) -> dict[str, float]:
    return {key: value * factor for key, value in values.items()}


def _tokens(real: float, factor: float) -> int:
    return round(real * factor)  # round, not ceil: 200000 * 0.07 is 14000.000000000002


def retire_at_tokens(token_scale: float, worker_kv_tokens: int) -> int:
    """Where a session retires: aiperf's 200k-token limit at ``token_scale``, or
    :data:`MAX_PROMPT_SHARE` of a worker of ``worker_kv_tokens``, whichever is less."""
    return min(_tokens(REAL_MAX_PROMPT_TOKENS, token_scale),
               int(worker_kv_tokens * MAX_PROMPT_SHARE))


def scaled_config(token_scale: float, time_scale: float, block_size: int,
                  worker_kv_tokens: int) -> dict[str, Any]:
    """aiperf's agentic-code generator config at ``token_scale`` tokens and ``time_scale``
    time: the shipped dataset's shape, in the regime's mocker tokens and clock, its prompts
    capped to fit a worker of ``worker_kv_tokens`` (:data:`MAX_PROMPT_SHARE`).

    Raises ValueError for a scale, block size or pool that is not positive.
    """
    if token_scale <= 0 or time_scale <= 0 or block_size < 1 or worker_kv_tokens < 1:
        raise ValueError("token_scale and time_scale must be > 0, block_size and "
                         "worker_kv_tokens >= 1")
    return {
        "new_tokens_per_turn": {**_scaled(REAL_NEW_TOKENS_PER_TURN, token_scale), "bias": 1.0},
        "generation_length": _scaled(REAL_GENERATION_TOKENS, token_scale),
        "inter_turn_delay": {
            "agentic_fraction": AGENTIC_FRACTION,
            "agentic_delay": _scaled(REAL_AGENTIC_DELAY_MS, time_scale),
            "human_delay": _scaled(REAL_HUMAN_DELAY_MS, time_scale),
            "max": None,
        },
        "reset": dict(RESET),
        "max_prompt_tokens": retire_at_tokens(token_scale, worker_kv_tokens),
        "block_size": block_size,
        "cache": {
            "layer1_tokens": _tokens(REAL_SHARED_TOKENS, token_scale),
            "layer1_5_tokens": _tokens(REAL_GROUP_TOKENS, token_scale),
            "layer2": _scaled(REAL_SESSION_TOKENS, token_scale),
            "layer1_5_groups": dict(GROUPS),
        },
        "restart_initial_probability": 0.0,  # see the module docstring
    }


def synthesize(aiperf: str, config: dict[str, Any], out: Path, *, sessions: int, seed: int,
               env: dict[str, str]) -> Path:
    """Run ``aiperf synthesize agentic-code`` for ``config``; the trace it wrote (the one new
    trace under ``out``: a trace left there by an earlier run is never taken for it), checked
    by :func:`check_blocks`.

    Raises RuntimeError with aiperf's last output when it fails or writes no new trace, and
    ValueError when the trace is one aiperf's replay would reject.
    """
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "agentic-code-config.json"
    config_path.write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    command = [aiperf, "synthesize", "agentic-code", "--config", str(config_path),
               "--num-sessions", str(sessions), "--seed", str(seed), "--output", str(out)]
    before = set(out.glob("*/dataset.jsonl"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    traces = sorted(set(out.glob("*/dataset.jsonl")) - before)
    if done.returncode != 0 or len(traces) != 1:
        tail = (done.stdout + done.stderr)[-800:]
        raise RuntimeError(f"aiperf synthesize agentic-code failed (rc={done.returncode}, "
                           f"{len(traces)} new traces): {tail}")
    check_blocks(traces[0], int(config["block_size"]))
    return traces[0]


def check_blocks(trace: Path, block_size: int) -> None:
    """Every prefix hash of ``trace`` names one block size, as aiperf's replay requires.

    A turn's prompt is its hashes' blocks, all full but the last; a hash that ends one turn
    part-full and sits whole inside another (a shared context whose length is not a
    multiple of ``block_size``, cut by a session's start) is refused by the replay at
    startup. This says which, before any stack is started.

    Raises ValueError naming the first such hash.
    """
    sizes: dict[int, int] = {}
    with trace.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            turn = json.loads(line)
            hashes, length = turn.get("hash_ids") or [], int(turn["input_length"])
            for index, block in enumerate(hashes):
                size = (length - block_size * (len(hashes) - 1) if index == len(hashes) - 1
                        else block_size)
                if sizes.setdefault(block, size) != size:
                    raise ValueError(
                        f"{trace}: line {number}: prefix hash {block} is {size} tokens here "
                        f"and {sizes[block]} tokens earlier; aiperf's replay needs one size "
                        f"per hash (another --seed, or shared contexts in whole blocks of "
                        f"{block_size})")


def tokenizer_cache(model_path: Path, cache_dir: Path) -> str:
    """A hub cache under ``cache_dir`` holding the files of ``model_path`` as one snapshot
    of :data:`TOKENIZER_REPO`; the repo id to give aiperf (with ``HF_HUB_CACHE`` set to
    ``cache_dir`` and hub offline mode on: see the module docstring)."""
    repo = cache_dir / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / _SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    for source in model_path.iterdir():
        if source.is_file():
            shutil.copy2(source, snapshot / source.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT, encoding="utf-8")
    return TOKENIZER_REPO


@dataclass(frozen=True)
class AgenticCodeWorkload:
    """Replay of an agentic-code trace: ``concurrency`` sessions at a time (aiperf keeps a
    session's slot through its gaps), for ``duration_s`` seconds, each turn's delay honoured
    after its previous turn completes, the session id on every turn."""

    name: str = "agentic-code"
    sessions: int = 400
    duration_s: int = 120
    grace_s: int = 30
    concurrency: tuple[int, ...] = (4, 8, 16)
    regime: str = "calibrated"
    block_size: int = 64  # prompt tokens per prefix hash (4 KV blocks of 16)
    trace: Path | None = None  # set once synthesized
    hub_cache: Path | None = None  # set once the tokenizer's cache is made (tokenizer_cache)

    def flags(self) -> list[str]:
        if self.trace is None:
            raise ValueError("agentic-code: synthesize the trace first (trace is None)")
        return [
            "--endpoint-type", "chat", "--streaming",
            "--input-file", str(self.trace), "--custom-dataset-type", "mooncake_trace",
            "--isl-block-size", str(self.block_size),
            # The trace's first turns carry timestamp 0, which would replay every session at
            # once; sessions are paced by --concurrency instead, as agent benchmarks run.
            "--no-fixed-schedule",
            "--benchmark-duration", str(self.duration_s),
            # aiperf's default, said here: turns still in flight this long after the window
            # are dropped (not counted as errors), and requests/s is then over window + grace.
            "--benchmark-grace-period", str(self.grace_s),
            "--extra-inputs", "ignore_eos:true",
            "--session-header", SESSION_HEADER,
        ]

    @property
    def tokenizer(self) -> str | None:
        """The repo id aiperf loads the tokenizer by (None until the cache is made)."""
        return None if self.hub_cache is None else TOKENIZER_REPO

    def env_overrides(self) -> dict[str, str]:
        """What aiperf's environment needs beyond the usual: the tokenizer's hub cache, in
        offline mode (see the module docstring); nothing until the cache is made."""
        if self.hub_cache is None:
            return {}
        return {"HF_HUB_CACHE": str(self.hub_cache), "HF_HUB_OFFLINE": "1"}
