# Writes OUT, a source file defining moh_build_commit(): the commit the binary is built from ("7a4de96", with
# "-dirty" when tracked files differ from it). Outside a git checkout (a copied working tree, as on the lent GPU
# machines) the environment's MOH_COMMIT if set, else "unknown".
# Run at every build (core/CMakeLists.txt); the file is rewritten only when the commit changes, so an unchanged
# commit recompiles nothing.
# usage: cmake -DSRC=<source dir> -DOUT=<file> -P commit_stamp.cmake
set(commit unknown)
if(DEFINED ENV{MOH_COMMIT} AND NOT "$ENV{MOH_COMMIT}" STREQUAL "")
  set(commit "$ENV{MOH_COMMIT}")
endif()
execute_process(COMMAND git -C "${SRC}" rev-parse --short=7 HEAD RESULT_VARIABLE rc OUTPUT_VARIABLE head
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(rc EQUAL 0 AND head)
  set(commit "${head}")
  execute_process(COMMAND git -C "${SRC}" diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "// Generated at build time by core/platform/commit_stamp.cmake.\nnamespace moh {\nconst char* moh_build_commit();\n\
const char* moh_build_commit() {\n  return \"${commit}\";\n}\n}  // namespace moh\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
