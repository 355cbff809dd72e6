# The GEMM engine (src/kernels/gemm.h; docs/scale.md §7): OpenBLAS always,
# oneDNN's fp32 and bf16 matmul when oneDNN is installed (Debian: libdnnl-dev).
#
# find_path/find_library rather than find_package(dnnl CONFIG): Debian's
# dnnl-config.cmake insists on the OpenCL headers of its GPU runtime, which
# the CPU-only C API here does not need. oneDNN's Debian build threads with
# OpenMP (libgomp), so gemm_onednn.c sets the OpenMP thread count itself and
# links libgomp for omp_set_num_threads, without compiling momfmm with
# -fopenmp.
option(MOMFMM_WITH_ONEDNN "Build the oneDNN GEMM engines (onednn-f32, onednn-bf16)" ON)
if(MOMFMM_WITH_ONEDNN)
  find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(DNNL_LIBRARY dnnl)
  find_package(OpenMP COMPONENTS C)
endif()
if(MOMFMM_WITH_ONEDNN AND DNNL_INCLUDE_DIR AND DNNL_LIBRARY AND OpenMP_C_FOUND)
  message(STATUS "oneDNN: ${DNNL_LIBRARY} (GEMM engines openblas, onednn-f32, onednn-bf16)")
  set(MOMFMM_HAVE_ONEDNN ON)
  target_sources(momfmm_core PRIVATE src/kernels/gemm_onednn.c)
  target_compile_definitions(momfmm_core PRIVATE MOMFMM_HAVE_ONEDNN)
  target_include_directories(momfmm_core PRIVATE ${DNNL_INCLUDE_DIR})
  target_link_libraries(momfmm_core PUBLIC ${DNNL_LIBRARY} ${OpenMP_C_LIBRARIES})
else()
  message(STATUS "oneDNN not found (or MOMFMM_WITH_ONEDNN=OFF): the bf16 path is left out; "
                 "the GEMM engine runs OpenBLAS only and reports onednn-f32/onednn-bf16 unavailable")
endif()

# GFLOP/s of the engines at the shapes of a config (tools/bench_gemm.c).
add_executable(bench_gemm tools/bench_gemm.c)
target_link_libraries(bench_gemm PRIVATE momfmm_core)
