"""A Dynamo 1.6.1 worker whose engine fails on request, for the real-process fault suite.

The mocker cannot be told to refuse a request, fail one with an error of its own or cut a
stream short; a real engine does all three. This is a real Dynamo worker (the runtime's
``dynamo.common.backend`` worker: discovery, model card, request and response planes) whose
engine answers ordinary requests at once and fails the ones whose ``max_tokens`` asks it to:

* ``REFUSE`` (91): raises ``InvalidArgument`` before any token (an engine refusing a request
  it cannot serve, e.g. a grammar it does not support);
* ``FAIL`` (92): raises ``Unknown`` before any token (an error of one request, not of the
  engine: the worker stays healthy);
* ``CUT`` (93): streams three tokens, then ends the stream without a finish reason (an
  engine that lost the request midway);
* ``SILENT`` (94): sends nothing and never ends (a stuck engine);
* ``TOOL_CALL`` (95): answers with a tool call in the Hermes format (:data:`TOOL_CALL_TEXT`,
  spelled in the model's own tokens), which the frontend turns into the response's
  ``tool_calls`` where the worker's card names a tool-call parser (``--tool-call-parser``);
* ``ECHO`` (96): answers with the prompt's own tokens (at most 256), so that the client
  reads the prompt as the frontend rendered it (``--custom-jinja-template``).

Run as ``python tests/e2e/fault_engine.py --model-path DIR --served-model-name NAME
--endpoint ns.component.endpoint --blocks N --block-size B [--tool-call-parser NAME]
[--reasoning-parser NAME] [--context-length N] [--custom-jinja-template PATH]``, in a
stack's environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncGenerator
from typing import Any

from dynamo.common.backend.engine import EngineConfig, LLMEngine, LlmRegistration
from dynamo.common.backend.run import run
from dynamo.common.backend.worker import WorkerConfig
from dynamo.llm.exceptions import InvalidArgument, Unknown

REFUSE, FAIL, CUT, SILENT, TOOL_CALL, ECHO = 91, 92, 93, 94, 95, 96
TOOL_CALL_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  "</tool_call>")
REFUSAL_TEXT = "fault engine: this request is refused on purpose"
FAILURE_TEXT = "fault engine: this request failed on purpose"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class FaultEngine(LLMEngine):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[FaultEngine, WorkerConfig]:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("--model-path", required=True)
        parser.add_argument("--served-model-name", required=True)
        parser.add_argument("--endpoint", required=True, help="ns.component.endpoint")
        parser.add_argument("--blocks", type=int, required=True)
        parser.add_argument("--block-size", type=int, required=True)
        parser.add_argument("--tool-call-parser", default=None)
        parser.add_argument("--reasoning-parser", default=None)
        parser.add_argument("--context-length", type=int, default=None)
        parser.add_argument("--custom-jinja-template", default=None)
        args = parser.parse_args(argv)
        namespace, component, endpoint = args.endpoint.split(".")
        config = WorkerConfig(
            namespace=namespace, component=component, endpoint=endpoint,
            model_name=args.model_path, served_model_name=args.served_model_name,
            endpoint_types="chat,completions",
            tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
            custom_jinja_template=args.custom_jinja_template,
            discovery_backend=os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
        )  # fmt: skip
        return cls(args), config

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        return EngineConfig(
            model=self.args.model_path,
            served_model_name=self.args.served_model_name,
            llm=LlmRegistration(
                context_length=(self.args.context_length
                                or self.args.blocks * self.args.block_size),
                kv_cache_block_size=self.args.block_size,
                total_kv_blocks=self.args.blocks,
                max_num_seqs=64,
            ),
        )

    async def generate(self, request: Any, context: Any) -> AsyncGenerator[Any, None]:
        prompt = len(request.get("token_ids") or [])
        wanted = int((request.get("stop_conditions") or {}).get("max_tokens") or 16)
        if wanted == REFUSE:
            raise InvalidArgument(REFUSAL_TEXT)
        if wanted == FAIL:
            raise Unknown(FAILURE_TEXT)
        if wanted == SILENT:
            await asyncio.Event().wait()  # never set: only a cancel ends it
        if wanted in (TOOL_CALL, ECHO):
            tokens = (self.tool_call_tokens() if wanted == TOOL_CALL
                      else list(request.get("token_ids") or [])[:256])
            for k, token in enumerate(tokens):
                chunk = {"token_ids": [token], "index": 0}
                if k == len(tokens) - 1:
                    chunk.update(finish_reason="stop",
                                 completion_usage=_usage(prompt, len(tokens)))
                yield chunk
            return
        if wanted == CUT:
            for token in (11, 12, 13):
                await asyncio.sleep(0.01)
                yield {"token_ids": [token], "index": 0}
            return  # no finish reason: the stream just stops
        for k in range(wanted):
            await asyncio.sleep(0.001)
            chunk: dict[str, Any] = {"token_ids": [100 + k % 50], "index": 0}
            if k == wanted - 1:
                chunk.update(finish_reason="length", completion_usage=_usage(prompt, wanted))
            yield chunk

    def tool_call_tokens(self) -> list[int]:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(os.path.join(self.args.model_path, "tokenizer.json"))
        return list(tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False).ids)

    async def cleanup(self) -> None:
        return None


if __name__ == "__main__":
    run(FaultEngine)
