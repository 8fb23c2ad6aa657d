# The layering check must tell a probe that fails for the right reason from one that fails for
# another: runs expect_missing_include.cmake on the fixtures, each of which it must reject with
# its own reason, and on a real probe, which it must pass.
#   cmake -DCOMPILER=... -DLAYERS=build/<preset>/layers -DSOURCE_DIRS=... -P check_selftest.cmake
set(here "${CMAKE_CURRENT_LIST_DIR}")
function(check probe layer expect_rc expect_text)
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DCOMPILER=${COMPILER}"
                          "-DINCLUDE_DIR=${LAYERS}/${layer}" "-DPROBE=${probe}"
                          "-DSOURCE_DIRS=${SOURCE_DIRS}" -P "${here}/expect_missing_include.cmake"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    set(rc 0)
  else()
    set(rc 1)
  endif()
  # CMake wraps a message's lines at a width that depends on the paths in it: compared with its
  # runs of white space made one space.
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")
  if(NOT rc EQUAL expect_rc OR NOT flat MATCHES "${expect_text}")
    message(FATAL_ERROR "${probe}: expected exit ${expect_rc} saying '${expect_text}', got exit "
                        "${rc}:\n${out}")
  endif()
endfunction()
check("${here}/fixtures/misspelled_header.inc" graph 1 "is in none of")
check("${here}/fixtures/other_error.inc" graph 1 "but not because core/thread_pool.h is missing")
check("${here}/io_sees_graph.inc" io 0 "graph/graph.h is not visible, as required")
