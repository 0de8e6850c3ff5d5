# weft_gather, weft_scatter, weft_alltoallv (collectives/gather.c,
# collectives/alltoall.c): every root, in place and out of place, uneven
# alltoallv layouts with empty blocks, the non-blocking forms, argument
# checks, ranks that disagree on an alltoallv block. Included from
# mpi_tests/CMakeLists.txt (weft_add_mpi_test_binary / weft_add_mpi_suite).
#
# Matrix:
#   np 1             shm                  one rank: local copies only
#   np 2, 3, 4       shm, tcp, vnodes2    full size list (0 .. 300 KiB)
#   np 5             shm, vnodes2         short size list (test decides)
#   device buffers under the emulated CUDA runtime (WEFT_TEST_MEM=device,
#   short size list): np 2 shm, tcp; np 4 shm (devices without peer access)
# The stream-ordered forms are in test_stream.cc (StreamTest.*).
weft_add_mpi_test_binary(weft_mpi_gather test_gather.cc)

weft_add_mpi_suite(NAME gather BINARY weft_mpi_gather NPS 1 CONFIGS shm LABELS "coll;gather" TIMEOUT 120)
weft_add_mpi_suite(NAME gather BINARY weft_mpi_gather NPS 2 3 4 CONFIGS shm tcp vnodes2
                   LABELS "coll;gather" TIMEOUT 180)
weft_add_mpi_suite(NAME gather BINARY weft_mpi_gather NPS 5 CONFIGS shm vnodes2
                   LABELS "coll;gather" TIMEOUT 180)

# Device buffers: the same source built against the CUDA runtime that
# device.cmake picked (WEFT_DEV_CUDART), buffers from cudaMalloc.
if(DEFINED WEFT_DEV_CUDART)
  weft_add_mpi_test_binary(weft_mpi_gather_dev test_gather.cc)
  target_compile_definitions(weft_mpi_gather_dev PRIVATE WEFT_TEST_WITH_CUDA)
  target_link_libraries(weft_mpi_gather_dev PRIVATE ${WEFT_DEV_CUDART})
  set(WEFT_GATHER_DEV_ENV WEFT_TEST_MEM=device WEFT_TEST_SIZES=reduced ${WEFT_DEV_CUDA_ENV})
  weft_add_mpi_suite(NAME gather_dev BINARY weft_mpi_gather_dev NPS 2 CONFIGS shm tcp
                     LABELS "coll;gather;device" ENV ${WEFT_GATHER_DEV_ENV} TIMEOUT 180)
  set(WEFT_GATHER_NOPEER "")
  if(WEFT_TEST_CUDA_RUNTIME STREQUAL "emu")
    set(WEFT_GATHER_NOPEER WEFT_EMU_CUDA_DEVICES=2 WEFT_EMU_CUDA_NO_PEER=0-1)
  endif()
  weft_add_mpi_suite(NAME gather_dev BINARY weft_mpi_gather_dev NPS 4 CONFIGS shm
                     LABELS "coll;gather;device" TIMEOUT 180 ENV ${WEFT_GATHER_DEV_ENV} ${WEFT_GATHER_NOPEER})
endif()
