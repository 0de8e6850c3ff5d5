#!/usr/bin/env bash
# ctest pmpi_wrong_mpi: the drop-in preloaded into a program of the other
# MPI family (an Open MPI build into an MPICH program, or the reverse) must
# end the job with its reason, not crash in MPI or compute
# with mangled handles (adapters/mpi/comm_cache.c, refuse_foreign_mpi).
#   pmpi_wrong_mpi.sh DROPIN OTHER_MPICC OTHER_LAUNCHER OTHER_FAMILY
# OTHER_FAMILY: openmpi (launcher is Open MPI's mpirun) or mpich (Hydra's
# mpiexec). The program is built here with OTHER_MPICC; it prints a line
# after its MPI_Allreduce, which must never appear.
set -euo pipefail
dropin=${1:?usage: pmpi_wrong_mpi.sh DROPIN OTHER_MPICC OTHER_LAUNCHER OTHER_FAMILY}
mpicc=${2:?}
launcher=${3:?}
family=${4:?}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft_wrong_mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/prog.c" <<'C'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    int rank, one = 1, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d: past MPI_Allreduce, sum %d\n", rank, sum);
    MPI_Finalize();
    return 0;
}
C
"$mpicc" "$tmp/prog.c" -o "$tmp/prog"

case $family in
    openmpi) run=("$launcher" -np 2 --oversubscribe -x LD_PRELOAD="$dropin" "$tmp/prog") ;;
    mpich)   run=("$launcher" -n 2 -genv LD_PRELOAD "$dropin" "$tmp/prog") ;;
    *) echo "pmpi_wrong_mpi.sh: OTHER_FAMILY must be openmpi or mpich, not '$family'" >&2; exit 2 ;;
esac
echo "pmpi_wrong_mpi.sh: ${run[*]}"
set +e
out=$(timeout 60 "${run[@]}" 2>&1)
rc=$?
set -e
printf '%s\n' "$out"
fail() { echo "pmpi_wrong_mpi.sh: FAILED: $*" >&2; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$rc" -ne 124 ] || fail "the job hung (60 s)"
if printf '%s\n' "$out" | grep -q "past MPI_Allreduce"; then
    fail "a rank got past MPI_Allreduce through the wrong library"
fi
# Each rank says it when it reaches its first intercepted call; the first to
# exit makes the launcher end the others, which may not have got there yet
# (seen 4 times in 40 under Hydra): at least one rank says why, naming
# itself as the launcher numbers it.
printf '%s\n' "$out" | grep -Eq "weft_mpi\[rank [01]\] ERROR: this libweft_mpi.so was built against (Open MPI|MPICH), but the program runs \"(Open MPI|MPICH)" ||
    fail "no rank said why"
echo "pmpi_wrong_mpi.sh: refused with the reason (exit $rc)"
