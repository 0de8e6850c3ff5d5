# Multi-host tests: two ranks on two network namespaces joined by veth and a
# bridge (scripts/netns-hosts), launched by mpirun through a namespace-aware
# rsh agent (scripts/netns-run). The ranks are on different nodes as MPI and
# weft see it, so only TCP connects them; WEFT_TRANSPORTS is left unset.
#
#   include(${PROJECT_SOURCE_DIR}/mpi_tests/multihost.cmake)
#   weft_add_multihost_test(NAME BINARY [ARGS...])
#
# BINARY is a target name or a path. The test is labelled "multihost", is
# skipped (not failed) where namespaces cannot be created (not root, no
# iproute2, a container without the capability), and shares one set-up: the
# namespaces are created by the first test that needs them and removed by the
# fixture cleanup test after the last one.

set(WEFT_NETNS_RUN ${CMAKE_CURRENT_LIST_DIR}/../scripts/netns-run)
get_filename_component(WEFT_NETNS_RUN ${WEFT_NETNS_RUN} ABSOLUTE)
get_filename_component(WEFT_NETNS_HOSTS ${CMAKE_CURRENT_LIST_DIR}/../scripts/netns-hosts ABSOLUTE)
# Seconds one multi-host test may take; mpirun ends the job a little sooner so
# the failure comes with its own message rather than a kill by ctest.
set(WEFT_MULTIHOST_TIMEOUT 300 CACHE STRING "Timeout (s) of each multi-host test")

if(NOT TEST weft_netns_down)
  add_test(NAME weft_netns_down COMMAND ${WEFT_NETNS_HOSTS} down)
  set_tests_properties(weft_netns_down PROPERTIES
    FIXTURES_CLEANUP weft_netns LABELS multihost RESOURCE_LOCK weft_netns)
endif()

function(weft_add_multihost_test)
  # Keyword form: NAME n BINARY b [GTEST_FILTER f] [TIMEOUT s] [ARGS a...] [ENV V=x...]
  # Positional form: name binary [args...]
  cmake_parse_arguments(M "" "NAME;BINARY;GTEST_FILTER;TIMEOUT" "ARGS;ENV;LABELS" ${ARGN})
  if(NOT M_NAME)
    list(POP_FRONT ARGN M_NAME M_BINARY)
    set(M_ARGS ${ARGN})
  endif()
  if(NOT M_NAME OR NOT M_BINARY)
    message(FATAL_ERROR "weft_add_multihost_test: NAME and BINARY are required")
  endif()
  if(NOT M_TIMEOUT)
    set(M_TIMEOUT ${WEFT_MULTIHOST_TIMEOUT})
  endif()
  if(TARGET ${M_BINARY})
    set(program $<TARGET_FILE:${M_BINARY}>)
  else()
    set(program ${M_BINARY})
  endif()
  set(args ${M_ARGS})
  if(M_GTEST_FILTER)
    list(APPEND args "--gtest_filter=${M_GTEST_FILTER}")
  endif()
  # mpirun ends the job (and says why) before ctest would kill it.
  math(EXPR mpirun_timeout "${M_TIMEOUT} - 15")
  add_test(NAME ${M_NAME} COMMAND ${WEFT_NETNS_RUN} ${program} ${args})
  set_tests_properties(${M_NAME} PROPERTIES
    LABELS "multihost;mpi;${M_LABELS}"
    SKIP_RETURN_CODE 77
    TIMEOUT ${M_TIMEOUT}
    FIXTURES_REQUIRED weft_netns
    # One multi-host job at a time: they share the namespaces and the CPUs.
    RESOURCE_LOCK weft_netns
    # A peer that stops answering fails the wait in a minute, as in mpi_tests.
    ENVIRONMENT "GTEST_COLOR=no;WEFT_TIMEOUT=60;WEFT_NETNS_TIMEOUT=${mpirun_timeout};${M_ENV}")
endfunction()
