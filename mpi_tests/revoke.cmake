# weft_comm_revoke and weft_comm_shrink (issue 28; mpi_tests/test_revoke.cc).
# Included from mpi_tests/CMakeLists.txt. Label: verdicts.
#
# np 4, one entry per (case, config): revoke (no rank fails: every pending
# call ends with WEFT_ERR_REVOKED within 1 s, shrink keeps all 4), exclude
# (weft_comm_shrink_excluding leaves out a live rank at once), kill and
# stop (rank 2 SIGKILLs / SIGSTOPs itself mid-loop: the survivors' shrink
# gives a comm of 3 whose allreduce is exact), and skip on vnodes2 (rank 2
# lives and skips an allreduce: every survivor names it, all 4 shrink),
# and link over tcp (rank 2's link to rank 1 breaks while both live: every
# rank names the link, the shrink leaves rank 2 out). The binary has its own main;
# the new comm's rank 0 prints REVOKE-ALL-OK once every rank passed.
# Recovery on for kill/stop (the survivors outlive rank 2); mpirun's exit
# code says nothing there, so the entries judge by the lines.
add_executable(weft_mpi_revoke ${WEFT_MPI_TESTS_DIR}/test_revoke.cc)
target_link_libraries(weft_mpi_revoke PRIVATE weft MPI::MPI_CXX Threads::Threads)
target_compile_options(weft_mpi_revoke PRIVATE ${WEFT_C_WARNINGS})
# The same source with op `stream` (an allreduce on a CUDA stream): linked to
# the emulated CUDA runtime, which weft loads too (WEFT_CUDA_LIB). Emu builds only.
if(WEFT_TEST_EMU_CUDA)
  add_executable(weft_mpi_revoke_stream ${WEFT_MPI_TESTS_DIR}/test_revoke.cc)
  target_include_directories(weft_mpi_revoke_stream PRIVATE ${PROJECT_SOURCE_DIR}/tests/emu/cuda)
  target_link_libraries(weft_mpi_revoke_stream PRIVATE weft weft_emu_cuda MPI::MPI_CXX Threads::Threads)
  target_compile_options(weft_mpi_revoke_stream PRIVATE ${WEFT_C_WARNINGS})
  target_compile_definitions(weft_mpi_revoke_stream PRIVATE WEFT_REVOKE_CUDA=1)
endif()
# One np 4 entry: name, case, loop operation, config, labels (a list).
# Op stream runs the emulated-CUDA build of the binary.
function(weft_add_revoke_entry name case op config labels)
  weft_mpi_config_env(${config} config_env)
  set(ranks "4")
  set(binary weft_mpi_revoke)
  # Fault link: rank 2's tcp link to rank 1 breaks; on two virtual nodes
  # to rank 0, the other node's leader (the message path's collectives);
  # in a reduce to rank 0 too, rank 2's parent in the binomial tree the
  # selector takes for its 256 KiB at np 4 (rank 1 sends only to rank 0
  # there, so its link to rank 2 is never made).
  set(link_peer 1)
  if(config STREQUAL "vnodes2" OR op STREQUAL "reduce")
    set(link_peer 0)
  endif()
  if(op STREQUAL "stream")
    set(binary weft_mpi_revoke_stream)
    list(APPEND config_env WEFT_CUDA_LIB=$<TARGET_FILE:weft_emu_cuda>)
  endif()
  if(case STREQUAL "revoke")
    set(pass "REVOKE-ALL-OK 4 ranks")
  elseif(case STREQUAL "exclude" OR case STREQUAL "kill" OR case STREQUAL "stop" OR case STREQUAL "link")
    set(pass "REVOKE-ALL-OK 3 ranks")
  else()   # skip, argerr: rank 2 lives and is kept
    set(pass "REVOKE-ALL-OK 4 ranks")
  endif()
  add_test(NAME ${name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${WEFT_MPIEXEC_FLAGS}
            --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${binary}> ${MPIEXEC_POSTFLAGS})
  if(case STREQUAL "stop" OR case STREQUAL "skip")
    list(APPEND labels sleepy)   # most of it is waiting out WEFT_TIMEOUT with the CPUs idle
  endif()
  if(op STREQUAL "stream")
    list(APPEND labels emu device)
  endif()
  list(APPEND labels mpi faults np4 ${config})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=5;WEFT_REVOKE_CASE=${case};WEFT_REVOKE_OP=${op};WEFT_REVOKE_LINK_PEER=${link_peer}"
    PASS_REGULAR_EXPRESSION "${pass}"
    FAIL_REGULAR_EXPRESSION "REVOKE-FAIL"
    TIMEOUT 90
    PROCESSORS 2
    LABELS "${labels}")
endfunction()

foreach(config shm tcp vnodes2)
  foreach(case revoke exclude kill stop)
    weft_add_revoke_entry(revoke_${case}_np4_${config} ${case} allreduce ${config} verdicts)
  endforeach()
  # A live rank that skips an allreduce, in CI on two virtual nodes (the
  # message path): the census names it on every survivor, a survivor leaves
  # its unanswered announcement to rank 2, and all 4 shrink.
  if(config STREQUAL "vnodes2")
    weft_add_revoke_entry(revoke_skip_np4_${config} skip allreduce ${config} verdicts)
  endif()
  # The same on a comm split from the world one (ranks reversed): the
  # verdicts name rank 2 and its number in the parent (matrix label; kill
  # over shm, under a second, is CI's, label verdicts).
  foreach(case kill skip)
    set(label verdicts_matrix)
    if(case STREQUAL "kill" AND config STREQUAL "shm")
      set(label verdicts)
    endif()
    weft_add_revoke_entry(verdicts_${case}_onsplit_np4_${config} ${case} allreduce ${config} ${label})
    set_property(TEST verdicts_${case}_onsplit_np4_${config} APPEND PROPERTY ENVIRONMENT "WEFT_REVOKE_SPLIT=1")
  endforeach()
  # The fault matrix (label verdicts_matrix, which scripts/test leaves out:
  # ~3 min): kill and stop x every other operation of the loop. The kill
  # and stop entries above are its allreduce row, run by CI. Its result is
  # in docs/testing.md ("The fault matrix").
  foreach(case kill stop)
    foreach(op iallreduce allgather bcast reduce alltoall barrier p2p split)
      weft_add_revoke_entry(verdicts_${case}_${op}_np4_${config} ${case} ${op} ${config} verdicts_matrix)
    endforeach()
  endforeach()
  # A live rank that skips the call, or refuses it by its own argument
  # check. Not p2p: a ring's other pairs complete, so the rank two hops
  # away goes on into a next round nobody joins (not a verdict on rank 2).
  # The barrier has no argument to refuse.
  foreach(op allreduce iallreduce allgather bcast reduce alltoall barrier split)
    if(NOT (op STREQUAL "allreduce" AND config STREQUAL "vnodes2"))   # revoke_skip_np4_vnodes2 above
      weft_add_revoke_entry(verdicts_skip_${op}_np4_${config} skip ${op} ${config} verdicts_matrix)
    endif()
    if(NOT op STREQUAL "barrier")
      weft_add_revoke_entry(verdicts_argerr_${op}_np4_${config} argerr ${op} ${config} verdicts_matrix)
    endif()
    # The same call number with another operation: another kind (rank 2
    # calls a barrier; an allreduce where the others barrier), half the
    # size, another root, another dtype of the same size, another op.
    weft_add_revoke_entry(verdicts_kind_${op}_np4_${config} kind ${op} ${config} verdicts_matrix)
    if(NOT op STREQUAL "barrier" AND NOT op STREQUAL "split")
      weft_add_revoke_entry(verdicts_size_${op}_np4_${config} size ${op} ${config} verdicts_matrix)
    endif()
    if(op STREQUAL "bcast" OR op STREQUAL "reduce")
      weft_add_revoke_entry(verdicts_root_${op}_np4_${config} root ${op} ${config} verdicts_matrix)
    endif()
    if(op STREQUAL "allreduce" OR op STREQUAL "iallreduce" OR op STREQUAL "reduce")
      weft_add_revoke_entry(verdicts_dtype_${op}_np4_${config} dtype ${op} ${config} verdicts_matrix)
      weft_add_revoke_entry(verdicts_op_${op}_np4_${config} op ${op} ${config} verdicts_matrix)
    endif()
  endforeach()
  # Message pipes (a ring of 256 KiB messages), creation by weft_comm_init
  # (the unique id sent by MPI_Send), and an allreduce on a CUDA stream
  # (the emulated runtime): a rank that dies or stops; a live rank that
  # skips the creation or the stream call (not the pipes: as for p2p, a
  # ring's other pairs complete and the rank two hops away goes on into a
  # round nobody joins).
  foreach(case kill stop skip)
    set(ops init)
    if(NOT case STREQUAL "skip")
      list(APPEND ops pipe)
    endif()
    if(WEFT_TEST_EMU_CUDA)
      list(APPEND ops stream)
    endif()
    foreach(op ${ops})
      weft_add_revoke_entry(verdicts_${case}_${op}_np4_${config} ${case} ${op} ${config} verdicts_matrix)
    endforeach()
  endforeach()
  # A link that breaks while both ranks live (rank 2 shuts its tcp
  # connections to one rank down): every rank names the link, and the
  # shrink leaves rank 2 out (of one link, the higher rank). Not over shm (one
  # host's memory: no link to break short of a process's death); not p2p
  # and pipes (a ring: see above); not split (its bootstrap's own texts).
  # The allreduce over tcp is CI's (label verdicts, ~2 s).
  if(NOT config STREQUAL "shm")
    foreach(op allreduce iallreduce allgather bcast reduce alltoall barrier)
      set(label verdicts_matrix)
      if(op STREQUAL "allreduce" AND config STREQUAL "tcp")
        set(label verdicts)
      endif()
      weft_add_revoke_entry(verdicts_link_${op}_np4_${config} link ${op} ${config} ${label})
    endforeach()
  endif()
endforeach()

# The flight recorder (mpi_tests/test_trace.cc): WEFT_TRACE journals and
# tools/weft-trace naming the rank that skipped a collective. np 4 on one
# node (node-local path) and two virtual nodes (message path).
add_executable(weft_mpi_trace ${WEFT_MPI_TESTS_DIR}/test_trace.cc)
target_link_libraries(weft_mpi_trace PRIVATE weft MPI::MPI_CXX Threads::Threads)
target_compile_options(weft_mpi_trace PRIVATE ${WEFT_C_WARNINGS})
target_compile_definitions(weft_mpi_trace PRIVATE
  WEFT_TRACE_TOOL="${PROJECT_SOURCE_DIR}/tools/weft_trace/weft-trace")
foreach(config shm vnodes2)
  weft_mpi_config_env(${config} config_env)
  set(test_name trace_skip_np4_${config})
  add_test(NAME ${test_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${WEFT_MPIEXEC_FLAGS}
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_mpi_trace> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=2"
    PASS_REGULAR_EXPRESSION "TRACE-OK"
    FAIL_REGULAR_EXPRESSION "TRACE-FAIL"
    TIMEOUT 90
    PROCESSORS 2
    LABELS "mpi;verdicts;sleepy;np4;${config}")
endforeach()
