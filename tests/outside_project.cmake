# ctest outside_project_example (cmake -P): what a new user does, from `cmake --install` to the example's
# output. Installs this build into a fresh prefix, checks `gradscale --version` and the package version,
# builds experiments/examples against the prefix only, runs both examples for a few steps and checks their
# printout and the trace.
# Inputs: GS_BUILD_DIR, GS_SOURCE_DIR, GS_WORK_DIR, GS_VERSION, GS_CXX_COMPILER.
cmake_minimum_required(VERSION 3.20)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect text haystack what)
  string(FIND "${haystack}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: expected to find '${text}' in:\n${haystack}")
  endif()
endfunction()

set(prefix ${GS_WORK_DIR}/prefix)
file(REMOVE_RECURSE ${GS_WORK_DIR})

run_step("cmake --install" ${CMAKE_COMMAND} --install ${GS_BUILD_DIR} --prefix ${prefix})
foreach(f include/gradscale/gradscale.h include/gradscale/version.h lib/libgradscale.a
          lib/cmake/gradscale/gradscaleConfig.cmake lib/cmake/gradscale/gradscaleConfigVersion.cmake
          lib/cmake/gradscale/gradscaleTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

run_step("gradscale --version" ${prefix}/bin/gradscale --version)
expect("gradscale ${GS_VERSION}" "${step_output}" "gradscale --version")

# Only the prefix: no source or build tree of gradscale on any path the example sees.
run_step("configure the example"
         ${CMAKE_COMMAND} -S ${GS_SOURCE_DIR}/experiments/examples -B ${GS_WORK_DIR}/build
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${GS_CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
expect("gradscale ${GS_VERSION}" "${step_output}" "find_package(gradscale) sets gradscale_VERSION")
run_step("build the example" ${CMAKE_COMMAND} --build ${GS_WORK_DIR}/build -j 2)

run_step("run the example"
         ${GS_WORK_DIR}/build/residual_fashion_mnist --steps 20 --threads 1 --trace ${GS_WORK_DIR}/trace)
message("${step_output}")
foreach(line "gradscale ${GS_VERSION}, data: " "step   20  loss " "test accuracy " "per-layer scales of the last step"
             "block.conv2" "block.add")
  expect("${line}" "${step_output}" "the example's output")
endforeach()
run_step("run the README's example" ${GS_WORK_DIR}/build/minimal_loop 50)
message("${step_output}")
foreach(line "step 50  loss " "res s " "fc  s ")
  expect("${line}" "${step_output}" "the README example's output")
endforeach()

file(READ ${GS_WORK_DIR}/trace.json trace)
string(JSON schema GET "${trace}" schema)
string(JSON steps GET "${trace}" summary steps)
if(NOT schema STREQUAL "gradscale.trace/1" OR NOT steps EQUAL 20)
  message(FATAL_ERROR "the example's trace has schema '${schema}' and ${steps} steps")
endif()
