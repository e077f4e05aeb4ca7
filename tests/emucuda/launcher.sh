#!/bin/sh
# A torchrun-like launcher: starts N ranks of PROGRAM at once with RANK / LOCAL_RANK /
# WORLD_SIZE set, waits for all of them, fails if any failed.  usage: launcher.sh N PROGRAM
n=$1; prog=$2; pids=""
i=0
while [ "$i" -lt "$n" ]; do
    RANK=$i LOCAL_RANK=$i WORLD_SIZE=$n "$prog" > /dev/null &
    pids="$pids $!"
    i=$((i + 1))
done
status=0
for p in $pids; do wait "$p" || status=1; done
exit $status
