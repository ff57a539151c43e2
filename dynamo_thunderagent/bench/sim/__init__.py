"""A deterministic discrete-event simulator of agent programs on Dynamo-like workers.

It answers "what would these thresholds do to this workload" in seconds: the same agent
programs (``bench.workload``) and the same policy objects (ours through the plugin catalog)
as the live harness, against a model of W workers with paged KV, prefix caching, LRU
eviction and continuous batching, on a fake clock (no sleeping, no threads).

Modules: :mod:`.kv` (one worker's KV pool), :mod:`.timing` (what a pass costs),
:mod:`.engine` (batching, workers),
:mod:`.arms` (the policies compared), :mod:`.simulation` (one closed-loop run and its
figures), :mod:`.run` (scenarios, sweeps and their output), :mod:`.command` (the
``bench sim`` command line).
"""
