#!/bin/bash
# The campaign of docs/benchmarks.md "Against issue 29's targets: one
# campaign, before and after the segment's streaming" (2026-12-03):
#   run-campaign.sh BEFORE_BUILD AFTER_BUILD OUT
# (there: eaa99c5 built in a worktree, and 13cf4af's build-test; both
# RelWithDebInfo -O2). Three rounds of each library, one round at a time,
# alternating which goes first; OUT/{before,after}/roundI/ as committed here.
set -e
[ $# -eq 3 ] || { echo "usage: $0 BEFORE_BUILD AFTER_BUILD OUT" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../../../.." && pwd)
before=$1 after=$2 out=$3
mkdir -p "$out" && cd "$repo" && . scripts/env.sh
for i in 1 2 3; do
    if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for side in $order; do
        build=$after; [ "$side" = before ] && build=$before
        rm -rf "$out/tmp_$side"
        scripts/bench-targets run "$build" "$out/tmp_$side" --rounds 1 > "$out/log_${side}_$i.txt" 2>&1
        mkdir -p "$out/$side" && mv "$out/tmp_$side/round1" "$out/$side/round$i"
        echo "$side round $i done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> "$out/progress.txt"
    done
done
