# Decides MXQ_WITH_NCCL from MXQ_NCCL (ON/OFF/AUTO) when CUDA is built, and finds nccl.h and
# libnccl. Searched, in order: NCCL_ROOT (the CMake variable, else the environment variable; a
# folder with include/ and lib/ such as the pip wheel nvidia-nccl-cu13's site-packages/nvidia/nccl),
# the CUDA toolkit, then the system's default paths (Debian's libnccl-dev).
# Sets MXQ_NCCL_INCLUDE_DIR, MXQ_NCCL_LIBRARY (a full path: the wheel ships only libnccl.so.2,
# no libnccl.so symlink) and MXQ_NCCL_VERSION.
set(MXQ_NCCL "AUTO" CACHE STRING "Build the NCCL communicator: ON, OFF or AUTO (when found)")
set_property(CACHE MXQ_NCCL PROPERTY STRINGS AUTO ON OFF)
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL installation (include/nccl.h, lib/libnccl.so*)")

set(MXQ_WITH_NCCL OFF)
set(MXQ_NCCL_VERSION "")
set(mxq_nccl_why "")
if(MXQ_NCCL STREQUAL "OFF")
  set(mxq_nccl_why "MXQ_NCCL=OFF")
elseif(NOT MXQ_WITH_CUDA)
  set(mxq_nccl_why "CUDA is not built")
  if(MXQ_NCCL STREQUAL "ON")
    message(FATAL_ERROR "MXQ_NCCL=ON needs CUDA, but CUDA is not built (MXQ_CUDA=${MXQ_CUDA})")
  endif()
else()
  # A changed NCCL_ROOT searches again (find_* keep what they found in the cache).
  if(NOT "${NCCL_ROOT}" STREQUAL "${MXQ_NCCL_SEARCHED_ROOT}")
    unset(MXQ_NCCL_INCLUDE_DIR CACHE)
    unset(MXQ_NCCL_LIBRARY CACHE)
    set(MXQ_NCCL_SEARCHED_ROOT "${NCCL_ROOT}" CACHE INTERNAL "NCCL_ROOT of the last search")
  endif()
  # NCCL_ROOT alone when given: a root that lacks NCCL must not fall back silently to another
  # copy.
  if(NCCL_ROOT)
    find_path(MXQ_NCCL_INCLUDE_DIR nccl.h PATHS "${NCCL_ROOT}" PATH_SUFFIXES include
              NO_DEFAULT_PATH)
    find_library(MXQ_NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${NCCL_ROOT}"
                 PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  else()
    find_path(MXQ_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(MXQ_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS "${CUDAToolkit_LIBRARY_DIR}")
  endif()
  if(MXQ_NCCL_INCLUDE_DIR AND MXQ_NCCL_LIBRARY)
    file(STRINGS "${MXQ_NCCL_INCLUDE_DIR}/nccl.h" mxq_nccl_defines
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} +([0-9]+)" _ "${mxq_nccl_defines}")
      set(mxq_nccl_${part} "${CMAKE_MATCH_1}")
    endforeach()
    set(MXQ_NCCL_VERSION "${mxq_nccl_MAJOR}.${mxq_nccl_MINOR}.${mxq_nccl_PATCH}")
    set(MXQ_WITH_NCCL ON)
  else()
    set(mxq_nccl_why "nccl.h or libnccl not found")
    if(NCCL_ROOT)
      string(APPEND mxq_nccl_why " under NCCL_ROOT=${NCCL_ROOT}")
    else()
      string(APPEND mxq_nccl_why " in the CUDA toolkit or the system (set NCCL_ROOT)")
    endif()
    string(APPEND mxq_nccl_why ": header ${MXQ_NCCL_INCLUDE_DIR}, library ${MXQ_NCCL_LIBRARY}")
    if(MXQ_NCCL STREQUAL "ON")
      message(FATAL_ERROR "MXQ_NCCL=ON but NCCL was not found: ${mxq_nccl_why}")
    endif()
  endif()
endif()
if(MXQ_WITH_NCCL)
  message(STATUS "mxq: NCCL ${MXQ_NCCL_VERSION} (${MXQ_NCCL_LIBRARY}, ${MXQ_NCCL_INCLUDE_DIR})")
else()
  message(STATUS "mxq: NCCL OFF (${mxq_nccl_why}): no NCCL communicator in this build")
endif()
