# Decides MXQ_WITH_CUDA from MXQ_CUDA (ON/OFF/AUTO) and sets the Hopper code generation.
set(MXQ_WITH_CUDA OFF)
set(MXQ_CUDA_ARCH_NAME "")
if(NOT MXQ_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90a: wgmma and setmaxnreg need the architecture-specific target.
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (CUDA_STANDARD 20), so pass it directly.
    string(APPEND CMAKE_CUDA_FLAGS
           " -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr")
    find_package(CUDAToolkit REQUIRED)
    set(MXQ_WITH_CUDA ON)
    set(MXQ_CUDA_ARCH_NAME "sm_90a")
  elseif(MXQ_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MXQ_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER or PATH)")
  endif()
endif()
message(STATUS "mxq: CUDA kernels ${MXQ_WITH_CUDA} ${MXQ_CUDA_ARCH_NAME}")
