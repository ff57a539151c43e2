"""Timing regimes for the Dynamo 1.6.1 mocker: GPU-calibrated and cheap-recompute.

Why this exists
---------------
With its built-in timing model the mocker prefills a few thousand tokens in tens of
milliseconds, so an agent whose KV cache was evicted during a tool call pays almost nothing to
rebuild it: thrash lowers the prefix-cache hit rate but not throughput. On a real deployment an
agent context of 20-60k tokens takes seconds to prefill, a large multiple of a decode step, and
thrash halves throughput. The benchmark therefore runs two regimes:

* ``calibrated``: the mocker reads prefill and decode tables (``--planner-profile-data``)
  generated here from a model fitted to the shared SWE-agent trace (GLM-4.5-FP8 on vLLM), so a
  full re-prefill costs what it costs on that deployment, relative to decode;
* ``cheap-recompute``: the mocker's default timing model, unchanged.

Modules, each importing only those above it:

* :mod:`.timing`: the GPU timing model (``GpuTiming``, ``DEFAULT_TIMING``), real units;
* :mod:`.npz`: the NPZ file format, written without numpy;
* :mod:`.mocker`: the model scaled for the mocker, its tables, the profile directory and the
  mocker flags that load it;
* :mod:`.fit`: the fit of the timing model to the trace;
* :mod:`.verify`: measuring both regimes on a live mocker (the regimes themselves are
  :mod:`dynamo_thunderagent.bench.regimes`);
* ``__main__``: the command line, ``python -m dynamo_thunderagent.bench.calibration
  write|fit|verify``.
"""
