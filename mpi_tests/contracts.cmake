# The contracts of issue 10 (include/weft.h): request handles, collective
# mismatch, waitall over two comms, destroy with requests outstanding,
# overlapping self transfers, per-request timeout, the eager window, abort;
# and fault injection (a rank killed or stopped before a collective).
# Included from mpi_tests/CMakeLists.txt, which defines
# weft_add_mpi_test_binary / weft_add_mpi_suite / weft_mpi_config_env.

weft_add_mpi_test_binary(weft_mpi_contracts test_contracts.cc)

# A. Handles: second wait/test, stale copy after slot reuse, one handle twice in a waitall.
weft_add_mpi_suite(NAME contracts_requests BINARY weft_mpi_contracts NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "Requests.*" LABELS contracts)
# B. Different collectives on different ranks: an error within WEFT_TIMEOUT + 1 s.
# Label sleepy (here and below): the entry spends most of its time waiting
# out a timeout, so scripts/test runs these entries side by side.
weft_add_mpi_suite(NAME contracts_mismatch BINARY weft_mpi_contracts NPS 2 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER "Mismatch.*" LABELS "contracts;sleepy" ENV WEFT_TIMEOUT=5)
# C. One waitall over two comms; WEFT_TIMEOUT=10 so a waitall that drives only
# one comm fails in 10 s rather than 60 (the test wants it under 5 s).
weft_add_mpi_suite(NAME contracts_two_comms BINARY weft_mpi_contracts NPS 4 8 CONFIGS tcp vnodes2 shm_nocma
                   GTEST_FILTER "TwoComms.*" LABELS contracts ENV WEFT_TIMEOUT=10)
# D. Destroy with a receive outstanding.
weft_add_mpi_suite(NAME contracts_destroy BINARY weft_mpi_contracts NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "DestroyOutstanding.*" LABELS contracts)
# E. Send to self overlapping the receive (the self path whatever the config).
weft_add_mpi_suite(NAME contracts_self_overlap BINARY weft_mpi_contracts NPS 1 2 CONFIGS shm
                   GTEST_FILTER "SelfOverlap.*" LABELS contracts TIMEOUT 60)
# F. A silent peer's receive times out after WEFT_TIMEOUT while another peer keeps sending.
weft_add_mpi_suite(NAME contracts_request_timeout BINARY weft_mpi_contracts NPS 3 CONFIGS shm tcp
                   GTEST_FILTER "RequestTimeout.*" LABELS "contracts;sleepy" ENV WEFT_TIMEOUT=3)
# G. 80 MiB of sends ahead of the receiver: its memory grows by the window, not the backlog.
weft_add_mpi_suite(NAME contracts_flow_control BINARY weft_mpi_contracts NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "FlowControl.*" LABELS contracts ENV WEFT_EAGER_WINDOW=1m)
# H. weft_comm_abort from a second thread (WEFT_TIMEOUT stays 60: the peer must learn at once).
weft_add_mpi_suite(NAME contracts_abort BINARY weft_mpi_contracts NPS 2 CONFIGS shm tcp vnodes2
                   GTEST_FILTER "Abort.*" LABELS contracts)

# The same contracts with the comm's progress thread on (WEFT_PROGRESS_THREAD=1,
# p2p/engine.c): it polls the pipes and runs the health ticks beside the
# application's waits. CI runs this subset; the whole contracts, faults,
# stream and msgpipe suites in that mode: docs/testing.md, "Progress modes".
weft_add_mpi_suite(NAME contracts_thread BINARY weft_mpi_contracts NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "Requests.*:DestroyOutstanding.*:Abort.*" LABELS "contracts;progress_thread"
                   ENV WEFT_PROGRESS_THREAD=1)
weft_add_mpi_suite(NAME contracts_two_comms_thread BINARY weft_mpi_contracts NPS 4 CONFIGS tcp
                   GTEST_FILTER "TwoComms.*" LABELS "contracts;progress_thread" ENV WEFT_TIMEOUT=10
                   WEFT_PROGRESS_THREAD=1)

# ---- I. fault injection (docs/testing-faults.md) ----
# One mpirun per (case, mode, config): rank 2 of 4 raises SIGKILL or SIGSTOP
# on itself just before the collective; the survivors (0, 1, 3) each print
# "FAULT-OK rank N ..." or "FAULT-FAIL rank N ...". mpirun runs with recovery
# on (the survivors outlive the victim) and its exit code is 0 even with a
# rank killed, so ctest judges by the lines: all three survivors' OK lines,
# in any order, and no FAIL line. Label: faults.
add_executable(weft_mpi_faults ${WEFT_MPI_TESTS_DIR}/test_faults.cc)
target_include_directories(weft_mpi_faults PRIVATE ${WEFT_MPI_TESTS_DIR})
# GTest only for weft_mpi_test.h (the data patterns); the binary has its own main.
target_link_libraries(weft_mpi_faults PRIVATE weft MPI::MPI_CXX GTest::gtest Threads::Threads)
target_compile_options(weft_mpi_faults PRIVATE ${WEFT_C_WARNINGS})

set(WEFT_FAULT_CASES ring rd bruck direct hier bcast barrier)
set(WEFT_FAULT_MODES kill stop)
set(WEFT_FAULT_CONFIGS shm shm_nocma tcp vnodes2)
# Every order of the three survivors' OK lines (a regex cannot count them).
set(WEFT_FAULT_PASS "")
foreach(a 0 1 3)
  foreach(b 0 1 3)
    foreach(c 0 1 3)
      if(NOT a EQUAL b AND NOT a EQUAL c AND NOT b EQUAL c)
        list(APPEND WEFT_FAULT_PASS "FAULT-OK rank ${a} .*FAULT-OK rank ${b} .*FAULT-OK rank ${c} ")
      endif()
    endforeach()
  endforeach()
endforeach()
# weft_add_fault_test(<case> <mode> <config> <name prefix> <extra env> <extra labels>)
function(weft_add_fault_test fcase mode config prefix extra_env extra_labels)
  weft_mpi_config_env(${config} config_env)
  set(test_name ${prefix}_${fcase}_${mode}_${config})
  # A stopped victim: the survivors wait out WEFT_TIMEOUT (label sleepy).
  if(mode STREQUAL "stop")
    string(APPEND extra_labels ";sleepy")
  endif()
  add_test(NAME ${test_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${WEFT_MPIEXEC_FLAGS}
            --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_mpi_faults> ${fcase} ${mode} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=3${extra_env}"
    PASS_REGULAR_EXPRESSION "${WEFT_FAULT_PASS}"
    FAIL_REGULAR_EXPRESSION "FAULT-FAIL"
    TIMEOUT 60
    PROCESSORS 4
    LABELS "mpi;faults;np4;${config}${extra_labels}")
endfunction()
foreach(config IN LISTS WEFT_FAULT_CONFIGS)
  # "first": the first message to the victim, after it died or stopped
  # (lazy connection); shm_nocma adds nothing there.
  set(cases ${WEFT_FAULT_CASES})
  if(NOT config STREQUAL "shm_nocma")
    list(APPEND cases first)
  endif()
  foreach(fcase IN LISTS cases)
    foreach(mode IN LISTS WEFT_FAULT_MODES)
      weft_add_fault_test(${fcase} ${mode} ${config} faults "" "")
    endforeach()
  endforeach()
endforeach()
# The small calls of the node-local paths: on one node (shm, node_coll.c)
# and across two virtual nodes (node_hier.c, the victim the head of the
# second node; reduce_scatter, scatter_small and alltoall_small there only:
# on one node they wait as allreduce and bcast_small do).
foreach(config shm vnodes2)
  set(cases allreduce bcast_small)
  if(config STREQUAL "shm")
    # Blocks read by CMA out of the sender's buffer (node_coll.c's pulls).
    list(APPEND cases alltoall_pulled scatter_pulled)
  endif()
  if(config STREQUAL "vnodes2")
    list(APPEND cases reduce_scatter scatter_small alltoall_small)
  endif()
  foreach(fcase IN LISTS cases)
    foreach(mode IN LISTS WEFT_FAULT_MODES)
      weft_add_fault_test(${fcase} ${mode} ${config} faults "" "")
    endforeach()
  endforeach()
endforeach()
# A few of them with the comm's progress thread on (label progress_thread):
# a dead or stopped rank is still named by every survivor.
weft_add_fault_test(ring kill shm faults_thread ";WEFT_PROGRESS_THREAD=1" ";progress_thread")
weft_add_fault_test(bcast kill tcp faults_thread ";WEFT_PROGRESS_THREAD=1" ";progress_thread")
weft_add_fault_test(direct stop vnodes2 faults_thread ";WEFT_PROGRESS_THREAD=1" ";progress_thread")

# ---- a link down while its peer runs, then the peer dies/stops/goes on ----
# (test_link_down.cc) np 2, every pair over TCP: destroy's final barrier
# ends in each case (die: the death is seen while waiting; stop: WEFT_TIMEOUT
# once a link is down; live: at once). stop waits out WEFT_TIMEOUT: sleepy.
add_executable(weft_mpi_link_down ${WEFT_MPI_TESTS_DIR}/test_link_down.cc)
target_link_libraries(weft_mpi_link_down PRIVATE weft MPI::MPI_CXX Threads::Threads)
target_compile_options(weft_mpi_link_down PRIVATE ${WEFT_C_WARNINGS})
foreach(config tcp vnodes2)
  weft_mpi_config_env(${config} config_env)
  foreach(mode die stop live)
    set(test_name link_down_${mode}_np2_${config})
    set(extra_labels "")
    if(mode STREQUAL "stop")
      set(extra_labels ";sleepy")
    endif()
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${WEFT_MPIEXEC_FLAGS}
              --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_mpi_link_down> ${mode} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=3"
      PASS_REGULAR_EXPRESSION "LINKDOWN-OK rank 0:"
      FAIL_REGULAR_EXPRESSION "LINKDOWN-FAIL"
      TIMEOUT 60
      PROCESSORS 2
      LABELS "mpi;faults;np2;${config}${extra_labels}")
  endforeach()
endforeach()
