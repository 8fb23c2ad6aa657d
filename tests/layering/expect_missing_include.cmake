# Runs one layering probe: compiles PROBE (-fsyntax-only) with COMPILER against the include
# folder INCLUDE_DIR and passes only when the compile fails because the one header the probe
# includes is not found there, although it exists in the tree (under one of the folders in
# SOURCE_DIRS, a ';'-separated list). Any other compile error (a typo in the probe, a header
# that is named wrongly, a broken flag) fails the test instead of passing it as WILL_FAIL would.
#   cmake -DCOMPILER=... -DINCLUDE_DIR=... -DPROBE=... -DSOURCE_DIRS=... -P expect_missing_include.cmake
file(STRINGS "${PROBE}" includes REGEX "^#include \"[^\"]+\"")
list(LENGTH includes count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "${PROBE}: a failing probe includes exactly one header, found ${count}")
endif()
string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${includes}")

set(found FALSE)
foreach(dir ${SOURCE_DIRS})
  if(EXISTS "${dir}/${header}")
    set(found TRUE)
  endif()
endforeach()
if(NOT found)
  message(FATAL_ERROR "${PROBE}: ${header} is in none of ${SOURCE_DIRS}; the probe must name "
                      "a real header of the layer it must not see")
endif()

execute_process(COMMAND "${COMPILER}" -std=c++20 -fsyntax-only -x c++ "-I${INCLUDE_DIR}" "${PROBE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${PROBE} compiled: ${header} is visible from ${INCLUDE_DIR}")
endif()
string(REPLACE "." "\\." header_re "${header}")
# GCC: "fatal error: a/b.h: No such file or directory"; clang: "fatal error: 'a/b.h' file not
# found".
if(NOT out MATCHES "fatal error: '?${header_re}'?(: No such file or directory| file not found)")
  message(FATAL_ERROR "${PROBE} failed to compile, but not because ${header} is missing:\n${out}")
endif()
message(STATUS "${PROBE}: ${header} is not visible, as required")
