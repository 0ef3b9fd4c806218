#!/usr/bin/env bash
# Run the 2-process distributed contract (tests/distributed/test_distributed_training.py: two
# gloo ranks under torchrun equal one process for clip, info_nce, siglip and gcl, plain and
# tiled, plus resume)
# N times in a row (default 20) and report how many runs were clean. A run is clean when pytest
# passes and its output shows no abort at exit ("terminate called", "Aborted", core dump,
# "Segmentation fault", a signal from torchrun).
#
#   scripts/stress_distributed.sh [N]
set -u
N="${1:-20}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
LOGDIR="$(mktemp -d -t crl-stress-XXXXXX)"
clean=0
failed=0
for i in $(seq 1 "$N"); do
    log="$LOGDIR/run$i.log"
    "$PY" -m pytest -q -p no:cacheprovider -x "$ROOT/tests/distributed/test_distributed_training.py" \
        >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && ! grep -qiE "terminate called|aborted|core dumped|segmentation fault|signal|SIGABRT" "$log"; then
        clean=$((clean + 1))
        echo "run $i/$N: clean ($(tail -n 1 "$log"))"
    else
        failed=$((failed + 1))
        echo "run $i/$N: FAILED (exit $rc, log $log)"
    fi
done
echo "stress_distributed: $clean clean, $failed failed out of $N runs (logs in $LOGDIR)"
[ "$failed" -eq 0 ]
