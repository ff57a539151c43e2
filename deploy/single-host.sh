#!/usr/bin/env bash
# One host, etcd and NATS already running: vLLM workers -> thunderagent router -> frontend.
# Usage: MODEL=Qwen/Qwen3-8B deploy/single-host.sh
set -euo pipefail
MODEL=${MODEL:?set MODEL to the model to serve}
POLICY=${POLICY:-$(dirname "$0")/../policies/thunderagent.yaml}
export DYN_DISCOVERY_BACKEND=${DYN_DISCOVERY_BACKEND:-etcd}
export ETCD_ENDPOINTS=${ETCD_ENDPOINTS:-http://127.0.0.1:2379}
export NATS_SERVER=${NATS_SERVER:-nats://127.0.0.1:4222}
# Without it Dynamo 1.6.1 uses ZMQ for events and its workers listen on every address.
export DYN_EVENT_PLANE=${DYN_EVENT_PLANE:-nats}

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait || true; }
trap cleanup EXIT INT TERM

CUDA_VISIBLE_DEVICES=0 python -m dynamo.vllm --model "$MODEL" \
    --endpoint dyn://workers.backend.generate & pids+=($!)
CUDA_VISIBLE_DEVICES=1 python -m dynamo.vllm --model "$MODEL" \
    --endpoint dyn://workers.backend.generate & pids+=($!)

DYN_NAMESPACE=thunderagent dynamo-thunderagent serve \
    --router-policy-config "$POLICY" \
    --endpoint workers.backend.generate \
    --model-name "$MODEL" --model-path "$MODEL" \
    --state-port 8090 & pids+=($!)

python -m dynamo.frontend --namespace thunderagent --router-mode round-robin \
    --http-host 127.0.0.1 --http-port 8000 & pids+=($!)

wait -n
