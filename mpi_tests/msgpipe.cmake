# Message pipes (issue 14, include/weft.h "Message pipes"; mpi_tests/test_msgpipe.cc).
# Included from mpi_tests/CMakeLists.txt, which defines weft_add_mpi_test_binary /
# weft_add_mpi_suite / weft_mpi_config_env. Label: msgpipe.
#
# Every test runs in both progress modes (WEFT_PROGRESS_THREAD=0 and 1, set by
# the test before its comm is made). np 1 is a pipe to oneself (the transport
# config does not matter there); np 3 runs only TwoPeers.

weft_add_mpi_test_binary(weft_mpi_msgpipe test_msgpipe.cc)

set(WEFT_MSGPIPE_CONFIGS shm shm_nocma tcp vnodes2)
if(TARGET weft_emu_verbs)
  list(APPEND WEFT_MSGPIPE_CONFIGS ib)
  # The ib entries load the emulated device: built with the test.
  add_dependencies(weft_mpi_msgpipe weft_emu_verbs)
endif()
weft_add_mpi_suite(NAME msgpipe BINARY weft_mpi_msgpipe NPS 1 CONFIGS shm
                   GTEST_FILTER "-*TwoPeers*" LABELS msgpipe TIMEOUT 120)
weft_add_mpi_suite(NAME msgpipe BINARY weft_mpi_msgpipe NPS 2 CONFIGS ${WEFT_MSGPIPE_CONFIGS}
                   GTEST_FILTER "-*TwoPeers*" LABELS msgpipe TIMEOUT 120)
weft_add_mpi_suite(NAME msgpipe BINARY weft_mpi_msgpipe NPS 3 CONFIGS shm tcp
                   GTEST_FILTER "*TwoPeers*" LABELS msgpipe TIMEOUT 60)
# No buffer inline: every non-empty buffer is a message of its own on the data lane.
weft_add_mpi_suite(NAME msgpipe_inline0 BINARY weft_mpi_msgpipe NPS 2 CONFIGS shm
                   GTEST_FILTER "-*TwoPeers*" LABELS msgpipe TIMEOUT 120 ENV WEFT_PIPE_INLINE=0)

# ---- a peer killed mid-message (test_msgpipe_faults.cc) ----
# np 2: rank 1 writes a message, then raises SIGKILL; rank 0's pending
# write, descriptor request and read must fail with an error naming it.
# Recovery on (rank 0 outlives rank 1); mpirun's exit code says nothing, so
# the entry judges by rank 0's line. One entry per (config, progress mode).
add_executable(weft_mpi_msgpipe_faults ${WEFT_MPI_TESTS_DIR}/test_msgpipe_faults.cc)
target_include_directories(weft_mpi_msgpipe_faults PRIVATE ${WEFT_MPI_TESTS_DIR})
# GTest only for weft_mpi_test.h (the data patterns); the binary has its own main.
target_link_libraries(weft_mpi_msgpipe_faults PRIVATE weft MPI::MPI_CXX GTest::gtest Threads::Threads)
target_compile_options(weft_mpi_msgpipe_faults PRIVATE ${WEFT_C_WARNINGS})
add_dependencies(weft_mpi_msgpipe weft_mpi_msgpipe_faults)
foreach(config shm shm_nocma tcp vnodes2)
  weft_mpi_config_env(${config} config_env)
  foreach(mode poll thread)
    set(test_name msgpipe_fault_${mode}_np2_${config})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${WEFT_MPIEXEC_FLAGS}
              --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:weft_mpi_msgpipe_faults> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};${config_env};WEFT_TIMEOUT=5;WEFT_MSGPIPE_FAULT_MODE=${mode}"
      PASS_REGULAR_EXPRESSION "MSGPIPE-FAULT-OK rank 0:"
      FAIL_REGULAR_EXPRESSION "MSGPIPE-FAULT-FAIL"
      TIMEOUT 60
      PROCESSORS 2
      LABELS "mpi;msgpipe;faults;np2;${config}")
  endforeach()
endforeach()

# ---- device buffers (the emulated CUDA runtime, as in device.cmake) ----
# The same source with WEFT_TEST_WITH_CUDA: the tensor tests mix device and
# host memory on both sides (every other tensor of the 64 from device memory,
# the reader on a device where target_device says so), and a device tensor
# on a delayed stream keeps a read pending for a close. The binary links the
# emulator and weft loads the same file (one emulated GPU state); ranks sit
# on device rank % 2, devices 0 and 1 cannot reach each other (staged).
# Emu builds only (WEFT_TEST_EMU_CUDA, mpi_tests/CMakeLists.txt; review T1).
if(WEFT_TEST_EMU_CUDA)
  weft_add_mpi_test_binary(weft_mpi_msgpipe_dev test_msgpipe.cc)
  target_compile_definitions(weft_mpi_msgpipe_dev PRIVATE WEFT_TEST_WITH_CUDA)
  target_link_libraries(weft_mpi_msgpipe_dev PRIVATE weft_emu_cuda)
  add_dependencies(weft_mpi_msgpipe weft_mpi_msgpipe_dev)
  set(WEFT_MSGPIPE_DEV_ENV WEFT_CUDA_LIB=$<TARGET_FILE:weft_emu_cuda> WEFT_EMU_CUDA_DEVICES=2
      WEFT_EMU_CUDA_NO_PEER=0-1)
  set(WEFT_MSGPIPE_DEV_FILTER "*Tensor*:*EmptyMessages*:*Device*")
  weft_add_mpi_suite(NAME msgpipe_dev BINARY weft_mpi_msgpipe_dev NPS 1 CONFIGS shm
                     GTEST_FILTER ${WEFT_MSGPIPE_DEV_FILTER} LABELS "msgpipe;device" TIMEOUT 120
                     ENV ${WEFT_MSGPIPE_DEV_ENV})
  weft_add_mpi_suite(NAME msgpipe_dev BINARY weft_mpi_msgpipe_dev NPS 2 CONFIGS shm tcp vnodes2
                     GTEST_FILTER ${WEFT_MSGPIPE_DEV_FILTER} LABELS "msgpipe;device" TIMEOUT 120
                     ENV ${WEFT_MSGPIPE_DEV_ENV})
endif()
