# ctest "docs_design": docs/design.md, section "Where things live", names
# every source file of the library (*.c, *.h, *.cu under src/, p2p/ and
# collectives/, subfolders included), and every file it names exists.
#
# How the section is read (the rule a new line must follow):
#  - a line outside code blocks that starts with a folder in backticks
#    (`src/core/`: ...) gives the folder of the next code block; a
#    `<name>/` in it is left out (`p2p/transport/<name>/`: the block's
#    names start with the transport's folder, shm/shm.c);
#  - in that code block, every line that does not start with a space names
#    one entry by its first word, relative to the folder; name.[ch] stands
#    for name.c and name.h; lines starting with a space continue the
#    description above them;
#  - a code block with no folder line since the previous block (the
#    "Outside the library" one) is not read.
# So p2p/transport/tcp/tcp_conn.c is named by the line
# "tcp/tcp_conn.c ..." in the block under `p2p/transport/<name>/`.
cmake_minimum_required(VERSION 3.18)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_docs_design: -DSOURCE_DIR=... is required")
endif()
file(READ ${SOURCE_DIR}/docs/design.md doc)

string(FIND "${doc}" "\n## Where things live\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "docs/design.md has no section \"## Where things live\"")
endif()
string(SUBSTRING "${doc}" ${start} -1 section)
string(SUBSTRING "${section}" 1 -1 section)   # past the newline, so the next "\n## " is the end
string(FIND "${section}" "\n## " end)
if(NOT end EQUAL -1)
  string(SUBSTRING "${section}" 0 ${end} section)
endif()

# One list item per line. ";" separates CMake list items and "[" "]" group
# them, so they are taken out of the text first.
string(REPLACE ";" "<sc>" section "${section}")
string(REPLACE "[" "<lb>" section "${section}")
string(REPLACE "]" "<rb>" section "${section}")
string(REPLACE "\\" "<bs>" section "${section}")
string(REPLACE "\n" ";" lines "${section}")

set(named "")
set(folder "")
set(block_folder "")
set(in_block 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^```")
    if(in_block)
      set(in_block 0)
    else()
      set(in_block 1)
      set(block_folder "${folder}")
      set(folder "")
    endif()
  elseif(in_block)
    if(block_folder AND line MATCHES "^([^ ]+)")
      set(entry "${CMAKE_MATCH_1}")
      if(entry MATCHES "^(.*)\\.<lb>ch<rb>$")
        list(APPEND named "${block_folder}${CMAKE_MATCH_1}.c" "${block_folder}${CMAKE_MATCH_1}.h")
      else()
        list(APPEND named "${block_folder}${entry}")
      endif()
    endif()
  elseif(line MATCHES "^`([^`]+/)`")
    string(REPLACE "<name>/" "" folder "${CMAKE_MATCH_1}")
  endif()
endforeach()
if(NOT named)
  message(FATAL_ERROR "found no file names in docs/design.md \"Where things live\"; the parser is out of date")
endif()

file(GLOB_RECURSE lib RELATIVE ${SOURCE_DIR}
  ${SOURCE_DIR}/src/*.c ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cu
  ${SOURCE_DIR}/p2p/*.c ${SOURCE_DIR}/p2p/*.h ${SOURCE_DIR}/p2p/*.cu
  ${SOURCE_DIR}/collectives/*.c ${SOURCE_DIR}/collectives/*.h ${SOURCE_DIR}/collectives/*.cu)
list(SORT lib)
if(NOT lib)
  message(FATAL_ERROR "found no library sources under ${SOURCE_DIR}")
endif()

set(missing "")
foreach(f IN LISTS lib)
  if(NOT f IN_LIST named)
    list(APPEND missing ${f})
  endif()
endforeach()
set(stale "")
foreach(n IN LISTS named)
  if(NOT EXISTS ${SOURCE_DIR}/${n})
    list(APPEND stale ${n})
  endif()
endforeach()

set(problems "")
if(missing)
  list(JOIN missing "\n  " m)
  string(APPEND problems "library files that docs/design.md, \"Where things live\", does not name "
                         "(add a line under their folder):\n  ${m}\n")
endif()
if(stale)
  list(JOIN stale "\n  " s)
  string(APPEND problems "files docs/design.md, \"Where things live\", names that do not exist "
                         "(moved or removed?):\n  ${s}\n")
endif()
if(problems)
  message(FATAL_ERROR "${problems}")
endif()
list(LENGTH lib n)
message(STATUS "docs/design.md \"Where things live\" names all ${n} library source files")
