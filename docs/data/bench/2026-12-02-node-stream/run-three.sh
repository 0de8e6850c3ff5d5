#!/bin/bash
. /work/main/scripts/env.sh
for r in 1 2 3 4 5 6 7 8 9 10; do
 for np in 3 4 8; do
  for mode in plain nt adapt; do
   case $mode in plain) lib=adapt; export WEFT_NODE_COLL_STREAM_KB=0;; nt) lib=after; export WEFT_NODE_COLL_STREAM_KB=32;; adapt) lib=adapt; export WEFT_NODE_COLL_STREAM_KB=32;; esac
   echo "## round $r np $np lib $mode $(date +%T)"
   LD_LIBRARY_PATH=/tmp/lib$lib mpirun -x LD_LIBRARY_PATH -x WEFT_NODE_COLL_STREAM_KB -np $np --oversubscribe --bind-to none /tmp/nlab 12 allreduce,reduce,reduce_scatter,allgather,gather,alltoall 32768 524288 2>&1 | grep -v "^#"
  done
 done
done
