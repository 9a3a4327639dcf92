# A build directory whose path holds ' (as /home/o'brien/...): nvcc would mis-quote it, so the configure
# leaves the CUDA backend out with a warning (GRADSCALE_CUDA=AUTO) or stops with the reason (ON), before
# anything is compiled. Run by ctest as `cmake -P` with GS_SOURCE_DIR and GS_WORK_DIR.
set(build "${GS_WORK_DIR}/build of o'brien")
file(REMOVE_RECURSE "${GS_WORK_DIR}")
foreach(mode AUTO ON)
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${GS_SOURCE_DIR}" -B "${build}-${mode}" -DGRADSCALE_CUDA=${mode}
                          -DGRADSCALE_PYTHON=OFF -DGRADSCALE_INSTALL=OFF -DGRADSCALE_TESTS=OFF
                          -DGRADSCALE_CLI=OFF
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \n]+" " " text "${out}${err}")
  if(mode STREQUAL "AUTO" AND NOT (status EQUAL 0 AND text MATCHES "CUDA backend left out: the path"
                                   AND text MATCHES "CUDA backend OFF"))
    message(FATAL_ERROR "GRADSCALE_CUDA=AUTO in '${build}-AUTO': expected a configure without CUDA and the "
                        "reason, got status ${status}:\n${out}${err}")
  endif()
  if(mode STREQUAL "ON" AND (status EQUAL 0 OR NOT text MATCHES "mis-quotes"))
    message(FATAL_ERROR "GRADSCALE_CUDA=ON in '${build}-ON': expected the configure to stop with the reason, "
                        "got status ${status}:\n${out}${err}")
  endif()
endforeach()
file(REMOVE_RECURSE "${GS_WORK_DIR}")
message(STATUS "a build path with ' configures without CUDA (AUTO) and stops with the reason (ON)")
