"""serve's numeric flags are checked before anything starts (no runtime needed)."""

from __future__ import annotations

import pytest

from dynamo_thunderagent.cli import main


@pytest.mark.parametrize(("flags", "said"), [
    (["--state-port", "99999"], "--state-port must be a TCP port, 1 to 65535 (0: off), got 99999"),
    (["--events-port", "-1"], "--events-port must be a TCP port, 1 to 65535 (0: off), got -1"),
    (["--state-port", "8090", "--events-port", "8090"],
     "--state-port and --events-port must differ (both 8090): each binds its own socket "
     "on --state-host"),
    (["--refresh-interval", "0"], "--refresh-interval must be 0.01 to 3600 seconds, got 0.0"),
    (["--refresh-interval", "nan"], "argument --refresh-interval: must be a finite number"),
], ids=["state-port", "events-port", "same-port", "zero-interval", "nan-interval"])
def test_serve_refuses_flags_out_of_range_before_it_starts(
        flags: list[str], said: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a port out of range failed with a traceback once the runtime had connected
    # (the events socket bound another port and the log named the wrong one); a zero
    # interval made the worker watch spin a core.
    from dynamo_thunderagent.dynamo import serve

    monkeypatch.setattr(serve, "configure_logging", lambda: None)
    try:
        code = main(["serve", "--router-policy-config", "policies/thunderagent.yaml",
                     "--endpoint", "w.backend.generate", "--model-name", "m",
                     "--model-path", "m", *flags])
    except SystemExit as exit_:  # argparse's own refusal (a number that is not finite)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {said}" or (said in err and err.startswith("usage:"))
