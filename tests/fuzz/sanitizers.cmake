# MAXKERNEL_FUZZ: included by the top-level CMakeLists.txt before the code folders, so that
# every library a fuzz target links is instrumented for libFuzzer's coverage and checked by
# ASan and UBSan. Only when the compiler has libFuzzer (clang); otherwise a warning and no
# fuzz targets (MAXKERNEL_FUZZ_ENABLED stays off).
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
]] MAXKERNEL_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
if(MAXKERNEL_HAVE_LIBFUZZER)
  set(MAXKERNEL_FUZZ_ENABLED ON)
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined
                      -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
else()
  set(MAXKERNEL_FUZZ_ENABLED OFF)
  message(WARNING "MAXKERNEL_FUZZ: ${CMAKE_CXX_COMPILER} has no -fsanitize=fuzzer "
                  "(configure with clang++); no fuzz targets")
endif()
