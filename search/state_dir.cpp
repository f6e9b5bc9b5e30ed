#include "search/state_dir.hpp"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace maxkernel::search {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string home_dir() {
  std::string home = env("HOME");
  if (!home.empty())
    return home;
  long size = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_dir)
    return found->pw_dir;
  return "";
}

}  // namespace

std::string default_state_dir() {
  std::string dir = env("MAXKERNEL_STATE_DIR");
  if (!dir.empty())
    return dir;
  // The XDG spec says relative values are invalid and must be ignored.
  std::string xdg = env("XDG_STATE_HOME");
  if (!xdg.empty() && xdg.front() == '/')
    return xdg + "/maxkernel";
  std::string home = home_dir();
  if (home.empty())
    return "";
  return home + "/.local/state/maxkernel";
}

std::string default_store_path(const std::string& state_dir) {
  return state_dir + "/evaluations.sqlite";
}

}  // namespace maxkernel::search
