#!/bin/bash
# The campaign of docs/benchmarks.md "Issue 29's targets: one campaign, before and after the segment's streaming (2026-12-03)".
# before = eaa99c5 built in a worktree at /tmp/wt/build, after = 13cf4af in build-test (RelWithDebInfo -O2).
# interleaved: before (eaa99c5, /tmp/wt/build) and after (HEAD, build-test), one round each, alternating order
cd /work/main && . scripts/env.sh
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for m in $order; do
    b=/work/main/build-test; [ $m = before ] && b=/tmp/wt/build
    rm -rf /tmp/camp/tmp_$m
    scripts/bench-targets run $b /tmp/camp/tmp_$m --rounds 1 > /tmp/camp/log_${m}_$i.txt 2>&1
    mkdir -p /tmp/camp/$m && mv /tmp/camp/tmp_$m/round1 /tmp/camp/$m/round$i
    echo "$m round $i done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/camp/progress
  done
done
echo ALLDONE >> /tmp/camp/progress
