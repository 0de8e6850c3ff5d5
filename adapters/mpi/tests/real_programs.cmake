# Real MPI programs not written here -- Debian packages, unmodified -- run
# with libweft_mpi.so preloaded (issue 13, docs/mpi.md "Real programs run
# under the drop-in"):
#   weft_mpi_real_netpipe  netpipe-openmpi: NPopenmpi ping-pong (MPI_Send/Recv
#                          pass through untouched; barrier served by weft)
#   weft_mpi_real_blacs    scalapack-mpi-test: the BLACS tester xCbtest
#                          (derived-type broadcasts and combines on grid
#                          sub-communicators, checked by the tester itself)
#   weft_mpi_real_mpi4py   python3-mpi4py: real/mpi4py_colls.py, every
#                          intercepted collective with numpy buffers
#   weft_mpi_real_scalapack  scalapack-mpi-test: 12 of ScaLAPACK's own
#                          testers (LU, Cholesky, QR, least squares,
#                          inverse, Hessenberg, tridiagonal; four
#                          precisions) at np 4, plain, with the default
#                          thresholds and with WEFT_MPI_MIN_BYTES=0;
#                          also labelled scalapack
# (CI's ASan pass leaves the label pmpi_real out: .ci/run says why.)
# Each script runs its program as installed and then preloaded
# (WEFT_MPI_MIN_BYTES=0, WEFT_MPI_STATS=1), at np 2 and 4 (NetPIPE: 2),
# checks the program's verdict in both runs and that weft served the calls,
# and exits 77 -- a skip, not a failure -- when its package is missing
# (scripts/deps installs them).
#
# Included from adapters/mpi/CMakeLists.txt with WEFT_MPI_LIB_PATH set to
# $<TARGET_FILE:weft_mpi>.

if(NOT DEFINED WEFT_MPI_LIB_PATH)
  set(WEFT_MPI_LIB_PATH $<TARGET_FILE:weft_mpi>)
endif()
if(MPIEXEC_EXECUTABLE)
  set(_weft_real_mpirun ${MPIEXEC_EXECUTABLE})
else()
  set(_weft_real_mpirun mpirun)
endif()

# Seconds per script: each takes 10-20 s alone on the 2-core development
# machine (4 mpiruns); the margin is for a machine busy with other tests.
# Every mpirun inside is also bounded (90 s), and a weft wait by
# WEFT_TIMEOUT=30, so a hang fails with its own message first.
set(_weft_real_timeout 240)

foreach(_prog netpipe blacs mpi4py scalapack)
  add_test(NAME weft_mpi_real_${_prog}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/real/run_${_prog}.sh ${WEFT_MPI_LIB_PATH} ${_weft_real_mpirun})
  set_tests_properties(weft_mpi_real_${_prog} PROPERTIES
    LABELS "pmpi;pmpi_real"
    SKIP_RETURN_CODE 77
    TIMEOUT ${_weft_real_timeout}
    # Up to 4 ranks at a time (np 4, oversubscribed on 2 cores).
    PROCESSORS 4)
endforeach()
unset(_prog)
set_tests_properties(weft_mpi_real_scalapack PROPERTIES LABELS "pmpi;pmpi_real;scalapack")
unset(_weft_real_mpirun)
unset(_weft_real_timeout)
