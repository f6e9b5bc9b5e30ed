#include "search/graph_export.hpp"

#include "messages/capnp_io.hpp"

#include <maxkernel/schema/search.capnp.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <tuple>
#include <unistd.h>

extern char** environ;

namespace maxkernel::search {

namespace {

// The fields of a Vertex both exports show, read once.
struct vertex_view {
  uint32_t index = 0;
  int32_t parent = -1;
  std::string strategy;
  uint32_t round = 0;
  std::string state;
  bool correct = false;
  double time_us = 0;
  double roofline_us = 0;
  std::optional<std::string> timing;  // "modeled" | "measured"; none without a profile
  std::string candidate_id;
  std::string template_name;
  std::vector<std::pair<std::string, std::string>> params;  // name, JSON literal
  std::string failure_class;
  std::string verdict;
  uint32_t repairs = 0;
  uint32_t evaluations = 0;
};

const char* state_name(schema::VertexState s) {
  switch (s) {
    case schema::VertexState::PENDING: return "pending";
    case schema::VertexState::EVALUATED: return "evaluated";
    case schema::VertexState::FAILED: return "failed";
  }
  return "unknown";
}

const char* timing_name(schema::Timing t) {
  return t == schema::Timing::MEASURED ? "measured" : "modeled";
}

std::optional<vertex_view> read_vertex(const std::string& bytes, std::string& error) {
  auto msg = messages::decode<schema::Vertex>(bytes, error);
  if (!msg)
    return std::nullopt;
  auto v = msg->root<schema::Vertex>();
  vertex_view out;
  out.index = v.getIndex();
  out.parent = v.getParent();
  out.strategy = v.getStrategy();
  out.round = v.getRound();
  out.state = state_name(v.getState());
  out.correct = v.getCorrect();
  out.time_us = std::isfinite(v.getTimeUs()) && v.getTimeUs() > 0 ? v.getTimeUs() : 0;
  out.roofline_us = v.getRooflineUs();
  if (v.getHasResult() && v.getResult().getHasProfile())
    out.timing = timing_name(v.getResult().getProfile().getTiming());
  else if (v.getHasDiagnosis())
    out.timing = timing_name(v.getDiagnosis().getTiming());
  auto c = v.getCandidate();
  out.candidate_id = c.getId();
  out.template_name = c.getTemplate();
  for (auto p : c.getParams())
    out.params.emplace_back(p.getName(), p.getValue());
  out.failure_class = v.getFailureClass();
  out.verdict = v.getVerdict();
  out.repairs = v.getRepairs();
  out.evaluations = v.getEvaluations();
  return out;
}

std::vector<vertex_view> read_all(const std::vector<std::string>& bytes,
                                  std::vector<std::string>* errors) {
  std::vector<vertex_view> out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string error;
    if (auto v = read_vertex(bytes[i], error))
      out.push_back(std::move(*v));
    else if (errors)
      errors->push_back("vertex bytes " + std::to_string(i) + ": " + error);
  }
  return out;
}

// A speedup only for a correct, timed vertex against a known reference: a wrong kernel's
// speed is not a speedup.
std::optional<double> speedup(const vertex_view& v, double reference_us) {
  if (!v.correct || v.time_us <= 0 || !(reference_us > 0) || !std::isfinite(reference_us))
    return std::nullopt;
  return reference_us / v.time_us;
}

// The fastest correct timed vertex (lower index on ties); -1 when none.
int64_t fastest(const std::vector<vertex_view>& vs) {
  int64_t best = -1;
  double best_time = 0;
  for (auto& v : vs)
    if (v.correct && v.time_us > 0 &&
        (best < 0 || v.time_us < best_time || (v.time_us == best_time && v.index < best))) {
      best = v.index;
      best_time = v.time_us;
    }
  return best;
}

bool failed(const vertex_view& v) {
  return v.state == "failed" || (v.state == "evaluated" && !v.correct);
}

// The move's name: the strategy up to its arguments ("growBlock {bm: 256}" -> "growBlock").
std::string move_name(const std::string& strategy) {
  auto end = strategy.find_first_of(" {(:\n\t");
  return strategy.substr(0, end);
}

// A parameter value for a label: JSON strings without their quotes, anything else as written.
std::string short_value(const std::string& literal) {
  auto j = nlohmann::json::parse(literal, nullptr, false);
  if (!j.is_discarded() && j.is_string())
    return j.get<std::string>();
  return literal;
}

std::string short_params(const vertex_view& v) {
  constexpr size_t limit = 40;
  std::string out;
  for (auto& [name, value] : v.params) {
    if (!out.empty())
      out += ' ';
    out += name + "=" + short_value(value);
  }
  if (out.size() > limit) {
    // Cut on a UTF-8 character boundary.
    size_t cut = limit - 3;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xc0) == 0x80)
      --cut;
    out = out.substr(0, cut) + "...";
  }
  return out;
}

std::string format(const char* fmt, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

// Text for a DOT double-quoted string: quotes and backslashes escaped (a backslash starts an
// escape in Graphviz labels), line breaks as \n, other control characters as spaces.
std::string dot_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': break;
      default:
        out += static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? ' ' : ch;
    }
  }
  return out;
}

}  // namespace

std::string graph_json(const std::vector<std::string>& vertex_bytes, double reference_us) {
  using nlohmann::json;
  std::vector<std::string> errors;
  auto vs = read_all(vertex_bytes, &errors);
  json vertices = json::array(), edges = json::array();
  for (auto& v : vs) {
    json params = json::object();
    for (auto& [name, value] : v.params) {
      auto parsed = json::parse(value, nullptr, false);
      params[name] = parsed.is_discarded() ? json(value) : parsed;
    }
    auto up = speedup(v, reference_us);
    vertices.push_back({
        {"index", v.index},
        {"parent", v.parent},
        {"strategy", v.strategy},
        {"round", v.round},
        {"state", v.state},
        {"correct", v.correct},
        {"time_us", v.time_us > 0 ? json(v.time_us) : json(nullptr)},
        {"roofline_us", v.roofline_us > 0 ? json(v.roofline_us) : json(nullptr)},
        {"timing", v.timing ? json(*v.timing) : json(nullptr)},
        {"speedup", up ? json(*up) : json(nullptr)},
        {"candidate_id", v.candidate_id},
        {"template", v.template_name},
        {"params", params},
        {"failure_class", v.failure_class},
        {"verdict", v.verdict},
        {"repairs", v.repairs},
        {"evaluations", v.evaluations},
    });
    if (v.parent >= 0)
      edges.push_back({{"parent", v.parent}, {"child", v.index}, {"strategy", v.strategy},
                       {"move", move_name(v.strategy)}});
  }
  auto best = fastest(vs);
  json out = {
      {"reference_time_us", reference_us > 0 ? json(reference_us) : json(nullptr)},
      {"best", best >= 0 ? json(best) : json(nullptr)},
      {"vertices", vertices},
      {"edges", edges},
      {"errors", errors},
  };
  // Invalid UTF-8 in a verdict (a worker's raw output) is replaced, not thrown.
  return out.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string graph_dot(const std::vector<std::string>& vertex_bytes, double reference_us,
                      int best) {
  auto vs = read_all(vertex_bytes, nullptr);
  std::vector<bool> present;
  for (auto& v : vs) {
    if (v.index >= present.size())
      present.resize(v.index + 1, false);
    present[v.index] = true;
  }
  std::string out = "digraph search {\n"
                    "  rankdir=TB;\n"
                    "  node [shape=box, style=rounded, fontname=\"Helvetica\", fontsize=10];\n"
                    "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  for (auto& v : vs) {
    std::vector<std::string> lines;
    lines.push_back("#" + std::to_string(v.index) +
                    (v.template_name.empty() ? "" : " " + v.template_name));
    if (auto p = short_params(v); !p.empty())
      lines.push_back(p);
    std::string timing = v.timing ? " " + *v.timing : "";
    if (v.state == "pending") {
      lines.push_back("pending");
    } else if (failed(v)) {
      lines.push_back("failed: " + (v.failure_class.empty() ? std::string("incorrect")
                                                             : v.failure_class));
    } else if (auto up = speedup(v, reference_us)) {
      lines.push_back(format("%.2fx", *up) + timing);
    } else if (v.time_us > 0) {
      lines.push_back(format("%.4g us", v.time_us) + timing);
    }
    std::string label;
    for (auto& l : lines)
      label += (label.empty() ? "" : "\\n") + dot_escape(l);
    std::string attrs = "label=\"" + label + "\", tooltip=\"" +
                        dot_escape(v.strategy + (v.verdict.empty() ? "" : "\n" + v.verdict)) +
                        "\"";
    if (best >= 0 && v.index == static_cast<uint32_t>(best))
      attrs += ", style=\"rounded,filled,bold\", fillcolor=\"palegreen\", penwidth=2";
    else if (v.state == "pending")
      attrs += ", style=\"rounded,dotted\", color=\"gray50\"";
    else if (failed(v))
      attrs += ", style=\"rounded,dashed\", color=\"firebrick\", fontcolor=\"firebrick\"";
    out += "  v" + std::to_string(v.index) + " [" + attrs + "];\n";
  }
  for (auto& v : vs) {
    if (v.parent < 0 || static_cast<size_t>(v.parent) >= present.size() || !present[v.parent])
      continue;
    out += "  v" + std::to_string(v.parent) + " -> v" + std::to_string(v.index) + " [label=\"" +
           dot_escape(move_name(v.strategy)) + "\", tooltip=\"" + dot_escape(v.strategy) +
           "\"];\n";
  }
  out += "}\n";
  return out;
}

bool dot_to_svg(const std::string& dot, std::string& svg, std::string& error) {
  svg.clear();
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_fd = [](int& fd) {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  };
  auto close_all = [&] {
    for (int* p : {in, out, err}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
  };
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    error = std::string("cannot run Graphviz dot: pipe: ") + std::strerror(errno);
    close_all();
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  char arg0[] = "dot", arg1[] = "-Tsvg";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, "dot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  if (rc != 0) {
    close_all();
    error = rc == ENOENT ? "Graphviz is not installed: no 'dot' on PATH (Debian: apt-get install "
                           "graphviz)"
                         : std::string("cannot run Graphviz dot: ") + std::strerror(rc);
    return false;
  }

  // dot may exit before reading all its input: a write to the closed pipe then fails with
  // EPIPE instead of killing this process with SIGPIPE.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  bool broke_pipe = false;

  std::string err_text;
  size_t written = 0;
  // Non-blocking input: a large graph must not block this thread in write() while dot waits
  // for its full output pipe to be read.
  ::fcntl(in[1], F_SETFL, ::fcntl(in[1], F_GETFL) | O_NONBLOCK);
  if (dot.empty())
    close_fd(in[1]);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  bool timed_out = false;
  while (out[0] >= 0 || err[0] >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[3];
    nfds_t n = 0;
    int slot_in = -1, slot_out = -1, slot_err = -1;
    if (in[1] >= 0) {
      slot_in = static_cast<int>(n);
      fds[n++] = {in[1], POLLOUT, 0};
    }
    if (out[0] >= 0) {
      slot_out = static_cast<int>(n);
      fds[n++] = {out[0], POLLIN, 0};
    }
    if (err[0] >= 0) {
      slot_err = static_cast<int>(n);
      fds[n++] = {err[0], POLLIN, 0};
    }
    int ready = ::poll(fds, n, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR)
      break;
    if (ready <= 0)
      continue;
    if (slot_in >= 0 && fds[slot_in].revents) {
      ssize_t k = ::write(in[1], dot.data() + written, dot.size() - written);
      if (k > 0)
        written += static_cast<size_t>(k);
      if (k < 0 && errno == EPIPE)
        broke_pipe = true;
      if ((k < 0 && errno != EAGAIN && errno != EINTR) || written == dot.size())
        close_fd(in[1]);
    }
    char buf[65536];
    for (auto [slot, fd, sink] : {std::tuple{slot_out, &out[0], &svg},
                                  std::tuple{slot_err, &err[0], &err_text}}) {
      if (slot < 0 || !fds[slot].revents)
        continue;
      ssize_t k = ::read(*fd, buf, sizeof buf);
      if (k > 0)
        sink->append(buf, static_cast<size_t>(k));
      else if (k == 0 || (errno != EAGAIN && errno != EINTR))
        close_fd(*fd);
    }
  }
  if (broke_pipe) {
    // Take the SIGPIPE this thread raised before unblocking it.
    timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  close_all();
  if (timed_out)
    ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!err_text.empty() && (err_text.back() == '\n' || err_text.back() == '\r'))
    err_text.pop_back();
  if (timed_out) {
    error = "Graphviz dot did not finish within two minutes";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    error = "Graphviz dot failed" +
            (WIFEXITED(status) ? " (exit " + std::to_string(WEXITSTATUS(status)) + ")"
                               : std::string(" (killed by a signal)")) +
            (err_text.empty() ? "" : ": " + err_text);
  } else if (written != dot.size()) {
    error = "Graphviz dot stopped reading its input" + (err_text.empty() ? "" : ": " + err_text);
  } else {
    return true;
  }
  svg.clear();
  return false;
}

}  // namespace maxkernel::search
