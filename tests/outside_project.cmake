# ctest outside_project_example (cmake -P): what a new user does, from `cmake --install` to the example's
# output. Installs this build into a fresh prefix, checks `gradscale --version` and the package version,
# builds experiments/examples against the prefix only, runs both examples for a few steps (the residual one
# also saved and resumed) and checks their printout and traces (gradscale inspect --check). It checks what
# the package passes on (no -march/-ffp-contract, no generic include path, no CUDA), builds the examples
# with CUDA made unfindable, builds a consumer of the `cuda` component, and one of the `mpi` component
# (run under mpirun -np 2 when the installation has it).
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

# What the package passes on to a consumer: its include root only (no include/gradscale/internal), no
# CPU or floating-point flags, and nothing of CUDA unless the consumer asks for the cuda component.
file(READ ${prefix}/lib/cmake/gradscale/gradscaleTargets.cmake targets)
foreach(forbidden "-march=native" "-ffp-contract" "gradscale/internal" "CUDA::" "GRADSCALE_HAS_CUDA")
  string(FIND "${targets}" "${forbidden}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "gradscale::gradscale passes '${forbidden}' on to its consumers:\n${targets}")
  endif()
endforeach()
file(GLOB_RECURSE generic_includes ${prefix}/include/gradscale/*.h)
foreach(h ${generic_includes})
  file(STRINGS ${h} lines REGEX "^#include \"lib/")
  if(lines)
    message(FATAL_ERROR "${h} includes a generic \"lib/...\" path: ${lines}")
  endif()
endforeach()

# Only the prefix: no source or build tree of gradscale on any path the example sees. CUDA is made
# unfindable: a CPU-only consumer configures, builds and links without it.
run_step("configure the example"
         ${CMAKE_COMMAND} -S ${GS_SOURCE_DIR}/experiments/examples -B ${GS_WORK_DIR}/build
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${GS_CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
expect("gradscale ${GS_VERSION}" "${step_output}" "find_package(gradscale) sets gradscale_VERSION")
run_step("build the example" ${CMAKE_COMMAND} --build ${GS_WORK_DIR}/build -j 2)

run_step("run the example" ${GS_WORK_DIR}/build/residual_fashion_mnist --steps 20 --threads 1
         --trace ${GS_WORK_DIR}/trace --save ${GS_WORK_DIR}/checkpoint)
message("${step_output}")
foreach(line "gradscale ${GS_VERSION}, data: " "step   20  loss " "test accuracy " "per-layer scales of the last step"
             "block.conv2" "block.add")
  expect("${line}" "${step_output}" "the example's output")
endforeach()
# Its trace is a valid gradscale.trace/1 for the installed CLI.
foreach(file trace.json trace.jsonl)
  run_step("gradscale inspect --check ${file}" ${prefix}/bin/gradscale inspect --check ${GS_WORK_DIR}/${file})
  expect("ok: " "${step_output}" "gradscale inspect --check ${file}")
endforeach()
run_step("run the README's example" ${GS_WORK_DIR}/build/minimal_loop 50)
message("${step_output}")
foreach(line "step 50  loss " "res s " "fc  s ")
  expect("${line}" "${step_output}" "the README example's output")
endforeach()

# Resume the saved run for 5 more steps: the checkpoint and the trace continue.
run_step("resume the example" ${GS_WORK_DIR}/build/residual_fashion_mnist --steps 25 --threads 1
         --trace ${GS_WORK_DIR}/trace --resume ${GS_WORK_DIR}/checkpoint)
expect("resumed from ${GS_WORK_DIR}/checkpoint at step 20" "${step_output}" "the resumed example")
expect("step   25  loss " "${step_output}" "the resumed example")
run_step("gradscale inspect --check the resumed trace" ${prefix}/bin/gradscale inspect --check ${GS_WORK_DIR}/trace.json)
expect("ok: " "${step_output}" "gradscale inspect --check of the resumed trace")
file(READ ${GS_WORK_DIR}/trace.json trace)
string(JSON steps GET "${trace}" summary steps)
if(NOT steps EQUAL 25)
  message(FATAL_ERROR "the resumed trace's summary has ${steps} steps, expected 25")
endif()

# A consumer of the package's optional COMPONENT: its CMakeLists asks for the component and links
# gradscale::COMPONENT where found (gradscale::gradscale otherwise) into the executable EXE built from
# MAIN_TEXT; configured against the prefix only, checked to find the component exactly when the
# installation has it (HAS: the index string(FIND) gave, -1 when not), and built.
function(build_consumer component exe main_text has)
  set(dir ${GS_WORK_DIR}/${component}_consumer)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/CMakeLists.txt
       "cmake_minimum_required(VERSION 3.20)\nproject(${component}_consumer LANGUAGES CXX)\n"
       "find_package(gradscale 0.1 CONFIG REQUIRED OPTIONAL_COMPONENTS ${component})\n"
       "add_executable(${exe} main.cpp)\n"
       "if(gradscale_${component}_FOUND)\n  target_link_libraries(${exe} PRIVATE gradscale::${component})\n"
       "else()\n  target_link_libraries(${exe} PRIVATE gradscale::gradscale)\nendif()\n"
       "message(STATUS \"${component} component found: \${gradscale_${component}_FOUND}\")\n")
  file(WRITE ${dir}/main.cpp "${main_text}")
  run_step("configure a consumer of the ${component} component"
           ${CMAKE_COMMAND} -S ${dir} -B ${dir}/build
           -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${GS_CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
  if(has EQUAL -1)
    expect("${component} component found: FALSE" "${step_output}" "an installation without ${component}")
  else()
    expect("${component} component found: TRUE" "${step_output}" "an installation with ${component}")
  endif()
  run_step("build the consumer of the ${component} component" ${CMAKE_COMMAND} --build ${dir}/build)
endfunction()

# The cuda component, when this installation has it: a consumer that asks for it gets gradscale::cuda,
# and make_backend("cuda") is then linked in; the CPU-only example above is not.
file(READ ${prefix}/lib/cmake/gradscale/gradscaleConfig.cmake config)
string(FIND "${config}" "set(gradscale_HAS_CUDA ON)" has_cuda)
string(CONCAT main_text "#include <gradscale/gradscale.h>\n#include <cstdio>\n"
       "int main() { std::printf(\"cuda backend linked: %d\\n\", gradscale::cuda_backend_built() ? 1 : 0); }\n")
build_consumer(cuda backend_built "${main_text}" ${has_cuda})
run_step("run the consumer of the cuda component" ${GS_WORK_DIR}/cuda_consumer/build/backend_built)
if(has_cuda EQUAL -1)
  expect("cuda backend linked: 0" "${step_output}" "a program without gradscale::cuda")
else()
  expect("cuda backend linked: 1" "${step_output}" "a program with gradscale::cuda")
endif()

# The mpi component, when this installation has it: a consumer that asks for it gets gradscale::mpi
# (make_mpi_communicator, GRADSCALE_MPI defined); run under `mpirun -np 2`, each rank sums a 1 over
# the ranks through the installed communicator. Without it the consumer builds on LocalCommunicator.
string(FIND "${config}" "set(gradscale_HAS_MPI ON)" has_mpi)
string(CONCAT main_text
       "#include <gradscale/gradscale.h>\n#include <cstdint>\n#include <cstdio>\n#include <memory>\n"
       "int main() {\n#if defined(GRADSCALE_MPI)\n"
       "  std::unique_ptr<gradscale::Communicator> comm = gradscale::make_mpi_communicator(60);\n"
       "#else\n  std::unique_ptr<gradscale::Communicator> comm = std::make_unique<gradscale::LocalCommunicator>();\n"
       "#endif\n  std::uint64_t one = 1;\n  comm->all_reduce_sum(&one, 1);\n"
       "  std::printf(\"%s rank %d of %d: sum %llu\\n\", comm->backend().c_str(), comm->rank(), comm->size(),\n"
       "              static_cast<unsigned long long>(one));\n}\n")
build_consumer(mpi ranks "${main_text}" ${has_mpi})
find_program(GS_MPIRUN mpirun)
if(has_mpi EQUAL -1)
  run_step("run the consumer of the mpi component" ${GS_WORK_DIR}/mpi_consumer/build/ranks)
  expect("local rank 0 of 1: sum 1" "${step_output}" "a program without gradscale::mpi")
elseif(GS_MPIRUN)
  # As tests/test_distributed_mpirun.cpp starts ranks on this machine: more ranks than cores, root allowed.
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(as_root)
  if(uid STREQUAL "0")
    set(as_root --allow-run-as-root)
  endif()
  run_step("run the consumer of the mpi component under mpirun -np 2"
           ${CMAKE_COMMAND} -E env OMPI_MCA_btl_vader_single_copy_mechanism=none
           ${GS_MPIRUN} --oversubscribe ${as_root} -np 2 ${GS_WORK_DIR}/mpi_consumer/build/ranks)
  expect("mpi rank 0 of 2: sum 2" "${step_output}" "rank 0 of the mpi consumer")
  expect("mpi rank 1 of 2: sum 2" "${step_output}" "rank 1 of the mpi consumer")
else()
  message(STATUS "mpi consumer built; not run: no mpirun on this machine")
endif()
