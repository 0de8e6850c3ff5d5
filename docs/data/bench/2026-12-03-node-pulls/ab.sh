#!/bin/sh
# Same-settings A/B, alternating jobs: weft's default (node-local: segment or pulls)
# against the same calls forced onto the pairwise messages (-a pairwise), each job
# also timing Open MPI's call in the same job (weft-perf's MPI column).
cd /work/main
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1
out=$1
for round in 1 2; do
  for np in 3 4 8; do
    for mode in default pairwise; do
      for sub in alltoall alltoallv; do
        a=""; [ $mode = pairwise ] && a="-a pairwise"
        echo "== round $round np $np $sub $mode" >> $out
        mpirun -np $np --oversubscribe --bind-to none build-test/bench/weft-perf $sub -b 256K -e 16M -f 4 -r 7 $a 2>&1 | grep -v "^#" >> $out
      done
    done
  done
done
echo done >> $out
