#include "messages/error.hpp"

#include <caf/message.hpp>
#include <caf/make_message.hpp>

namespace maxkernel::messages {

const char* to_string(error_code code) {
  switch (code) {
    case error_code::none: return "none";
    case error_code::bad_input: return "bad input";
    case error_code::too_large: return "too large";
    case error_code::malformed_message: return "malformed message";
    case error_code::worker_unavailable: return "worker unavailable";
    case error_code::worker_timeout: return "worker timeout";
    case error_code::worker_crashed: return "worker crashed";
    case error_code::internal: return "internal error";
    case error_code::overloaded: return "overloaded";
    case error_code::service_unavailable: return "service unavailable";
  }
  return "unknown";
}

int exit_code_for(error_code code) {
  switch (code) {
    case error_code::bad_input:
    case error_code::too_large:
      return 2;
    case error_code::none:
      return 0;
    default:
      return 3;
  }
}

caf::error make_error(error_code code, std::string message) {
  return caf::error(static_cast<uint8_t>(code), error_category,
                    caf::make_message(std::move(message)));
}

caf::error make_error(error_code code) {
  return caf::error(static_cast<uint8_t>(code), error_category);
}

error_code code_of(const caf::error& err) {
  if (!err)
    return error_code::none;
  if (err.category() != error_category)
    return error_code::internal;
  return static_cast<error_code>(err.code());
}

std::string message_of(const caf::error& err) {
  if (!err)
    return {};
  const auto& ctx = err.context();
  if (err.category() == error_category && ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return caf::to_string(err);
}

}  // namespace maxkernel::messages
