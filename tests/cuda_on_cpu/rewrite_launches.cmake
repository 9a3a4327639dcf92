# The CPU execution target of lib/cuda: the one change a .cu file needs to be C++. Copies IN to OUT with
# each launch `k<<<grid, block, shared, stream>>>(args)` spelled `k ^ ::gs_emu::Launch(grid, block,
# shared, stream)(args)` (kernel_shim.h runs it) and a #line that keeps IN's name and line numbers in
# diagnostics, AddressSanitizer reports and __FILE__. Run as: cmake -DIN=... -DOUT=... -P this file.
file(READ "${IN}" text)
string(REGEX MATCHALL "<<<" opens "${text}")
string(REGEX MATCHALL ">>>" closes "${text}")
list(LENGTH opens n_open)
list(LENGTH closes n_close)
if(NOT n_open EQUAL n_close)
  message(FATAL_ERROR "${IN}: ${n_open} '<<<' but ${n_close} '>>>': a launch the rewrite cannot pair")
endif()
string(REPLACE "<<<" " ^ ::gs_emu::Launch(" text "${text}")
string(REPLACE ">>>" ")" text "${text}")
set(text "#line 1 \"${IN}\"\n${text}")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
