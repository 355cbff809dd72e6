# The version and git revision that `momfmm --version` prints (docs/cli.md
# §5) and checkpoints record (docs/files.md §4), as compile definitions of
# src/base/build_info.c alone (src/CMakeLists.txt), so that a new revision
# recompiles one file. The revision is `git describe --always --dirty` at
# configure time ("unknown" outside a git checkout); a commit re-runs the
# configure step through logs/HEAD, a change to the working tree alone does not.
if(PROJECT_VERSION)
  set(MOMFMM_VERSION "${PROJECT_VERSION}")
else()
  set(MOMFMM_VERSION "0.0.0")
endif()
set(MOMFMM_GIT_REVISION "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} describe --always --dirty
                  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
                  OUTPUT_VARIABLE git_revision OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE git_status ERROR_QUIET)
  if(git_status EQUAL 0 AND git_revision)
    set(MOMFMM_GIT_REVISION "${git_revision}")
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --path-format=absolute --git-path logs/HEAD
                    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
                    OUTPUT_VARIABLE git_head_log OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(git_head_log AND EXISTS "${git_head_log}")
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${git_head_log}")
    endif()
  endif()
endif()
message(STATUS "momfmm ${MOMFMM_VERSION} (git ${MOMFMM_GIT_REVISION})")
