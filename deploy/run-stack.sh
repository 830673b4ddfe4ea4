#!/usr/bin/env bash
# run-stack.sh	start/stop vLLM + LMCache + the kvtier backend, for people and the end-to-end tests alike.
#
# usage (every option, what runs and what is recorded: the docstring of deploy/run_stack.py, which does the work):
#   deploy/run-stack.sh up --device cpu|cuda --model DIR --vllm-port P --lmcache-port P2 --lmcache-http-port P3 \
#                          --kv-dir DIR [--shared-dir DIR] [--instances N] [--mode mp|inprocess] [options]
#   deploy/run-stack.sh up ... --nodes N [--shared glusterfs|redis-cluster] [--shared-bw RATE]   (as root)
#   deploy/run-stack.sh up ... --prometheus [--prometheus-port P5] [--prometheus-interval S]
#   deploy/run-stack.sh down [--state-dir DIR] [--grace S]
#   deploy/run-stack.sh restart-lmcache [--state-dir DIR] [--instance I] [--signal TERM|KILL]
#   deploy/run-stack.sh status [--state-dir DIR]
#
# example:
#   $ deploy/make_tiny_model.py /tmp/tiny && deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 \
#       --lmcache-port 5555 --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache
#   vllm     http://127.0.0.1:8000/v1
#   lmcache  http://127.0.0.1:8090  (MP server 127.0.0.1:5555)
#   kvtier   http://127.0.0.1:8100/metrics
#   state    /tmp/kvtier-stack-0  (pids, logs, endpoints.json; stop with: deploy/run-stack.sh down)
#
# This script only finds an interpreter for deploy/run_stack.py (standard library only): $PYTHON, the checkout's
# .venv/bin/python, or python3; the servers run on --python (the same default).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
[[ -z $PY && -x $ROOT/.venv/bin/python ]] && PY=$ROOT/.venv/bin/python
PY=${PY:-python3}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
exec "$PY" -m deploy.run_stack "$@"
