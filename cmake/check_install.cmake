# ctest "install_consumer": install weft into a scratch prefix, then build and
# run the outside project tests/install twice, once through find_package(weft)
# and once through pkg-config, as a user of the installed library would.
cmake_minimum_required(VERSION 3.18)

foreach(v BUILD_DIR SOURCE_DIR WORK_DIR C_COMPILER GENERATOR LIBDIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_install: -D${v}=... is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# README's example must be the program that is built and run below.
file(READ ${SOURCE_DIR}/README.md readme)
file(READ ${SOURCE_DIR}/tests/install/ring.c ring)
string(FIND "${readme}" "```c\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no ```c example")
endif()
math(EXPR at "${at} + 5")
string(SUBSTRING "${readme}" ${at} -1 example)
string(FIND "${example}" "```" end)
string(SUBSTRING "${example}" 0 ${end} example)
string(FIND "${ring}" "${example}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "README.md's example differs from tests/install/ring.c; keep them identical")
endif()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

if(IS_ABSOLUTE "${LIBDIR}")
  message(FATAL_ERROR "CMAKE_INSTALL_LIBDIR is absolute (${LIBDIR}); this check needs a relocatable install")
endif()
set(libdir ${prefix}/${LIBDIR})
foreach(f include/weft.h ${LIBDIR}/libweft.a ${LIBDIR}/libweft.so ${LIBDIR}/libweft.so.0
          ${LIBDIR}/cmake/weft/weftConfig.cmake ${LIBDIR}/cmake/weft/weftConfigVersion.cmake
          ${LIBDIR}/cmake/weft/weftTargets.cmake ${LIBDIR}/pkgconfig/weft.pc)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

# weft_info, installed with the library, runs from the prefix as it is
# (libweft inside it; no LD_LIBRARY_PATH).
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/weft_info --version
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^weft [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "the installed bin/weft_info did not run (${rc}):\n${out}\n${err}")
endif()
message(STATUS "installed weft_info runs: ${out}")

set(extra_flags "")
if(SANITIZE)
  # An ASan-instrumented libweft.so needs the ASan runtime loaded first.
  set(extra_flags "-fsanitize=address,undefined")
  # The consumer is built as a user's program, without the test programs'
  # dlclose that keeps Open MPI's components mapped (cmake/asan_keep_dso.c):
  # LeakSanitizer needs the slow unwinder for its stacks to reach libmpi
  # and match scripts/lsan.supp.
  set(ENV{ASAN_OPTIONS} "$ENV{ASAN_OPTIONS}:fast_unwind_on_malloc=0")
endif()

# 1. find_package(weft): shared and static flavours.
set(cm_build ${WORK_DIR}/cmake-consumer)
run("configure consumer (find_package)" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install -B ${cm_build}
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    "-DCMAKE_C_FLAGS=${extra_flags}" "-DCMAKE_EXE_LINKER_FLAGS=${extra_flags}")
run("build consumer (find_package)" ${CMAKE_COMMAND} --build ${cm_build})
run("run consumer linked to weft::weft" ${cm_build}/weft_consumer)
run("run consumer linked to weft::weft_static" ${cm_build}/weft_consumer_static)
if(MPIEXEC)
  run("run README example (mpirun -np 2)" ${MPIEXEC} -np 2 ${cm_build}/weft_ring)
endif()

# The installed PMPI drop-in, preloaded as docs/mpi.md says, with no
# LD_LIBRARY_PATH: it finds libweft.so.0 through its RUNPATH ($ORIGIN), and
# serves the program's MPI_Allreduce (WEFT_MPI_MIN_BYTES=0; WEFT_DEBUG=info
# shows weft's lines). A drop-in the loader cannot load is only "ignored"
# by ld.so, so the run's output is what tells. (Not under the sanitizers:
# a plain program cannot preload an ASan-built library.)
if(MPIEXEC AND EXISTS ${libdir}/libweft_mpi.so AND NOT SANITIZE)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                  ${MPIEXEC} -np 2 -x LD_PRELOAD=${libdir}/libweft_mpi.so -x WEFT_MPI_MIN_BYTES=0 -x WEFT_DEBUG=info
                  ${cm_build}/weft_preload_probe RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "MPI_Allreduce over 2 ranks right")
    message(FATAL_ERROR "the plain MPI program with the installed drop-in preloaded failed (${rc}):\n${out}\n${err}")
  endif()
  if("${out}${err}" MATCHES "cannot be preloaded|cannot open shared object")
    message(FATAL_ERROR "the installed drop-in did not load:\n${out}\n${err}")
  endif()
  if(NOT "${out}${err}" MATCHES "weft\\[rank 0\\]")
    message(FATAL_ERROR "the installed drop-in loaded but weft never spoke (WEFT_DEBUG=info):\n${out}\n${err}")
  endif()
  message(STATUS "installed drop-in preloaded without LD_LIBRARY_PATH: ok")
endif()

# 2. pkg-config: compile by hand with the flags weft.pc gives.
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config was not found at configure time; cannot check weft.pc")
endif()
set(pc_env ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${libdir}/pkgconfig)
run("pkg-config --cflags --libs weft" ${pc_env} ${PKG_CONFIG} --cflags --libs weft)
string(STRIP "${run_output}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
separate_arguments(extra_list UNIX_COMMAND "${extra_flags}")
run("compile consumer (pkg-config)" ${C_COMPILER} ${extra_list} -o ${WORK_DIR}/weft_consumer_pc
    ${SOURCE_DIR}/tests/install/consumer.c ${pc_flags})
run("run consumer (pkg-config)" ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir}
    ${WORK_DIR}/weft_consumer_pc)
file(REMOVE_RECURSE ${WORK_DIR})
