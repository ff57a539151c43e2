"""Background traffic beside the agents (``bench live --background``): sessionless requests of
unique prompts, counted apart from the agents' turns."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from dynamo_thunderagent.bench import live_cli
from dynamo_thunderagent.bench.driver import _background_figures, _Run
from dynamo_thunderagent.bench.prompts import PromptText, TemplateOverhead
from dynamo_thunderagent.bench.workload import Background
from dynamo_thunderagent.cli import build_parser


class _Completions:
    def __init__(self, fail_every: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_every = fail_every

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        await asyncio.sleep(0.01)
        if self.fail_every and len(self.calls) % self.fail_every == 0:
            raise RuntimeError("engine said no")
        return SimpleNamespace(usage=None)


def _run_background(spec: Background, window_s: float, fail_every: int = 0
                    ) -> tuple[_Completions, _Run]:
    completions = _Completions(fail_every)
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))

    async def main() -> _Run:
        run = _Run(client, "m", iter(()), PromptText(), TemplateOverhead(), window_s=window_s,
                   drain_s=0.0, request_timeout_s=5.0, job="job", release_unfinished=True)
        await asyncio.gather(*(run.background(k, spec) for k in range(spec.concurrency)))
        return run

    return completions, asyncio.run(main())


def test_background_requests_carry_no_session_and_never_share_a_prompt() -> None:
    completions, run = _run_background(Background(2, prompt_tokens=20, output_tokens=3), 0.2)
    assert len(completions.calls) >= 4
    assert all("extra_headers" not in c for c in completions.calls)  # no session id at all
    prompts = [c["messages"][0]["content"] for c in completions.calls]
    assert len(set(prompts)) == len(prompts)  # unique: nothing for the cache to reuse
    assert {c["max_tokens"] for c in completions.calls} == {3}
    assert not run.records  # not agent turns
    figures = _background_figures(run, Background(2, 20, 3))
    assert figures["completed"] == len(completions.calls) and figures["errors"] == 0
    assert figures["latency_p50_s"] is not None


def test_failed_background_requests_are_counted_and_the_loop_goes_on() -> None:
    completions, run = _run_background(Background(1, 10, 2), 0.2, fail_every=2)
    figures = _background_figures(run, Background(1, 10, 2))
    assert figures["errors"] == len(completions.calls) // 2 >= 1
    assert figures["completed"] + figures["errors"] == len(completions.calls)


def test_no_background_reports_nothing() -> None:
    _, run = _run_background(Background(1, 10, 2), 0.0)
    assert _background_figures(run, None) == {}


@pytest.mark.parametrize("text", ["", "x", "8:800", "8:800:64:1", "0", "8:0:64", "-1:5:5"])
def test_a_bad_background_option_names_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=r"background"):
        Background.parse(text)


def test_the_background_option_reaches_the_sweep_and_its_report() -> None:
    def args(*argv: str) -> argparse.Namespace:
        return build_parser().parse_args(["bench", "live", *argv])

    config = live_cli.config_from_args(args("--quick", "--background", "8:400:32"))
    assert config.background == Background(8, 400, 32)
    assert config.describe()["background"] == {"concurrency": 8, "prompt_tokens": 400,
                                               "output_tokens": 32}
    four = live_cli.config_from_args(args("--quick", "--background", "4"))
    assert four.background == Background(4)
    assert live_cli.config_from_args(args("--quick")).describe()["background"] is None
