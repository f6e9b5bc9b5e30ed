// A user-facing error in a task spec: where it is and what is wrong.
#pragma once

#include <string>

namespace maxkernel::config {

struct spec_error {
  std::string file;
  int line = 0;     // 1-based; 0 when the error has no position
  int column = 0;   // 1-based; 0 when unknown
  std::string field;  // path of the field, like `inputs[1].dtype`
  std::string message;
  bool too_large = false;  // the task would not fit in memory (still exit code 2)

  // "FILE:LINE:COLUMN: FIELD: MESSAGE"; parts that are unknown are left out.
  std::string what() const;
};

}  // namespace maxkernel::config
