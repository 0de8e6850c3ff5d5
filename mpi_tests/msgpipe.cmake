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
