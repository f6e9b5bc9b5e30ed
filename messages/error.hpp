// The project's error codes. They cross actor boundaries as caf::error (category
// "maxkernel"), never as exceptions.
#pragma once

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include <cstdint>
#include <string>

namespace maxkernel::messages {

enum class error_code : uint8_t {
  none = 0,
  bad_input,          // spec, config or command line is invalid (exit code 2)
  too_large,          // the task cannot fit in memory (exit code 2)
  malformed_message,  // a payload that does not decode
  worker_unavailable, // the JAX worker cannot start or keeps dying (exit code 3)
  worker_timeout,     // a request passed its deadline
  worker_crashed,     // the worker died while serving a request
  internal,           // a bug (exit code 3)
  overloaded,         // the node's queue is full: retry elsewhere or later
  service_unavailable,// a remote service (an LLM endpoint) cannot be reached or never
                      // answered usably within its retries (exit code 3)
};

const char* to_string(error_code code);

// Exit code of a command that failed with this error (ARCHITECTURE.md, "Contracts").
int exit_code_for(error_code code);

caf::error make_error(error_code code, std::string message);
caf::error make_error(error_code code);

// The category atom used in caf::error.
constexpr caf::atom_value error_category = caf::atom("maxkernel");

// Reads our code back from a caf::error; internal for errors of other categories.
error_code code_of(const caf::error& err);
std::string message_of(const caf::error& err);

}  // namespace maxkernel::messages
