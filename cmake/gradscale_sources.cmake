# The C++ sources of the gradscale library (lib/, adaptive/, baselines/, policies/; lib/cuda is added
# separately), in GS_LIB_SOURCES. One list for the main build and the fuzz build (tests/fuzz), which
# compile the same library with different compilers. GS_SOURCE_ROOT is the repository root.
file(GLOB_RECURSE GS_LIB_SOURCES CONFIGURE_DEPENDS
     ${GS_SOURCE_ROOT}/lib/*.cpp ${GS_SOURCE_ROOT}/adaptive/*.cpp ${GS_SOURCE_ROOT}/baselines/*.cpp
     ${GS_SOURCE_ROOT}/policies/*.cpp)
list(FILTER GS_LIB_SOURCES EXCLUDE REGEX ".*/lib/cuda/.*")
# The MPI backend of the communicator is its own library (gradscale_mpi), built when MPI is found.
list(FILTER GS_LIB_SOURCES EXCLUDE REGEX ".*/lib/dist/mpi_.*")
