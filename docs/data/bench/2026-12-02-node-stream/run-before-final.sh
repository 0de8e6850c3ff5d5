#!/bin/bash
. /work/main/scripts/env.sh
for r in 1 2 3 4 5 6 7 8 9 10; do
 for np in 3 4 8; do
  for lib in before final; do
   echo "## round $r np $np lib $lib $(date +%T)"
   LD_LIBRARY_PATH=/tmp/lib$lib mpirun -x LD_LIBRARY_PATH -np $np --oversubscribe --bind-to none /tmp/nlab 12 allreduce,reduce,reduce_scatter,allgather,scatter,gather,alltoall 16384 524288 2>&1 | grep -v "^#"
  done
 done
done
