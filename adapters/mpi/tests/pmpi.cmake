# The PMPI drop-in (libweft_mpi.so) against MPI's own collectives, label
# "pmpi". Included from adapters/mpi/CMakeLists.txt when tests are built;
# uses weft_add_mpi_suite of mpi_tests/CMakeLists.txt (configs shm, tcp,
# vnodes2: weft's transports; MPI's own stay Open MPI's choice unless an
# entry sets OMPI_MCA_*).
#
# The binaries link libweft_mpi.so BEFORE libmpi (NEEDED order: the
# drop-in's MPI_* collectives come first in the lookup). weft_pmpi_test
# also defines the weft_* calls the drop-in makes, counted
# (pmpi_counters.cc); ENABLE_EXPORTS puts them in the executable's dynamic
# symbol table so libweft_mpi.so's references bind to them.
#
# Measured on the 2-core development machine: these 20 entries take 25-40 s
# together at -j1 (`ctest -R '^pmpi_'`; np 8 ~6-10 s, every other entry
# under 4 s). A regression of the MPI progress in pmpi_progress fails after
# ~41 s instead (WEFT_TIMEOUT=20, twice).
if(NOT COMMAND weft_add_mpi_suite OR NOT TARGET weft_mpi)
  return()
endif()
find_package(GTest REQUIRED)
# weft_add_mpi_suite reads WEFT_MPI_TEST_COMMON_ENV (mpirun as root, loopback
# only, WEFT_TIMEOUT, ...) in its caller's scope: a variable of the
# mpi_tests directory, so fetched from there.
get_directory_property(WEFT_MPI_TEST_COMMON_ENV DIRECTORY ${PROJECT_SOURCE_DIR}/mpi_tests
                       DEFINITION WEFT_MPI_TEST_COMMON_ENV)
if(NOT WEFT_MPI_TEST_COMMON_ENV)
  message(FATAL_ERROR "pmpi.cmake: WEFT_MPI_TEST_COMMON_ENV of mpi_tests/ not found")
endif()

add_executable(weft_pmpi_test
  $<TARGET_OBJECTS:weft_mpi_main>
  ${CMAKE_CURRENT_LIST_DIR}/test_pmpi.cc
  ${CMAKE_CURRENT_LIST_DIR}/test_pmpi_errors.cc
  ${CMAKE_CURRENT_LIST_DIR}/test_pmpi_env.cc
  ${CMAKE_CURRENT_LIST_DIR}/pmpi_counters.cc)
target_include_directories(weft_pmpi_test PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/include)
# Order matters: weft_mpi first, MPI after it.
target_link_libraries(weft_pmpi_test PRIVATE weft_mpi MPI::MPI_CXX GTest::gtest Threads::Threads ${CMAKE_DL_LIBS})
target_compile_options(weft_pmpi_test PRIVATE ${WEFT_C_WARNINGS})
# Under WEFT_SANITIZE its C++ at -Og, as the test programs of tests/ and
# mpi_tests/ (mpi_tests/CMakeLists.txt says why): at the build type's -O2
# its three test sources were ~60 s of the ASan build's compile CPU
# (test_pmpi.cc alone: 8.6 s at -Og, measured 2026-12-02).
if(WEFT_SANITIZE)
  target_compile_options(weft_pmpi_test PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Og>)
endif()
set_target_properties(weft_pmpi_test PROPERTIES ENABLE_EXPORTS ON)

add_executable(weft_pmpi_fatal ${CMAKE_CURRENT_LIST_DIR}/pmpi_fatal.c)
target_link_libraries(weft_pmpi_fatal PRIVATE weft_mpi MPI::MPI_C)
target_compile_options(weft_pmpi_fatal PRIVATE ${WEFT_C_WARNINGS})

# Every intercepted call against PMPI, weft for every size > 0
# (WEFT_MPI_MIN_BYTES=0), the exact weft calls counted; errors returned
# with weft's class and text; MPI progress while weft waits.
set(WEFT_PMPI_MAIN_FILTER "PmpiAll.*:PmpiErrors.*:PmpiProgress.*:PmpiThreadLevel.*")
weft_add_mpi_suite(NAME pmpi BINARY weft_pmpi_test NPS 1 2 3 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER ${WEFT_PMPI_MAIN_FILTER} LABELS pmpi
                   ENV WEFT_MPI_MIN_BYTES=0 WEFT_TIMEOUT=30 TIMEOUT 120)
weft_add_mpi_suite(NAME pmpi BINARY weft_pmpi_test NPS 8 CONFIGS shm
                   GTEST_FILTER ${WEFT_PMPI_MAIN_FILTER} LABELS "pmpi;np8"
                   ENV WEFT_MPI_MIN_BYTES=0 WEFT_TIMEOUT=30 TIMEOUT 180)
# The same at MPI_THREAD_SINGLE (mpi_main.cc): the drop-in's weft comms are
# WEFT_THREADS=serialized, so every call above runs with no lock.
weft_add_mpi_suite(NAME pmpi_serialized BINARY weft_pmpi_test NPS 2 4 CONFIGS shm
                   GTEST_FILTER "PmpiAll.*:PmpiThreadLevel.*" LABELS pmpi
                   ENV WEFT_MPI_MIN_BYTES=0 WEFT_TIMEOUT=30 WEFT_TEST_MPI_THREAD=single TIMEOUT 120)

# Sizes on both sides of the built-in threshold on different ranks (issue
# 28, item 5): weft's timeout with a reason on the large ranks, never a
# hang inside MPI. Waits out WEFT_TIMEOUT=2: sleepy.
# WEFT_NODE_COLL_KB=0: at np 3 on one node the node-local rule gives weft
# the allreduce at every size, so there is no MPI side to diverge to;
# ranks on both sides of weft's own node-local limit are NodeColl's
# MismatchAcrossPaths.
weft_add_mpi_suite(NAME pmpi_diverged BINARY weft_pmpi_test NPS 2 3 CONFIGS shm
                   GTEST_FILTER "PmpiDiverged.*" LABELS "pmpi;sleepy" ENV WEFT_TIMEOUT=2 WEFT_NODE_COLL_KB=0
                   TIMEOUT 60)

# The built-in thresholds: 8 B to MPI, 4 MiB to weft (bcast and alltoall,
# which have a default ceiling below it: to MPI), for each collective; on
# one node from 3 ranks 8 B to weft (node-local collectives), not across
# two virtual nodes nor with WEFT_NODE_COLL_KB=0.
weft_add_mpi_suite(NAME pmpi_defaults BINARY weft_pmpi_test NPS 2 3 4 CONFIGS shm
                   GTEST_FILTER "PmpiDefaults.*" LABELS pmpi TIMEOUT 60)
weft_add_mpi_suite(NAME pmpi_defaults BINARY weft_pmpi_test NPS 3 CONFIGS vnodes2
                   GTEST_FILTER "PmpiDefaults.*" LABELS pmpi TIMEOUT 60)
weft_add_mpi_suite(NAME pmpi_defaults_nodecoll0 BINARY weft_pmpi_test NPS 3 CONFIGS shm
                   GTEST_FILTER "PmpiDefaults.*" LABELS pmpi ENV WEFT_NODE_COLL_KB=0 TIMEOUT 60)
# The rooted rules at 8 ranks (a scatter with blocks of 32-512 KiB is MPI's there).
weft_add_mpi_suite(NAME pmpi_defaults BINARY weft_pmpi_test NPS 8 CONFIGS shm
                   GTEST_FILTER "PmpiDefaults.GatherScatterRules" LABELS "pmpi;np8" TIMEOUT 90)
# WEFT_MPI_MIN_BYTES / WEFT_MPI_MAX_BYTES: weft inside [1 KiB, 64 KiB] only.
weft_add_mpi_suite(NAME pmpi_window BINARY weft_pmpi_test NPS 3 CONFIGS shm
                   GTEST_FILTER "PmpiWindow.*" LABELS pmpi
                   ENV WEFT_MPI_MIN_BYTES=1024 WEFT_MPI_MAX_BYTES=65536 TIMEOUT 60)
# WEFT_MPI=0: nothing through weft.
weft_add_mpi_suite(NAME pmpi_off BINARY weft_pmpi_test NPS 2 CONFIGS shm
                   GTEST_FILTER "PmpiOff.*" LABELS pmpi ENV WEFT_MPI=0 TIMEOUT 60)
# WEFT_MPI_COLLS=bcast: only bcast through weft.
weft_add_mpi_suite(NAME pmpi_bcast_only BINARY weft_pmpi_test NPS 2 CONFIGS shm
                   GTEST_FILTER "PmpiOnlyBcast.*" LABELS pmpi
                   ENV WEFT_MPI_COLLS=bcast WEFT_MPI_MIN_BYTES=0 TIMEOUT 60)
# `Isend; Barrier; Wait` against `Recv; Barrier` over Open MPI's TCP (no
# asynchronous progress; 4 MiB: rendezvous): hangs unless the drop-in keeps
# MPI moving while weft waits. WEFT_TIMEOUT=20: a regression fails in ~40 s.
weft_add_mpi_suite(NAME pmpi_progress BINARY weft_pmpi_test NPS 2 3 CONFIGS tcp
                   GTEST_FILTER "PmpiProgress.*" LABELS pmpi TIMEOUT 90
                   ENV WEFT_MPI_MIN_BYTES=0 WEFT_TIMEOUT=20 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp)

# MPI_ERRORS_ARE_FATAL: weft's failure aborts the job with weft's text.
# pmpi_fatal_check.sh checks the exit status and the text, and runs again
# only when Open MPI itself lost its error message (see the script).
add_test(NAME pmpi_fatal_np3_shm
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/pmpi_fatal_check.sh ${MPIEXEC_EXECUTABLE} 3 $<TARGET_FILE:weft_pmpi_fatal>)
set_tests_properties(pmpi_fatal_np3_shm PROPERTIES
  ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV};WEFT_TRANSPORTS=shm;WEFT_MPI_MIN_BYTES=0"
  TIMEOUT 60
  PROCESSORS 3
  LABELS "mpi;pmpi;np3;shm")

# The drop-in preloaded into a program of the other MPI family (both
# installed here: Debian's mpicc.openmpi and mpicc.mpich): every rank ends
# with the reason, none gets past its first collective. Not in sanitizer
# builds (a sanitized library cannot be preloaded into a plain program).
if(NOT WEFT_SANITIZE AND NOT WEFT_SANITIZE_THREAD AND WEFT_MPI_FLAVOR MATCHES "^(openmpi|mpich)$")
  if(WEFT_MPI_FLAVOR STREQUAL "openmpi")
    set(_other mpich)
    find_program(WEFT_OTHER_MPICC mpicc.mpich)
    find_program(WEFT_OTHER_LAUNCHER mpiexec.mpich)
  else()
    set(_other openmpi)
    find_program(WEFT_OTHER_MPICC mpicc.openmpi)
    find_program(WEFT_OTHER_LAUNCHER mpirun.openmpi)
  endif()
  if(WEFT_OTHER_MPICC AND WEFT_OTHER_LAUNCHER)
    add_test(NAME pmpi_wrong_mpi
      COMMAND ${CMAKE_CURRENT_LIST_DIR}/pmpi_wrong_mpi.sh $<TARGET_FILE:weft_mpi> ${WEFT_OTHER_MPICC}
              ${WEFT_OTHER_LAUNCHER} ${_other})
    set_tests_properties(pmpi_wrong_mpi PROPERTIES
      ENVIRONMENT "${WEFT_MPI_TEST_COMMON_ENV}" TIMEOUT 120 PROCESSORS 2 LABELS "mpi;pmpi;mpich;np2")
  else()
    message(STATUS "weft: pmpi_wrong_mpi not registered (no ${_other} compiler wrapper and launcher found)")
  endif()
endif()
