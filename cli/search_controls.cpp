#include "cli/search_controls.hpp"

namespace maxkernel::cli {

void search_controls::set(const std::string& id, search_controller controller) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (controller)
    controllers_[id] = std::move(controller);
  else
    controllers_.erase(id);
}

search_controller search_controls::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = controllers_.find(id);
  return it == controllers_.end() ? search_controller{} : it->second;
}

}  // namespace maxkernel::cli
