# The unique-id bootstrap (weft_get_unique_id / weft_comm_init,
# src/comm/bootstrap_uid.c): its own tests (test_comm_init.cc), and the p2p,
# collectives and reductions suites re-run on comms made by weft_comm_init
# (WEFT_TEST_COMM=uid: weft_mpi_test.h's fixture makes every test's comm
# through a unique id, mpirun only launching the ranks). Included from
# mpi_tests/CMakeLists.txt, which defines weft_add_mpi_test_binary /
# weft_add_mpi_suite (collectives.cmake: WEFT_COLL_FILTER; reductions.cmake:
# weft_mpi_reductions, WEFT_RED_FILTER).
#
# Matrix, with seconds per entry measured on the 2-core machine under load
# 5.6 (other jobs running), plain build:
#   comm_init          CommInit.* np 1, 2, 4 shm; np 3 tcp, vnodes2 -- 2.2-2.4 s
#                      each (two ~0.9 s refused-connect retries inside)
#   comm_init_timeout  CommInitTimeout.* np 3 shm, WEFT_TIMEOUT=3 (a corrupted
#                      token, a rank that never joins: 3 s each) -- 6.6 s
#   p2p_uid            the p2p suite, np 4 shm, tcp, vnodes2 -- 3.5, 3.7, 3.4 s
#   coll_uid           the collectives suite, np 4 vnodes2 -- 4.8 s
#   reductions_uid     the reductions suite, np 3 shm -- 6.0 s
# comm_init_nompi (tests/CMakeLists.txt) takes 0.9 s. Under ASan/UBSan the
# comm_init entries take 3.4-9.7 s each.
#
# Label rerun: p2p_uid, coll_uid and reductions_uid move data through the same
# pipes, transports and algorithms as the entries on MPI-made comms; only the
# making differs, and the comm_init entries (traffic and destroy on uid comms
# included) cover that. CI (.ci/run) leaves rerun out of the ASan/UBSan pass
# (~30 s there); the -Werror pass runs them.
weft_add_mpi_test_binary(weft_mpi_comm_init test_comm_init.cc)
weft_add_mpi_suite(NAME comm_init BINARY weft_mpi_comm_init NPS 1 2 4 CONFIGS shm
                   GTEST_FILTER "CommInit.*" LABELS "comm;comm_init" TIMEOUT 120)
weft_add_mpi_suite(NAME comm_init BINARY weft_mpi_comm_init NPS 3 CONFIGS tcp vnodes2
                   GTEST_FILTER "CommInit.*" LABELS "comm;comm_init" TIMEOUT 120)
weft_add_mpi_suite(NAME comm_init_timeout BINARY weft_mpi_comm_init NPS 3 CONFIGS shm
                   GTEST_FILTER "CommInitTimeout.*" LABELS "comm;comm_init;sleepy" ENV WEFT_TIMEOUT=3 TIMEOUT 60)

weft_add_mpi_suite(NAME p2p_uid BINARY weft_mpi_p2p NPS 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER "-*Huge*" LABELS "p2p;comm_init;rerun" ENV WEFT_TEST_COMM=uid TIMEOUT 300)
if(TARGET weft_mpi_coll)
  weft_add_mpi_suite(NAME coll_uid BINARY weft_mpi_coll NPS 4 CONFIGS vnodes2
                     GTEST_FILTER ${WEFT_COLL_FILTER} LABELS "coll;comm_init;rerun" ENV WEFT_TEST_COMM=uid TIMEOUT 300)
endif()
if(TARGET weft_mpi_reductions)
  weft_add_mpi_suite(NAME reductions_uid BINARY weft_mpi_reductions NPS 3 CONFIGS shm
                     GTEST_FILTER "Reductions.*" LABELS "reductions;comm_init;rerun" ENV WEFT_TEST_COMM=uid TIMEOUT 300)
endif()
