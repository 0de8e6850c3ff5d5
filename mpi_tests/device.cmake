# The p2p and collectives MPI suites with CUDA device buffers (label device).
# Included from mpi_tests/CMakeLists.txt, which defines
# weft_add_mpi_test_binary / weft_add_mpi_suite.
#
# Same sources as weft_mpi_p2p / weft_mpi_coll, compiled with
# WEFT_TEST_WITH_CUDA: under WEFT_TEST_MEM=device every buffer the tests hand
# to weft comes from cudaMalloc (mpi_tests/weft_test_mem.h). The host binaries
# stay as they are (no CUDA in them).
#
# WEFT_TEST_CUDA_RUNTIME picks the CUDA runtime the device binaries link:
#   emu   (default) the emulated runtime of tests/emu/cuda (target
#         weft_emu_cuda); the entries point weft at the same file with
#         WEFT_CUDA_LIB, so test and library share one emulated GPU state.
#         Without that target (no CUDA headers) there are no device entries.
#   real  the CUDA toolkit's libcudart (find_package(CUDAToolkit),
#         CUDA::cudart); WEFT_CUDA_LIB is not set, so weft loads
#         libcudart.so itself: the same tests on real GPUs (scripts/validate-gpu).
#
# Matrix. WEFT_TEST_SIZES=reduced everywhere but p2p_dev_full: p2p sizes up
# to 4 MiB + 5, the collectives' short block list (docs/testing.md has the
# measured seconds; all entries together stay within ~4 minutes over both CI
# passes, plain and ASan, on 2 cores):
#   p2p_dev   np 2, 4   shm, tcp, vnodes2   shm: device-to-device on one node
#             np 8      shm, vnodes2        (CUDA IPC where weft has it, else
#             np 4      ib (emulated verbs)  staging); tcp: host staging;
#                                            vnodes2: shm/IPC inside a fake node,
#                                            tcp across; ib: host staging
#   p2p_dev_gdr   np 4  ib                  WEFT_EMU_CUDA_GDR=1: GPUDirect RDMA
#                                            (device memory registered by dma-buf)
#   p2p_dev_full  np 2  shm                 the full size list (64 MiB messages)
#   p2p_dev_nopeer np 4 shm                 emulated devices 0 and 1 cannot reach
#                                            each other: ring neighbours (devices
#                                            0,1,0,1) staged over shm, ranks 0-2
#                                            and 1-3 by IPC, in one run
#   coll_dev  np 2      shm, tcp, vnodes2
#             np 4      shm, vnodes2
#             np 8      vnodes2
#
# The cache variable is defined (and checked) in mpi_tests/CMakeLists.txt. The
# entries of an emu build carry the label emu (weft_add_mpi_suite), so a real
# GPU run can use `ctest -L device -LE emu`; a real build has no entry that
# sets WEFT_CUDA_LIB or binary that links weft_emu_cuda (review T1, checked at
# configure).
if(WEFT_TEST_CUDA_RUNTIME STREQUAL "real")
  find_package(CUDAToolkit REQUIRED)
  set(WEFT_DEV_CUDART CUDA::cudart)
  set(WEFT_DEV_CUDA_ENV "")
  message(STATUS "weft: device tests: real CUDA runtime (${CUDAToolkit_LIBRARY_DIR})")
elseif(WEFT_TEST_CUDA_RUNTIME STREQUAL "emu")
  if(NOT TARGET weft_emu_cuda)
    message(STATUS "weft: device tests: none (no emulated CUDA runtime; WEFT_TEST_CUDA_RUNTIME=real for real GPUs)")
    return()
  endif()
  set(WEFT_DEV_CUDART weft_emu_cuda)
  set(WEFT_DEV_CUDA_ENV WEFT_CUDA_LIB=$<TARGET_FILE:weft_emu_cuda>)
  message(STATUS "weft: device tests: emulated CUDA runtime (tests/emu/cuda)")
endif()

weft_add_mpi_test_binary(weft_mpi_p2p_dev test_p2p.cc test_threads.cc ${PROJECT_SOURCE_DIR}/src/core/config.c)
target_include_directories(weft_mpi_p2p_dev PRIVATE ${WEFT_INC_CORE})
target_compile_definitions(weft_mpi_p2p_dev PRIVATE _GNU_SOURCE WEFT_TEST_WITH_CUDA)
target_link_libraries(weft_mpi_p2p_dev PRIVATE ${WEFT_DEV_CUDART})

weft_add_mpi_test_binary(weft_mpi_coll_dev test_allgather.cc test_barrier_bcast.cc)
target_compile_definitions(weft_mpi_coll_dev PRIVATE WEFT_TEST_WITH_CUDA)
target_link_libraries(weft_mpi_coll_dev PRIVATE ${WEFT_DEV_CUDART})

set(WEFT_DEV_ENV WEFT_TEST_MEM=device WEFT_TEST_SIZES=reduced ${WEFT_DEV_CUDA_ENV})
# Threads.* use host buffers of their own (the host entries run them); the
# >4 GiB tests skip in device mode anyway.
set(WEFT_DEV_P2P_FILTER "-*Huge*:Threads.*")
# Barrier.* move no data (the host entries run them); the info-log and
# step-failure tests have entries of their own in collectives.cmake.
set(WEFT_DEV_COLL_FILTER "Allgather.*:Bcast.*-*Huge*:*InfoLogs*:*StepFailure*")

weft_add_mpi_suite(NAME p2p_dev BINARY weft_mpi_p2p_dev NPS 2 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device" ENV ${WEFT_DEV_ENV})
weft_add_mpi_suite(NAME p2p_dev BINARY weft_mpi_p2p_dev NPS 8 CONFIGS shm vnodes2
                   GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device" ENV ${WEFT_DEV_ENV} TIMEOUT 300)
if(WEFT_TEST_CUDA_RUNTIME STREQUAL "emu")
  if(TARGET weft_emu_verbs)
    weft_add_mpi_suite(NAME p2p_dev BINARY weft_mpi_p2p_dev NPS 4 CONFIGS ib
                       GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device;ib" ENV ${WEFT_DEV_ENV})
    # The emulated GPUs report GPUDirect support: ib reads and writes device
    # memory registered through dma-buf, no staging.
    weft_add_mpi_suite(NAME p2p_dev_gdr BINARY weft_mpi_p2p_dev NPS 4 CONFIGS ib
                       GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device;ib"
                       ENV ${WEFT_DEV_ENV} WEFT_EMU_CUDA_GDR=1)
  endif()
  weft_add_mpi_suite(NAME p2p_dev_nopeer BINARY weft_mpi_p2p_dev NPS 4 CONFIGS shm
                     GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device"
                     ENV ${WEFT_DEV_ENV} WEFT_EMU_CUDA_NO_PEER=0-1)
endif()
# Every size, 64 MiB included (later ENV entries win over WEFT_DEV_ENV's).
weft_add_mpi_suite(NAME p2p_dev_full BINARY weft_mpi_p2p_dev NPS 2 CONFIGS shm
                   GTEST_FILTER ${WEFT_DEV_P2P_FILTER} LABELS "p2p;device" ENV ${WEFT_DEV_ENV}
                   WEFT_TEST_SIZES=full TIMEOUT 300)

weft_add_mpi_suite(NAME coll_dev BINARY weft_mpi_coll_dev NPS 2 CONFIGS shm tcp vnodes2
                   GTEST_FILTER ${WEFT_DEV_COLL_FILTER} LABELS "coll;device" ENV ${WEFT_DEV_ENV} TIMEOUT 300)
weft_add_mpi_suite(NAME coll_dev BINARY weft_mpi_coll_dev NPS 4 CONFIGS shm vnodes2
                   GTEST_FILTER ${WEFT_DEV_COLL_FILTER} LABELS "coll;device" ENV ${WEFT_DEV_ENV} TIMEOUT 300)
weft_add_mpi_suite(NAME coll_dev BINARY weft_mpi_coll_dev NPS 8 CONFIGS vnodes2
                   GTEST_FILTER ${WEFT_DEV_COLL_FILTER} LABELS "coll;device" ENV ${WEFT_DEV_ENV} TIMEOUT 300)
