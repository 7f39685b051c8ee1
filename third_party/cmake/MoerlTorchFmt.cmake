# pip LibTorch 2.x bundles its own fmt headers (fmt 12 in torch 2.15) in its
# include directory. That directory comes before /usr/include on every compile
# line, so <fmt/...> would resolve to LibTorch's fmt instead of the fmt that
# spdlog was built against (Debian: fmt 9), and spdlog's headers fail to
# compile. This puts a directory holding only spdlog's fmt ahead of LibTorch's
# headers on moerl_flags, which every moerl target links first. LibTorch keeps
# its own fmt compiled into its libraries (a different inline namespace), so
# the two do not clash at link time. With Debian's LibTorch (prefix /usr) both
# are the same directory and nothing is done.
if(TARGET fmt::fmt AND DEFINED TORCH_INSTALL_PREFIX AND EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt")
  get_target_property(_moerl_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  find_path(MOERL_SPDLOG_FMT_INCLUDE fmt/core.h PATHS ${_moerl_fmt_includes} NO_DEFAULT_PATH)
  if(NOT MOERL_SPDLOG_FMT_INCLUDE)
    message(FATAL_ERROR "LibTorch at ${TORCH_INSTALL_PREFIX} has fmt headers that could shadow "
                        "spdlog's fmt, and fmt/core.h was not found in fmt::fmt's include "
                        "directories (${_moerl_fmt_includes})")
  endif()
  file(REAL_PATH "${TORCH_INSTALL_PREFIX}/include/fmt" _moerl_torch_fmt)
  file(REAL_PATH "${MOERL_SPDLOG_FMT_INCLUDE}/fmt" _moerl_spdlog_fmt)
  if(NOT _moerl_torch_fmt STREQUAL _moerl_spdlog_fmt)
    set(_moerl_fmt_shim "${CMAKE_BINARY_DIR}/moerl_spdlog_fmt")
    file(MAKE_DIRECTORY "${_moerl_fmt_shim}")
    file(CREATE_LINK "${_moerl_spdlog_fmt}" "${_moerl_fmt_shim}/fmt" SYMBOLIC)
    target_include_directories(moerl_flags SYSTEM BEFORE INTERFACE "${_moerl_fmt_shim}")
    message(STATUS "moerl: spdlog's fmt (${_moerl_spdlog_fmt}) ahead of LibTorch's bundled fmt")
  endif()
endif()
