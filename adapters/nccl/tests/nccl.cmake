# Tests of weft's NCCL library (issue 16), included from
# adapters/nccl/CMakeLists.txt under WEFT_BUILD_TESTS (after mpi_tests/).
# Label: nccl (every entry), plus mpi/np<N>/<config> for the mpirun ones, and
# emu for the programs (they run on the emulated CUDA runtime).
#
#   nccl_symbols   every function nccl.h declares, and its pnccl alias, is a
#                  defined dynamic symbol of libweft_nccl.so; SONAME libnccl.so.2
#   nccl_colls_np<N>_<config>   nccl_test_colls.c: the whole API, call by call
#                  (N = 2, 4; config = shm, tcp, vnodes2 as in mpi_tests/).
#                  The unique ids go rank 0 -> others by MPI_Bcast, and in the
#                  tcp entries through a file (written whole, then renamed).
#   nccl_env_<case>_np2   NCCL_DEBUG=INFO's "Init COMPLETE" line per rank,
#                  NCCL_SHM_DISABLE=1 -> tcp between the ranks, an NCCL_*
#                  variable with no weft equivalent -> one "ignored" line.
#   nccl_fault_{abort,peerdeath,destroy_race}_np2_{shm,tcp}   nccl_test_fault.c:
#                  ncclCommAbort from a second thread releases a stream held
#                  by a recv; a peer that _exits makes rank 0's allreduce fail
#                  with ncclRemoteError naming rank 1; ncclCommAbort while
#                  ncclCommDestroy runs is refused (ncclInvalidUsage), the
#                  destroy ends normally. WEFT_TIMEOUT=10; label
#                  sleepy too. Judged by rank 0's NCCL-FAULT-OK line.
#
# Seconds, plain -Werror build, ctest -j1 on the 2-core machine (whole
# programs, weft at 2b4e967): colls np2 shm 3.0, tcp 5.9, vnodes2 5.0, np4
# shm 0.9, tcp 14.0, vnodes2 10.1; env 0.4 + 0.4 + 0.4; faults 1.4 + 1.4 +
# 0.5 + 0.5; symbols 0.1: 44 s for the label (not measured under ASan). Most
# of the tcp entries' time is comm set-up (1-2 s steps in the scalable,
# group-init, InitAll and split sections), not data.
# A hang (a stream still busy WEFT_TIMEOUT + 10 s after the call) is reported
# by the program itself ("stream wait ... a hang", then MPI_Abort): with
# WEFT_TIMEOUT=30 such an entry fails after ~40 s instead of at TIMEOUT.
# NCCL_TEST_SKIP=<part,...> leaves parts out when chasing one failure
# (nccl_test_colls.c, main); NCCL_TEST_TRACE=1 prints each call first.
#
# The C programs are written against NCCL's nccl.h and linked with -lnccl
# found in WEFT_NCCL_LIB_DIR (lib/libnccl.so -> libweft_nccl.so), so their
# NEEDED entry is libnccl.so.2, as for a program built against real NCCL;
# BUILD_RPATH points the loader at that directory. They link the emulated
# CUDA runtime, and WEFT_CUDA_LIB points weft and the NCCL library at the
# same file: one emulated GPU state (tests/emu/cuda/README.md). Two emulated
# devices per process; rank r uses device r % 2. So in a
# WEFT_TEST_CUDA_RUNTIME=real build only nccl_symbols is registered (review
# T1: no test on a GPU runs against the emulator); on a GPU, nccl-tests over
# libnccl.so.2 is what scripts/validate-gpu runs instead.

if(NOT TARGET weft_nccl OR (NOT TARGET weft_emu_cuda AND NOT WEFT_TEST_CUDA_RUNTIME STREQUAL "real"))
  message(STATUS "weft: NCCL library tests: no (needs weft_nccl and the emulated CUDA runtime)")
  return()
endif()

# ---- the symbols ----
find_program(WEFT_NCCL_PYTHON NAMES python3 HINTS /usr/bin)
if(EXISTS /usr/bin/python3)
  set(WEFT_NCCL_PYTHON /usr/bin/python3)
endif()
if(CMAKE_READELF)
  set(WEFT_NCCL_READELF ${CMAKE_READELF})
else()
  find_program(WEFT_NCCL_READELF readelf)
endif()
add_test(NAME nccl_symbols
  COMMAND ${WEFT_NCCL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/check_symbols.py
          ${WEFT_NCCL_INCLUDE_DIR}/nccl.h $<TARGET_FILE:weft_nccl> ${CMAKE_NM} ${WEFT_NCCL_READELF})
set_tests_properties(nccl_symbols PROPERTIES TIMEOUT 30 LABELS nccl)

if(WEFT_TEST_CUDA_RUNTIME STREQUAL "real")
  message(STATUS "weft: NCCL library tests: nccl_symbols only (WEFT_TEST_CUDA_RUNTIME=real; the programs "
                 "run on the emulated CUDA runtime)")
  weft_check_cuda_runtime_tests()
  return()
endif()

# ---- the programs ----
function(weft_nccl_test_program target source)
  add_executable(${target} ${CMAKE_CURRENT_SOURCE_DIR}/tests/${source})
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests ${WEFT_NCCL_INCLUDE_DIR})
  target_compile_options(${target} PRIVATE ${WEFT_C_WARNINGS})
  # -lnccl as an application would link it: the symlink made when weft_nccl is built.
  target_link_directories(${target} PRIVATE ${WEFT_NCCL_LIB_DIR})
  target_link_libraries(${target} PRIVATE nccl weft_emu_cuda MPI::MPI_C Threads::Threads m)
  add_dependencies(${target} weft_nccl)
  set_target_properties(${target} PROPERTIES BUILD_RPATH "${WEFT_NCCL_LIB_DIR}")
endfunction()
weft_nccl_test_program(weft_nccl_test_colls nccl_test_colls.c)
weft_nccl_test_program(weft_nccl_test_fault nccl_test_fault.c)

# The environment of every mpirun entry (as mpi_tests/CMakeLists.txt's
# WEFT_MPI_TEST_COMMON_ENV, which is not visible from this directory).
set(WEFT_NCCL_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_btl_tcp_if_include=lo
  OMPI_MCA_oob_tcp_if_include=lo
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_pml=ob1
  WEFT_TIMEOUT=60
  WEFT_CUDA_LIB=$<TARGET_FILE:weft_emu_cuda>
  WEFT_EMU_CUDA_DEVICES=2)

# The transport configs of mpi_tests/ (weft_mpi_config_env where defined).
function(weft_nccl_config_env config out_var)
  if(COMMAND weft_mpi_config_env)
    weft_mpi_config_env(${config} env)
  elseif(config STREQUAL "shm")
    set(env WEFT_TRANSPORTS=shm)
  elseif(config STREQUAL "tcp")
    set(env WEFT_TRANSPORTS=tcp)
  elseif(config STREQUAL "vnodes2")
    set(env WEFT_VIRTUAL_NODES=2)
  else()
    message(FATAL_ERROR "nccl.cmake: unknown config '${config}'")
  endif()
  set(${out_var} "${env}" PARENT_SCOPE)
endfunction()

set(WEFT_NCCL_ID_DIR ${CMAKE_CURRENT_BINARY_DIR}/nccl_test_ids)
file(MAKE_DIRECTORY ${WEFT_NCCL_ID_DIR})
foreach(np 2 4)
  foreach(config shm tcp vnodes2)
    weft_nccl_config_env(${config} config_env)
    set(test_name nccl_colls_np${np}_${config})
    # The tcp entries pass their unique ids through files instead of MPI_Bcast.
    set(id_args "")
    if(config STREQUAL "tcp")
      set(id_args --id-file ${WEFT_NCCL_ID_DIR}/${test_name})
    endif()
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${WEFT_MPIEXEC_FLAGS}
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_nccl_test_colls> ${id_args} ${MPIEXEC_POSTFLAGS})
    # WEFT_TIMEOUT 30: the programs give a stream WEFT_TIMEOUT + 10 s, then
    # report a hang and end the job (rather than ctest's TIMEOUT).
    set(env ${WEFT_NCCL_TEST_ENV} ${config_env} WEFT_TIMEOUT=30)
    # The 64 MiB calls at np 2 only: the time of the np 4 entries is in their many small calls.
    if(NOT np EQUAL 2)
      list(APPEND env NCCL_TEST_BIG=0)
    endif()
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${env}"
      TIMEOUT 90
      PROCESSORS ${np}
      FAIL_REGULAR_EXPRESSION "FAIL rank|FATAL rank"
      LABELS "nccl;mpi;np${np};${config};emu")
  endforeach()
endforeach()

# NCCL_* environment and NCCL_DEBUG lines (np 2, init and destroy only).
set(WEFT_NCCL_ONLY_INIT
  NCCL_TEST_SKIP=basics,args,reductions,moves,bcast,p2p,refused,split,ops,memory,nonblocking,scalable,groupinit,initall,big,churn)
function(weft_nccl_env_test name regex)
  set(test_name nccl_env_${name}_np2)
  add_test(NAME ${test_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${WEFT_MPIEXEC_FLAGS}
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_nccl_test_colls> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "${WEFT_NCCL_TEST_ENV};${WEFT_NCCL_ONLY_INIT};${ARGN}"
    PASS_REGULAR_EXPRESSION "${regex}"
    FAIL_REGULAR_EXPRESSION "FAIL rank|FATAL rank"
    TIMEOUT 60
    PROCESSORS 2
    LABELS "nccl;mpi;np2;emu")
endfunction()
# What rank 1's output must show, and the environment.
weft_nccl_env_test(debug_info "NCCL INFO [^\n]*rank 1 nranks 2 [^\n]*weft [0-9.]+[^\n]*NCCL 2[.]28[.]9 API[^\n]*Init COMPLETE"
                   NCCL_DEBUG=INFO WEFT_TRANSPORTS=shm)
weft_nccl_env_test(shm_disable "weft.rank 1. INFO: peer 0: transport tcp"
                   NCCL_DEBUG=INFO NCCL_SHM_DISABLE=1)
weft_nccl_env_test(ignored "NCCL INFO NCCL_P2P_DISABLE=1 ignored .no weft equivalent."
                   NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1 WEFT_TRANSPORTS=shm)
# An NCCL communicator keeps its lock whatever WEFT_THREADS says (env.c): the
# note, and never weft's "take no lock" line (WEFT_DEBUG=info via NCCL_DEBUG).
weft_nccl_env_test(threads_kept "NCCL INFO WEFT_THREADS=serialized ignored: an NCCL communicator may be called"
                   NCCL_DEBUG=INFO WEFT_THREADS=serialized WEFT_TRANSPORTS=shm)
set_tests_properties(nccl_env_threads_kept_np2 PROPERTIES
                     FAIL_REGULAR_EXPRESSION "FAIL rank|FATAL rank|take no lock")

# Fault entries: recovery on so rank 0 outlives rank 1; mpirun's exit code
# says nothing then, so they are judged by rank 0's line.
foreach(mode abort peerdeath destroy_race)
  foreach(config shm tcp)
    weft_nccl_config_env(${config} config_env)
    set(test_name nccl_fault_${mode}_np2_${config})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${WEFT_MPIEXEC_FLAGS}
              --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_nccl_test_fault> ${mode} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${WEFT_NCCL_TEST_ENV};${config_env};WEFT_TIMEOUT=10"
      PASS_REGULAR_EXPRESSION "NCCL-FAULT-OK rank 0 ${mode}: [0-9]+ checks, 0 failed"
      FAIL_REGULAR_EXPRESSION "NCCL-FAULT-FAIL|FAIL rank|FATAL rank"
      TIMEOUT 60
      PROCESSORS 2
      LABELS "nccl;mpi;faults;sleepy;np2;${config};emu")
  endforeach()
endforeach()

# Review T1: every entry here that sets WEFT_CUDA_LIB carries the label emu
# (top CMakeLists.txt).
weft_check_cuda_runtime_tests()
