# The unity build (-DCMAKE_UNITY_BUILD=ON; scripts/demo.sh uses it): the sources of the library, the
# ablation runner and the CLI are compiled one folder at a time (each folder's .cpp files one translation
# unit), so Eigen's and nlohmann/json's headers are parsed and their templates instantiated once per
# folder instead of once per file (lib/layers' 11 files: 22 s of CPU time instead of 72 s). A source
# that defines a file-local name (in an anonymous namespace) which a source of the same folder also
# defines cannot share its folder's unit and is compiled on its own: the list below (with one that would
# warn there). A new collision fails that folder's compile with "redefinition of ..."; scripts/demo.sh
# then says so and builds file by file.
set(GS_UNITY_SEPARATE
    adaptive/adaptive_scaler.cpp         # kInf, as adaptive_config.cpp
    lib/core/file_read.cpp               # a member of a file-local type (GCC's -Wsubobject-linkage
                                         # outside the main file)
    lib/numeric/quantize_fp8.cpp         # kInf, to_bits, ..., as quantize.cpp
    lib/optim/lr_schedule.cpp            # kInf, as adam.cpp
    lib/optim/sgd.cpp                    # kWeightDecayRange, as adam.cpp
    experiments/cli/cmd_replay.cpp       # kUsage, as cmd_inspect.cpp
    experiments/cli/trace_schema.cpp)    # shown, as cmd_train.cpp
# gs_unity_by_folder(target root): target's sources (under root) compiled one folder at a
# time, but for those in GS_UNITY_SEPARATE. Used by the main build under CMAKE_UNITY_BUILD (below) and,
# always, by the fuzz build (tests/fuzz), whose sanitized copy of the library only replays corpora.
function(gs_unity_by_folder target root)
  set(separate ${GS_UNITY_SEPARATE})
  list(TRANSFORM separate PREPEND "${root}/")
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  get_target_property(sources ${target} SOURCES)
  foreach(source IN LISTS sources)
    get_filename_component(source "${source}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(source IN_LIST separate)
      continue()  # no group: compiled on its own
    endif()
    get_filename_component(folder "${source}" DIRECTORY)
    file(RELATIVE_PATH folder "${root}" "${folder}")
    string(REPLACE "/" "_" folder "${folder}")
    set_source_files_properties("${source}" PROPERTIES UNITY_GROUP "${folder}")
  endforeach()
endfunction()

if(CMAKE_UNITY_BUILD)
  foreach(target gradscale_lib gradscale_experiments gradscale)
    if(TARGET ${target})
      gs_unity_by_folder(${target} "${PROJECT_SOURCE_DIR}")
    endif()
  endforeach()
endif()
