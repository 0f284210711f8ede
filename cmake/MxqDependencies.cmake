# Finds mxq's C++ dependencies: Debian's -dev packages, or the folder that
# scripts/stage_deps.sh fills (MXQ_DEPS_DIR) on machines without them.
find_package(Threads REQUIRED)

if(EXISTS "${MXQ_DEPS_DIR}")
  list(PREPEND CMAKE_PREFIX_PATH "${MXQ_DEPS_DIR}")
  message(STATUS "mxq: using staged dependencies in ${MXQ_DEPS_DIR}")
endif()

# Header-only libraries: nlohmann/json and CLI11.
find_path(MXQ_JSON_INCLUDE nlohmann/json.hpp HINTS "${MXQ_DEPS_DIR}/include" REQUIRED)
add_library(mxq_json INTERFACE)
target_include_directories(mxq_json SYSTEM INTERFACE "${MXQ_JSON_INCLUDE}")

find_path(MXQ_CLI11_INCLUDE CLI/CLI.hpp HINTS "${MXQ_DEPS_DIR}/include" REQUIRED)
add_library(mxq_cli11 INTERFACE)
target_include_directories(mxq_cli11 SYSTEM INTERFACE "${MXQ_CLI11_INCLUDE}")

# GoogleTest is built from the source Debian's googletest package ships.
if(MXQ_BUILD_TESTS AND NOT TARGET GTest::gtest)
  find_path(MXQ_GTEST_SOURCE CMakeLists.txt
            HINTS "${MXQ_DEPS_DIR}/src/googletest" /usr/src/googletest NO_DEFAULT_PATH)
  if(NOT MXQ_GTEST_SOURCE)
    message(FATAL_ERROR "GoogleTest source not found: apt-get install googletest, "
                        "or run scripts/stage_deps.sh")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${MXQ_GTEST_SOURCE}" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
endif()

# Google Benchmark (optional): the bench/ drivers are built only when it is found.
if(MXQ_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()
