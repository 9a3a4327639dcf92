# Stages the installed headers (run by `cmake --install`, see CMakeLists.txt): include/gradscale/*.h and
# lib/**/*.h (as gradscale/internal/lib/**), with every project include "lib/..." spelled from the include
# root, "gradscale/internal/lib/...". A consumer then needs only <prefix>/include on its include path,
# and a header of its own named "lib/..." cannot be taken for one of gradscale's.
# Inputs: GS_SOURCE_DIR, GS_STAGE_DIR (emptied first), GS_WITH_CUDA (stage lib/cuda's headers, which
# stop a build without CUDA), GS_WITH_MPI (stage lib/dist/mpi_communicator.h, which needs the MPI build).
file(REMOVE_RECURSE "${GS_STAGE_DIR}")
file(GLOB_RECURSE _gs_public RELATIVE "${GS_SOURCE_DIR}/include" "${GS_SOURCE_DIR}/include/gradscale/*.h")
file(GLOB_RECURSE _gs_internal RELATIVE "${GS_SOURCE_DIR}" "${GS_SOURCE_DIR}/lib/*.h")
if(NOT GS_WITH_CUDA)
  list(FILTER _gs_internal EXCLUDE REGEX "^lib/cuda/")
endif()
if(NOT GS_WITH_MPI)
  list(FILTER _gs_internal EXCLUDE REGEX "^lib/dist/mpi_communicator\\.h$")
endif()
set(_gs_pairs)
foreach(h IN LISTS _gs_public)
  list(APPEND _gs_pairs "${GS_SOURCE_DIR}/include/${h}|${h}")
endforeach()
foreach(h IN LISTS _gs_internal)
  list(APPEND _gs_pairs "${GS_SOURCE_DIR}/${h}|gradscale/internal/${h}")
endforeach()
foreach(pair IN LISTS _gs_pairs)
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 from)
  list(GET pair 1 to)
  file(READ "${from}" text)
  string(REPLACE "#include \"lib/" "#include \"gradscale/internal/lib/" text "${text}")
  file(WRITE "${GS_STAGE_DIR}/${to}" "${text}")
endforeach()
