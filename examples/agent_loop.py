"""A minimal agent loop that tells the ThunderAgent scheduler about itself. Copy it.

Every turn carries ``X-Dynamo-Session-ID`` (one id for the whole run), so the router keeps the
run as one program; the tool runs between turns (the program is ACTING then); the last request
carries ``X-Dynamo-Session-Final: true`` and releases the program's capacity at once.

The tool is a real shell command, from a small allowlist, run without a shell, bounded in time
and output. If the model's reply names one (a line ``RUN: ls -la``) it runs that; otherwise the
next step of a fixed plan (a model that emits random tokens, like Dynamo's mocker, still works).

    python examples/agent_loop.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-32B
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import uuid

from openai import OpenAI

# Dynamo's agent headers (spelled out, so this file needs nothing but the OpenAI SDK).
SESSION_HEADER = "X-Dynamo-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"

ALLOWED = {"ls", "wc", "head", "date", "uname", "pwd"}  # local, read-only, no network
PLAN = [["ls", "-la"], ["pwd"], ["uname", "-a"], ["date", "-u"]]
SYSTEM = ("You are a coding agent. To run a command, answer with one line `RUN: <command>`; "
          f"allowed programs: {', '.join(sorted(ALLOWED))}.")


def choose_command(reply: str, turn: int) -> list[str]:
    """The command the reply asks for, if it names an allowed one; else the plan's next."""
    for line in reply.splitlines():
        if line.strip().startswith("RUN:"):
            try:
                argv = shlex.split(line.strip()[4:])
            except ValueError:
                break
            if argv and argv[0] in ALLOWED:
                return argv
    return PLAN[turn % len(PLAN)]


def run_tool(argv: list[str], cwd: str) -> str:
    """Run the command (no shell, 10 s, output cut to 2000 characters)."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=False)
        output = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    except (OSError, subprocess.TimeoutExpired) as error:
        output = f"failed: {error}"
    return output[:2000]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", type=int, default=3, help="model turns before finishing")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--workdir", default=".", help="where the tool's commands run")
    parser.add_argument("--session", default=None, help="session id (default: a new UUID)")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    session = args.session or f"agent-{uuid.uuid4()}"
    headers = {SESSION_HEADER: session}  # on every turn
    history = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "Look around this folder and report what it holds."}]
    try:
        for turn in range(args.turns):
            reply = client.chat.completions.create(
                model=args.model, messages=history,  # type: ignore[arg-type]
                max_tokens=args.max_tokens, extra_headers=headers)
            text = reply.choices[0].message.content or ""
            history.append({"role": "assistant", "content": text})
            argv = choose_command(text, turn)  # the tool runs: the program is ACTING
            output = run_tool(argv, args.workdir)
            history.append({"role": "user", "content": f"$ {shlex.join(argv)}\n{output}"})
            print(f"turn {turn}: {len(text)} chars; ran {shlex.join(argv)!r}")
    finally:
        # Done (or failed): release the program's capacity now, not after the retention time.
        client.chat.completions.create(
            model=args.model, max_tokens=1, messages=[{"role": "user", "content": "done"}],
            extra_headers={**headers, FINAL_HEADER: "true"})
    print(f"session {session} finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
