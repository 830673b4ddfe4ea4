#!/usr/bin/env bash
# throttlefs.sh	mount a throttling FUSE passthrough (bandwidth caps, added latency per operation) in the foreground.
#
# The server people start under a stack's --kv-dir (deploy/ holds what starts servers: README.md, Layout); the code
# is the Python package deploy/throttle (so `kvtier throttlefs` and `kvtier sweep` use the same thing). All flags are
# `kvtier throttlefs`'s; see `deploy/throttlefs.sh --help` and deploy/throttle/__init__.py for the control endpoint.
#
#   deploy/throttlefs.sh /mnt/kv --backing /var/tmp/kv --read-bw 250MB/s --lat-ms 1 --control-port 9123 &
#   deploy/run-stack.sh up ... --kv-dir /mnt/kv
#   curl -X PUT -d '{"lat_ms": 2}' http://127.0.0.1:9123/settings
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-}
[[ -z $PY && -x $ROOT/.venv/bin/python ]] && PY=$ROOT/.venv/bin/python
PY=${PY:-python3}
# Relative paths stay the caller's: no cd; the package is found through PYTHONPATH.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m deploy.throttle "$@"
