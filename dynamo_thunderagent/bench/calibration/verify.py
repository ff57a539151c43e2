"""``python -m dynamo_thunderagent.bench.calibration verify``: measure a live mocker.

Times long uncached prompts, their cached repeats and decode-only turns on a local stack,
in both regimes, so that docs/calibration.md can compare the mocker with the fitted model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.calibration.mocker import ScaledTiming, StackGeometry
from dynamo_thunderagent.bench.calibration.timing import (
    DEFAULT_TIMING,
    TRACE_MEDIAN_OUTPUT_TOKENS,
)
from dynamo_thunderagent.bench.regimes import REGIMES
from dynamo_thunderagent.stack.launcher import LocalStack


def _text_of_tokens(tag: str, words: int) -> str:
    # Distinct, hash-like words so that two prompts share no prefix beyond what we intend.
    return " ".join(hashlib.sha256(f"{tag}:{i}".encode()).hexdigest()[:6] for i in range(words))


def _chat(url: str, model: str, text: str, max_tokens: int) -> tuple[float, dict[str, Any]]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": False,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"chat request failed: {exc.code} {exc.read()[:500]!r}") from exc
    return time.perf_counter() - t0, payload


def _measure(url: str, model: str, words: int, decode_tokens: int, repeats: int) -> dict[str, Any]:
    """Cold prefill, cached re-send and decode cost on an idle worker (medians of repeats)."""
    cold, warm, decode, prompt_tokens, cached = [], [], [], [], []
    for r in range(repeats):
        text = _text_of_tokens(f"calib-{r}", words)
        t_cold, p_cold = _chat(url, model, text, 1)
        t_warm, p_warm = _chat(url, model, text, 1)
        t_dec, _ = _chat(url, model, text, 1 + decode_tokens)
        cold.append(t_cold)
        warm.append(t_warm)
        decode.append((t_dec - t_warm) / decode_tokens)
        prompt_tokens.append(p_cold["usage"]["prompt_tokens"])
        details = p_warm["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens") or 0)
    return {
        "prompt_tokens": statistics.median(prompt_tokens),
        "cached_tokens_on_resend": statistics.median(cached),
        "uncached_request_s": statistics.median(cold),
        "cached_request_s": statistics.median(warm),
        "decode_s_per_token": statistics.median(decode),
        "full_reprefill_s": statistics.median(cold) - statistics.median(warm),
    }


def _measure_batch_decode(
    url: str, model: str, batch: int, decode_tokens: int, words: int
) -> float:
    """Seconds per decode step with ``batch`` concurrent decoders (prompts cached first)."""
    texts = [_text_of_tokens(f"batch-{batch}-{i}", words) for i in range(batch)]
    for t in texts:
        _chat(url, model, t, 1)
    with ThreadPoolExecutor(batch) as pool:
        base = list(pool.map(lambda t: _chat(url, model, t, 1)[0], texts))
        full = list(pool.map(lambda t: _chat(url, model, t, 1 + decode_tokens)[0], texts))
    return (statistics.median(full) - statistics.median(base)) / decode_tokens


def _ratios(m: dict[str, Any], turn_out: int) -> dict[str, Any]:
    """Re-prefill cost relative to decode: per decode step, and per agent's share of a turn.

    An agent's share of the GPU for the decode of one turn at batch ``b`` is ``turn_out *
    step(b) / b``; a re-prefill is not shared, so ``reprefill / share`` is how many turns'
    worth of GPU a thrashed agent burns.
    """
    steps = m["decode_step_s_batch"]
    return {
        "reprefill_over_decode_step": {
            b: m["full_reprefill_s"] / step for b, step in steps.items()
        },
        "reprefill_over_turn_decode_share": {
            b: m["full_reprefill_s"] / (turn_out * step / int(b)) for b, step in steps.items()
        },
    }


def cmd_verify(ns: argparse.Namespace) -> int:
    """``verify``: both regimes on a one-worker stock stack, printed and optionally saved."""
    results: dict[str, Any] = {
        "token_scale": ns.token_scale,
        "time_scale": ns.time_scale,
        "speedup_ratio": ns.speedup_ratio,
        "num_gpu_blocks": ns.num_gpu_blocks,
        "block_size": ns.block_size,
        "prompt_words": ns.words,
        "decode_tokens": ns.decode_tokens,
        "regimes": {},
    }
    scaled = ScaledTiming(DEFAULT_TIMING, ns.token_scale, ns.time_scale, ns.speedup_ratio)
    # Output tokens of a median trace turn, at the harness's token scale.
    turn_out = ns.turn_output_tokens or max(
        1, math.floor(TRACE_MEDIAN_OUTPUT_TOKENS * ns.token_scale + 0.5)
    )
    results["turn_output_tokens"] = turn_out
    work = Path(ns.work_dir)
    for name in ns.regimes:
        regime = REGIMES[name]
        geometry = StackGeometry(ns.num_gpu_blocks, ns.block_size, ns.speedup_ratio)
        extra = regime.mocker_args(
            work / name, ns.token_scale, ns.time_scale,
            speedup_ratio=ns.speedup_ratio, geometry=geometry,
        )  # fmt: skip
        with LocalStack(
            arm="stock",
            num_workers=1,
            num_gpu_blocks=ns.num_gpu_blocks,
            block_size=ns.block_size,
            speedup_ratio=ns.speedup_ratio,
            mocker_args=extra,
            run_dir=work / f"stack-{name}",
        ) as stack:
            model = stack.config.model_name
            _chat(stack.url, model, "warm up", 2)
            m = _measure(stack.url, model, ns.words, ns.decode_tokens, ns.repeats)
            m["decode_step_s_batch"] = {
                str(b): _measure_batch_decode(stack.url, model, b, ns.decode_tokens, ns.batch_words)
                for b in ns.batches
            }
        m["mocker_args"] = extra
        m.update(_ratios(m, turn_out))
        if regime.calibrated:
            m["predicted"] = {
                "full_reprefill_s": scaled.prefill_wall_s(int(m["prompt_tokens"])),
                "decode_s_per_token": scaled.decode_wall_s(1.0),
                "decode_step_s_batch": {str(b): scaled.decode_wall_s(b) for b in ns.batches},
            }
        results["regimes"][name] = m
        print(json.dumps({name: m}, indent=2), flush=True)
    # The deployment the calibrated tables stand for, at the same (unscaled) sizes.
    ctx_real = round(
        statistics.median([float(r["prompt_tokens"]) for r in results["regimes"].values()] or [0.0])
        / ns.token_scale
    )
    gpu = {
        "context_tokens": ctx_real,
        "full_reprefill_s": DEFAULT_TIMING.full_prefill_s(ctx_real),
        "decode_s_per_token": DEFAULT_TIMING.decode_step_ms(1) / 1000.0,
        "decode_step_s_batch": {
            str(b): DEFAULT_TIMING.decode_step_ms(b) / 1000.0 for b in ns.batches
        },
    }
    gpu.update(_ratios(gpu, TRACE_MEDIAN_OUTPUT_TOKENS))
    results["reference_gpu"] = gpu
    print(json.dumps({"reference_gpu": gpu}, indent=2), flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


