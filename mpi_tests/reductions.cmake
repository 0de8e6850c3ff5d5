# Reductions (allreduce, reduce_scatter, reduce) and the non-blocking
# collectives: host buffers, and device buffers under the emulated CUDA
# runtime. Included from mpi_tests/CMakeLists.txt after device.cmake (whose
# WEFT_DEV_CUDART / WEFT_DEV_CUDA_ENV say which CUDA runtime the device
# binaries link), which defines weft_add_mpi_test_binary / weft_add_mpi_suite.
#
# Matrix. Measured on the 2-core CI machine, all 30 entries one after the
# other: 56 s plain (each entry 0.4-4.3 s; the np 8 ones and the 64 MiB ones
# the longest), 254 s under ASan/UBSan (up to 24 s an entry); with the
# machine loaded by other jobs (load 10) the plain pass took 175 s.
#   reductions       np 1 shm; np 2, 3, 4 shm, vnodes2; np 2, 4 tcp -- every
#                    dtype x op x algorithm and the selector, 4 KiB chunks
#                    (test_reductions.cc), the default chunk, argument checks;
#                    np 5, 8 shm, vnodes2 -- the same with WEFT_TEST_SIZES=reduced
#   reductions_big   64 MiB float32 SUM once per algorithm: np 2 shm,
#                    np 4 vnodes2; np 8 shm (allreduce only)
#   nonblocking      np 1, 2, 3, 4, 8 shm; np 2, 3 tcp; np 4, 5 vnodes2
#   reductions_dev   device buffers (the kernels, run by the emulated runtime
#                    by name with the host's arithmetic): np 2 shm, tcp,
#                    vnodes2; np 4 vnodes2 and shm (there reductions above
#                    64 KiB go through the large node-local segment, the
#                    result via its host scratch) -- the matrix with
#                    WEFT_TEST_SIZES=reduced plus test_reductions_device.cc
#   reductions_dev_staged  np 2 shm, the same with no kernel image for the
#                    emulated GPU (WEFT_EMU_CUDA_MODULES=0): the staged path
#   reductions_dev_info  np 2 shm, WEFT_DEBUG=info, no kernels: the staged
#                    path is said once (the message path: WEFT_NODE_COLL_KB=0)
weft_add_mpi_test_binary(weft_mpi_reductions test_reductions.cc)
weft_add_mpi_test_binary(weft_mpi_nonblocking test_nonblocking.cc)

set(WEFT_RED_FILTER "Reductions.*")
weft_add_mpi_suite(NAME reductions BINARY weft_mpi_reductions NPS 1 2 3 4 CONFIGS shm
                   GTEST_FILTER ${WEFT_RED_FILTER} LABELS reductions TIMEOUT 300)
weft_add_mpi_suite(NAME reductions BINARY weft_mpi_reductions NPS 2 4 CONFIGS tcp
                   GTEST_FILTER ${WEFT_RED_FILTER} LABELS reductions TIMEOUT 300)
# Two virtual nodes: hier reduces inside each node and across the leaders
# (np 3 and 5: nodes of unequal size); the others cross nodes over tcp.
weft_add_mpi_suite(NAME reductions BINARY weft_mpi_reductions NPS 2 3 4 CONFIGS vnodes2
                   GTEST_FILTER ${WEFT_RED_FILTER} LABELS reductions TIMEOUT 300)
# 5 and 8 ranks (oversubscribed on 2 cores): every dtype x op x algorithm
# still, with the shorter count list (WEFT_TEST_SIZES=reduced).
weft_add_mpi_suite(NAME reductions BINARY weft_mpi_reductions NPS 5 8 CONFIGS vnodes2
                   GTEST_FILTER ${WEFT_RED_FILTER} LABELS reductions TIMEOUT 300 ENV WEFT_TEST_SIZES=reduced)
weft_add_mpi_suite(NAME reductions BINARY weft_mpi_reductions NPS 5 8 CONFIGS shm
                   GTEST_FILTER ${WEFT_RED_FILTER} LABELS reductions TIMEOUT 300 ENV WEFT_TEST_SIZES=reduced)
# 64 MiB of float32 once per algorithm (~2 GiB of memory at np 8, where
# only allreduce's algorithms run: the other kinds' at np 2 and 4).
weft_add_mpi_suite(NAME reductions_big BINARY weft_mpi_reductions NPS 2 CONFIGS shm
                   GTEST_FILTER "ReductionsBig.*" LABELS reductions TIMEOUT 300)
weft_add_mpi_suite(NAME reductions_big BINARY weft_mpi_reductions NPS 4 CONFIGS vnodes2
                   GTEST_FILTER "ReductionsBig.*" LABELS reductions TIMEOUT 300)
weft_add_mpi_suite(NAME reductions_big BINARY weft_mpi_reductions NPS 8 CONFIGS shm
                   GTEST_FILTER "ReductionsBig.Big64MiBAllreduce" LABELS reductions TIMEOUT 300)

weft_add_mpi_suite(NAME nonblocking BINARY weft_mpi_nonblocking NPS 1 2 3 4 8 CONFIGS shm
                   LABELS "coll;nonblocking" TIMEOUT 180)
weft_add_mpi_suite(NAME nonblocking BINARY weft_mpi_nonblocking NPS 2 3 CONFIGS tcp
                   LABELS "coll;nonblocking" TIMEOUT 180)
weft_add_mpi_suite(NAME nonblocking BINARY weft_mpi_nonblocking NPS 4 5 CONFIGS vnodes2
                   LABELS "coll;nonblocking" TIMEOUT 180)
# The comm's progress thread advances them too (WEFT_PROGRESS_THREAD=1: a
# client of the engine run beside the application's tests and waits).
weft_add_mpi_suite(NAME nonblocking_thread BINARY weft_mpi_nonblocking NPS 4 CONFIGS shm
                   LABELS "coll;nonblocking;progress_thread" TIMEOUT 180 ENV WEFT_PROGRESS_THREAD=1)

# ---- device buffers (label device) ----
# test_reductions.cc again with every buffer from cudaMalloc
# (WEFT_TEST_MEM=device, the reduced count list), and
# test_reductions_device.cc (mixed host/device, alltoall, non-blocking).
# The emulated runtime runs weft's kernels (tests/emu/cuda/README.md); one
# entry refuses them (WEFT_EMU_CUDA_MODULES=0), as a GPU whose architecture
# has no image, and covers the staged path. On real GPUs
# (WEFT_TEST_CUDA_RUNTIME=real) the same entries run the kernels.
if(DEFINED WEFT_DEV_CUDART AND WEFT_DEV_CUDART)
  weft_add_mpi_test_binary(weft_mpi_reductions_dev test_reductions.cc test_reductions_device.cc)
  target_compile_definitions(weft_mpi_reductions_dev PRIVATE WEFT_TEST_WITH_CUDA)
  target_link_libraries(weft_mpi_reductions_dev PRIVATE ${WEFT_DEV_CUDART})
  set(WEFT_RED_DEV_ENV WEFT_TEST_MEM=device WEFT_TEST_SIZES=reduced ${WEFT_DEV_CUDA_ENV})
  set(WEFT_RED_DEV_FILTER "Reductions.*:ReductionsDevice.*-*StagedPath*")
  weft_add_mpi_suite(NAME reductions_dev BINARY weft_mpi_reductions_dev NPS 2 CONFIGS shm tcp vnodes2
                     GTEST_FILTER ${WEFT_RED_DEV_FILTER} LABELS "reductions;device"
                     ENV ${WEFT_RED_DEV_ENV} TIMEOUT 300)
  weft_add_mpi_suite(NAME reductions_dev BINARY weft_mpi_reductions_dev NPS 4 CONFIGS vnodes2 shm
                     GTEST_FILTER ${WEFT_RED_DEV_FILTER} LABELS "reductions;device"
                     ENV ${WEFT_RED_DEV_ENV} TIMEOUT 300)
  if(WEFT_TEST_CUDA_RUNTIME STREQUAL "emu")
    weft_add_mpi_suite(NAME reductions_dev_staged BINARY weft_mpi_reductions_dev NPS 2 CONFIGS shm
                       GTEST_FILTER ${WEFT_RED_DEV_FILTER} LABELS "reductions;device"
                       ENV ${WEFT_RED_DEV_ENV} WEFT_EMU_CUDA_MODULES=0 TIMEOUT 300)
    weft_add_mpi_suite(NAME reductions_dev_info BINARY weft_mpi_reductions_dev NPS 2 CONFIGS shm
                       GTEST_FILTER "*StagedPathLoggedOnce*" LABELS "reductions;device"
                       ENV ${WEFT_RED_DEV_ENV} WEFT_DEBUG=info WEFT_REDUCTIONS_EXPECT_STAGED=1
                           WEFT_EMU_CUDA_MODULES=0 WEFT_NODE_COLL_KB=0 TIMEOUT 60)
  endif()
endif()
