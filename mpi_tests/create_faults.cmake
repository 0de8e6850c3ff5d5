# Partial failures while a comm is made (issue 12, test_create_faults.cc): a
# rank that dies or stops in the middle of weft_comm_init (unique id) or of
# weft_comm_split; the survivors must fail within WEFT_TIMEOUT (+ margin)
# naming it. Included from mpi_tests/CMakeLists.txt (WEFT_MPI_TESTS_DIR,
# WEFT_MPI_TEST_COMMON_ENV, weft_mpi_config_env).
#
# One mpirun of 4 ranks per (case, config), WEFT_TIMEOUT=3, with recovery on
# so the survivors outlive the victim. Open MPI then exits 0 whatever
# happened, so ctest judges by the output: the first survivor prints
# "CREATE-FAULTS-PASSED <case>" only when every survivor passed, and any
# "CREATE-FAULT-FAIL" line (a survivor's failure, or a call that hung past
# its watchdog) fails the entry. Label: faults (with create_faults).
#
# The binary exports its own gethostname and recv (ENABLE_EXPORTS): libweft's
# calls bind to them, and the victim ends or stalls itself there, at a fixed
# point inside creation (see the file's comment). libdl for dladdr/dlsym.
add_executable(weft_mpi_create_faults ${WEFT_MPI_TESTS_DIR}/test_create_faults.cc)
target_link_libraries(weft_mpi_create_faults PRIVATE weft MPI::MPI_CXX Threads::Threads ${CMAKE_DL_LIBS})
target_compile_options(weft_mpi_create_faults PRIVATE ${WEFT_C_WARNINGS})
set_target_properties(weft_mpi_create_faults PROPERTIES ENABLE_EXPORTS ON)

# The unique-id bootstrap is TCP to the root whatever the pipes are: shm only.
# Split goes over the parent's pipes: shm and tcp.
set(WEFT_CREATE_FAULT_UID_CASES uid_absent uid_join_exit uid_mid_exit uid_prep_exit uid_mid_stop uid_mid_sleep uid_root_exit
    uid_root_mid_exit)
set(WEFT_CREATE_FAULT_SPLIT_CASES split_exit split_stop split_mid_exit split_mid_exit_late split_mid_stop
    split_mid_sleep)

function(weft_add_create_fault fcase config)
  weft_mpi_config_env(${config} config_env)
  set(test_name create_faults_${fcase}_${config})
  add_test(NAME ${test_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${WEFT_MPIEXEC_FLAGS}
            --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_mpi_create_faults> ${fcase} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=3"
    PASS_REGULAR_EXPRESSION "CREATE-FAULTS-PASSED ${fcase}:"
    FAIL_REGULAR_EXPRESSION "CREATE-FAULT-FAIL"
    TIMEOUT 60
    PROCESSORS 4
    LABELS "mpi;faults;create_faults;np4;${config}")
  # A victim that stops, sleeps or never joins: the survivors wait out
  # WEFT_TIMEOUT (3 s), so the entry is mostly idle. scripts/test runs the
  # sleepy entries side by side.
  if(fcase MATCHES "(stop|sleep|absent)$")
    set_property(TEST ${test_name} APPEND PROPERTY LABELS sleepy)
  endif()
endfunction()

foreach(fcase IN LISTS WEFT_CREATE_FAULT_UID_CASES)
  weft_add_create_fault(${fcase} shm)
endforeach()
foreach(fcase IN LISTS WEFT_CREATE_FAULT_SPLIT_CASES)
  foreach(config shm tcp)
    weft_add_create_fault(${fcase} ${config})
  endforeach()
endforeach()
