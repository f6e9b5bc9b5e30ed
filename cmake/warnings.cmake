# Project-wide warning flags, applied per target with maxkernel_warnings(target).
function(maxkernel_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
