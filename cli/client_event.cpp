#include "cli/client_event.hpp"

namespace maxkernel::cli {

std::optional<messages::decoded_message> read_client_event(const std::string& bytes,
                                                           std::string& error) {
  return messages::decode<schema::ClientEvent>(bytes, error);
}

}  // namespace maxkernel::cli
