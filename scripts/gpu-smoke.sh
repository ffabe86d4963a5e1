#!/usr/bin/env bash
# The GPU smoke run: SpecDeck's vllm runtime end to end on this host, with nothing downloaded
# (docs/gpu.md, "The smoke run"). It needs a GPU, vLLM and SpecDeck (the worker-gpu image has
# both), and goes through the REST API as a user would:
#   1. `specdeck run` (API and worker on the embedded default, in a directory of its own) makes
#      the demo verifier and its dataset locally;
#   2. the doctor checks the host for the vllm runtime;
#   3. a job: hidden states through vLLM's extract_hidden_states, the speculators trainer under
#      torchrun (on a GPU of its own, or sharing the verifier's when the host has one GPU),
#      then the evaluation: `vllm serve --speculative-config` DFlash against n-gram and no
#      speculation;
#   4. a deployment of the best checkpoint, and a chat through the gateway (/v1);
#   5. the figures: served acceptance length, speedup, chat latency.
#
#   scripts/gpu-smoke.sh
#
# Environment: SPECDECK (the command; default specdeck), PORT (8765), JOB_TIMEOUT (seconds,
# 3600), WORK_DIR (default: a new temporary directory, removed after a run that passed unless
# KEEP=1; a failed run keeps it for its logs).
set -euo pipefail

SPECDECK=${SPECDECK:-specdeck}
PORT=${PORT:-8765}
JOB_TIMEOUT=${JOB_TIMEOUT:-3600}
KEEP=${KEEP:-0}
WORK_DIR=${WORK_DIR:-$(mktemp -d -t specdeck-smoke.XXXXXX)}
URL="http://127.0.0.1:${PORT}"
# Nothing is downloaded: the verifier is made here, and vLLM reads it from disk.
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# The evaluation's figures the summary prints (keys of a job's "evaluation").
FIGURES=(mean_acceptance_length ngram_mean_acceptance_length speedup ngram_speedup
  outputs_identical_to_baseline trainer_eal_estimate)

KEY=""
RUN_PID=""
DEPLOYMENT=""

log() { printf '[gpu-smoke] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# A value from the JSON document on stdin: json_get 'd["status"]' (None prints as "").
json_get() {
  python3 -c 'import json, sys; d = json.load(sys.stdin); v = eval(sys.argv[1]); print("" if v is None else v)' "$1"
}

# api METHOD PATH [curl arguments...]: one REST call with the key; fails on an HTTP error.
api() {
  local method=$1 path=$2
  shift 2
  curl -sS --fail-with-body -X "$method" "${URL}${path}" -H "Authorization: Bearer ${KEY}" \
    -H 'Content-Type: application/json' "$@"
}

# wait_status PATH SECONDS STATUS...: poll a job or deployment until it has one of STATUS.
wait_status() {
  local path=$1 seconds=$2 status="" wanted
  local deadline=$((SECONDS + seconds))
  shift 2
  while ((SECONDS < deadline)); do
    status=$(api GET "$path" | json_get 'd["status"]')
    for wanted in "$@"; do
      if [[ $status == "$wanted" ]]; then
        echo "$status"
        return 0
      fi
    done
    sleep 5
  done
  die "$path is still '$status' after $seconds s"
}

cleanup() {
  local code=$?
  if [[ -n $DEPLOYMENT ]]; then  # in subshells: a failure here must not end the cleanup
    (api DELETE "/api/deployments/${DEPLOYMENT}" >/dev/null) || true
    (wait_status "/api/deployments/${DEPLOYMENT}" 120 stopped failed >/dev/null) || true
  fi
  if [[ -n $RUN_PID ]] && kill -0 "$RUN_PID" 2>/dev/null; then
    kill -INT -- "-${RUN_PID}" 2>/dev/null || true  # Ctrl-C to `specdeck run`'s process group
    wait "$RUN_PID" 2>/dev/null || true
  fi
  if ((code == 0)) && [[ $KEEP != 1 ]]; then
    rm -rf "$WORK_DIR"
  else
    log "logs and the database are in $WORK_DIR (var/logs/, specdeck-run.log)"
  fi
}
trap cleanup EXIT

command -v nvidia-smi >/dev/null || die "no nvidia-smi: this runs on a host with an NVIDIA GPU"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
((GPUS > 0)) || die "nvidia-smi lists no GPU"

# 1. The API and a worker, as `make run` starts them (in a process group of their own).
cd "$WORK_DIR"
log "starting specdeck run on port $PORT in $WORK_DIR (the demo verifier is trained on the CPU once, about a minute)"
setsid "$SPECDECK" run --port "$PORT" >specdeck-run.log 2>&1 &
RUN_PID=$!
deadline=$((SECONDS + 600))
until grep -q "Ctrl-C stops" specdeck-run.log; do
  kill -0 "$RUN_PID" 2>/dev/null || die "specdeck run exited: $(tail -n 20 specdeck-run.log)"
  ((SECONDS < deadline)) || die "specdeck run printed no banner in 600 s"
  sleep 2
done
KEY=$(sed -n "s/.*API key (project 'default'): \([^ ]*\).*/\1/p" specdeck-run.log | head -n 1)
DATASET=$(sed -n 's/.*demo dataset: \(ds_[A-Za-z0-9_]*\).*/\1/p' specdeck-run.log | head -n 1)
[[ -n $KEY && -n $DATASET ]] || die "no key or demo dataset in specdeck-run.log"

# 2. The host, as the vllm runtime needs it (exit 1: a row says what is missing).
"$SPECDECK" doctor --runtime vllm || die "the doctor found this host lacking (table above)"

# 3. The job. One GPU: the trainer shares the verifier's, with a memory split.
if ((GPUS >= 2)); then SHARE=false; else SHARE=true; fi
JOB_BODY=$(
  cat <<JSON
{"verifier": "demo", "dataset": "${DATASET}", "runtime": "vllm",
 "speculator": {"block_size": 8, "num_layers": 2, "max_anchors": 32, "total_seq_len": 512,
                "epochs": 2, "lr": 0.003},
 "resources": {"verifier": {"tensor_parallel_size": 1, "data_parallel_size": 1},
               "trainer_gpus": 1, "share_verifier_gpus": ${SHARE}},
 "evaluate": {"prompts": 8, "max_tokens": 64}, "gate": false}
JSON
)
JOB=$(api POST /api/jobs --data "$JOB_BODY" | json_get 'd["id"]')
log "job $JOB: the commands it runs"
api GET "/api/jobs/${JOB}/plan" | json_get '"\n".join(" ".join(s["argv"]) for s in d["stages"])' >&2
STATUS=$(wait_status "/api/jobs/${JOB}" "$JOB_TIMEOUT" succeeded failed cancelled)
if [[ $STATUS != succeeded ]]; then
  api GET "/api/jobs/${JOB}/logs?tail=60" >&2 || true
  die "job $JOB $STATUS: $(api GET "/api/jobs/${JOB}" | json_get 'd["status_reason"]')"
fi
EVALUATION=$(api GET "/api/jobs/${JOB}" | json_get 'json.dumps(d["evaluation"])')

# 4. A deployment of the best checkpoint, and a chat through the gateway.
BEST=$(api GET "/api/jobs/${JOB}/checkpoints" | json_get '[c["id"] for c in d["data"] if c["is_best"]][0]')
DEPLOYMENT_BODY=$(
  cat <<JSON
{"name": "gpu-smoke", "checkpoint_id": "${BEST}", "runtime": "vllm"}
JSON
)
DEPLOYMENT=$(api POST /api/deployments --data "$DEPLOYMENT_BODY" | json_get 'd["id"]')
STATUS=$(wait_status "/api/deployments/${DEPLOYMENT}" 900 ready failed stopped)
[[ $STATUS == ready ]] || die "deployment $DEPLOYMENT $STATUS"
CHAT_BODY=$(
  cat <<JSON
{"model": "gpu-smoke", "messages": [{"role": "user", "content": "What is a good way to learn a new language?"}],
 "max_tokens": 64, "temperature": 0}
JSON
)
CHAT=$(api POST /v1/chat/completions --data "$CHAT_BODY" -w '\n%{time_total}')
LATENCY=$(tail -n 1 <<<"$CHAT")
TOKENS=$(sed '$d' <<<"$CHAT" | json_get 'd["usage"]["completion_tokens"]')

# 5. The figures.
echo "GPU smoke run: ${GPUS} GPU(s), ${GPU_NAME}; trainer sharing the verifier's GPU: ${SHARE}"
echo "job ${JOB}, best checkpoint ${BEST}; evaluation (served, greedy, 8 held-out prompts):"
for figure in "${FIGURES[@]}"; do
  printf '  %-32s %s\n' "$figure" "$(json_get "d.get('${figure}')" <<<"$EVALUATION")"
done
printf '  %-32s %s s for %s tokens\n' "chat through the gateway" "$LATENCY" "$TOKENS"
