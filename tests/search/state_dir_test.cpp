// Where the state directory is, from the environment.
#include "search/state_dir.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace maxkernel::search {
namespace {

// Sets or unsets a variable for one test and restores it afterwards.
class scoped_env {
public:
  scoped_env(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name))
      old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(StateDir, MaxkernelStateDirWins) {
  scoped_env a("MAXKERNEL_STATE_DIR", "/srv/mk");
  scoped_env b("XDG_STATE_HOME", "/xdg");
  scoped_env c("HOME", "/home/u");
  EXPECT_EQ(default_state_dir(), "/srv/mk");
}

TEST(StateDir, XdgStateHomeNext) {
  scoped_env a("MAXKERNEL_STATE_DIR", std::nullopt);
  scoped_env b("XDG_STATE_HOME", "/xdg");
  scoped_env c("HOME", "/home/u");
  EXPECT_EQ(default_state_dir(), "/xdg/maxkernel");
}

TEST(StateDir, EmptyOrRelativeXdgStateHomeIsIgnored) {
  scoped_env a("MAXKERNEL_STATE_DIR", "");
  scoped_env c("HOME", "/home/u");
  {
    scoped_env b("XDG_STATE_HOME", "");
    EXPECT_EQ(default_state_dir(), "/home/u/.local/state/maxkernel");
  }
  scoped_env b("XDG_STATE_HOME", "relative/state");
  EXPECT_EQ(default_state_dir(), "/home/u/.local/state/maxkernel");
}

TEST(StateDir, HomeLast) {
  scoped_env a("MAXKERNEL_STATE_DIR", std::nullopt);
  scoped_env b("XDG_STATE_HOME", std::nullopt);
  scoped_env c("HOME", "/home/u");
  EXPECT_EQ(default_state_dir(), "/home/u/.local/state/maxkernel");
}

TEST(StateDir, WithoutHomeThePasswordDatabaseAnswers) {
  scoped_env a("MAXKERNEL_STATE_DIR", std::nullopt);
  scoped_env b("XDG_STATE_HOME", std::nullopt);
  scoped_env c("HOME", std::nullopt);
  std::string dir = default_state_dir();
  // Every account running these tests has a passwd entry with a home.
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(dir.front(), '/');
  EXPECT_EQ(dir.substr(dir.size() - std::string("/.local/state/maxkernel").size()),
            "/.local/state/maxkernel");
}

TEST(StateDir, StorePath) {
  EXPECT_EQ(default_store_path("/srv/mk"), "/srv/mk/evaluations.sqlite");
}

}  // namespace
}  // namespace maxkernel::search
