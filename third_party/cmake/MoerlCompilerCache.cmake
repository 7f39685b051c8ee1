# Use ccache when it is installed. Precompiled headers are only cacheable with
# the sloppiness flags below (ccache documentation, "Precompiled headers").
find_program(MOERL_CCACHE ccache)
if(MOERL_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(_moerl_launcher ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} ${MOERL_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_moerl_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_moerl_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_moerl_launcher})
  message(STATUS "moerl: compiling through ccache (${MOERL_CCACHE})")
endif()
