# install_tree test (tests/CMakeLists.txt): `cmake --install BUILD_DIR --prefix
# PREFIX`, then the installed files exist, the installed binary initialises the
# quickstart model from the installed config, and an installed tool imports
# the installed momfmm package (tools/ find it at ../python).
#   cmake -DBUILD_DIR=... -DPREFIX=... -DPYTHON=... -P install_tree.cmake
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed: ${rc}")
endif()
set(share ${PREFIX}/share/momfmm)
foreach(f bin/momfmm share/momfmm/python/momfmm/__init__.py share/momfmm/python/momfmm/h5.py
          share/momfmm/tools/momfmm_plot.py share/momfmm/tools/momfmm_report.py
          share/momfmm/tools/run_experiments.sh share/momfmm/configs/quickstart.ini
          share/momfmm/configs/experiments/suite.list share/momfmm/jobs/train.sbatch share/momfmm/README.md)
  if(NOT EXISTS ${PREFIX}/${f})
    message(FATAL_ERROR "not installed: ${PREFIX}/${f}")
  endif()
endforeach()
execute_process(COMMAND ${PREFIX}/bin/momfmm init ${share}/configs/quickstart.ini --out ${PREFIX}/x.h5
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${PREFIX}/x.h5)
  message(FATAL_ERROR "installed momfmm init failed (${rc}): ${out} ${err}")
endif()
execute_process(COMMAND ${PYTHON} ${share}/tools/momfmm_report.py --help
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installed momfmm_report.py --help failed (${rc}): ${err}")
endif()
message(STATUS "install tree under ${PREFIX}: files present, momfmm init and momfmm_report.py run")
