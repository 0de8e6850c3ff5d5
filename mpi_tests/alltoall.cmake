# weft_alltoall (collectives/alltoall.c): every algorithm x block sizes x in
# place / out of place, back-to-back calls, non-blocking calls, argument
# checks, the info log and a failing step. Included from
# mpi_tests/CMakeLists.txt (weft_add_mpi_test_binary / weft_add_mpi_suite).
#
# Matrix (all entries together well under a minute on 2 cores):
#   np 1             shm                  one rank: local copies only
#   np 2, 3, 4       shm, tcp, vnodes2    full block list (0 .. 1 MiB)
#   np 5, 8          shm, vnodes2         short block list (test decides)
#   np 3             shm, WEFT_DEBUG=info the once-per-shape log line
#   np 2             shm, tcp             a failing step (WEFT_TIMEOUT=2)
#   device buffers under the emulated CUDA runtime (WEFT_TEST_MEM=device,
#   short block list): np 2 shm, tcp, vnodes2; np 4 shm (devices without
#   peer access)
weft_add_mpi_test_binary(weft_mpi_a2a test_alltoall.cc)

set(WEFT_A2A_FILTER "Alltoall.*-*InfoLogs*:*StepFailure*")
weft_add_mpi_suite(NAME a2a BINARY weft_mpi_a2a NPS 1 CONFIGS shm
                   GTEST_FILTER ${WEFT_A2A_FILTER} LABELS "coll;a2a" TIMEOUT 120)
weft_add_mpi_suite(NAME a2a BINARY weft_mpi_a2a NPS 2 3 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER ${WEFT_A2A_FILTER} LABELS "coll;a2a" TIMEOUT 180)
weft_add_mpi_suite(NAME a2a BINARY weft_mpi_a2a NPS 5 8 CONFIGS shm vnodes2
                   GTEST_FILTER ${WEFT_A2A_FILTER} LABELS "coll;a2a" TIMEOUT 180)
# The message path's selector (WEFT_NODE_COLL_KB=0: small blocks would
# otherwise go node-local; test_node_coll.cc checks that line).
weft_add_mpi_suite(NAME a2a_info_log BINARY weft_mpi_a2a NPS 3 CONFIGS shm
                   GTEST_FILTER "*InfoLogs*" LABELS "coll;a2a" ENV WEFT_DEBUG=info WEFT_NODE_COLL_KB=0 TIMEOUT 60)
# sleepy: waits out WEFT_TIMEOUT=2 (scripts/test runs such entries side by side).
weft_add_mpi_suite(NAME a2a_step_failure BINARY weft_mpi_a2a NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "*StepFailure*" LABELS "coll;a2a;sleepy" TIMEOUT 60)

# Device buffers: the same source built against the CUDA runtime that
# device.cmake picked (WEFT_DEV_CUDART: the emulated one unless
# WEFT_TEST_CUDA_RUNTIME=real), buffers from cudaMalloc.
if(DEFINED WEFT_DEV_CUDART)
  weft_add_mpi_test_binary(weft_mpi_a2a_dev test_alltoall.cc)
  target_compile_definitions(weft_mpi_a2a_dev PRIVATE WEFT_TEST_WITH_CUDA)
  target_link_libraries(weft_mpi_a2a_dev PRIVATE ${WEFT_DEV_CUDART})
  set(WEFT_A2A_DEV_ENV WEFT_TEST_MEM=device WEFT_TEST_SIZES=reduced ${WEFT_DEV_CUDA_ENV})
  weft_add_mpi_suite(NAME a2a_dev BINARY weft_mpi_a2a_dev NPS 2 CONFIGS shm tcp vnodes2
                     GTEST_FILTER ${WEFT_A2A_FILTER} LABELS "coll;a2a;device" ENV ${WEFT_A2A_DEV_ENV} TIMEOUT 180)
  # np 4 on two emulated devices that cannot reach each other: neighbours'
  # blocks are staged through host memory by the pipes.
  set(WEFT_A2A_NOPEER "")
  if(WEFT_TEST_CUDA_RUNTIME STREQUAL "emu")
    set(WEFT_A2A_NOPEER WEFT_EMU_CUDA_DEVICES=2 WEFT_EMU_CUDA_NO_PEER=0-1)
  endif()
  weft_add_mpi_suite(NAME a2a_dev BINARY weft_mpi_a2a_dev NPS 4 CONFIGS shm
                     GTEST_FILTER ${WEFT_A2A_FILTER} LABELS "coll;a2a;device" TIMEOUT 180
                     ENV ${WEFT_A2A_DEV_ENV} ${WEFT_A2A_NOPEER})
endif()
