#include "cli/shell_service.hpp"

#include "actors/kernel_diff.hpp"
#include "cli/output_file.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/payload_codec.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One submitted task, as its directory tells.
struct task_entry {
  std::string id;           // the directory's name
  fs::path dir;
  std::string name;         // the spec's name without extension
  std::string mode = "auto";
  std::string state;        // running | finished | interrupted
  int exit_code = -1;
  std::optional<json> result;
};

std::vector<task_entry> list_tasks(const shell_context& ctx) {
  std::vector<task_entry> tasks;
  std::error_code ec;
  auto root = fs::path(ctx.state_dir) / "submissions";
  for (auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec) || !fs::exists(entry.path() / "request.bin", ec))
      continue;
    task_entry t;
    t.id = entry.path().filename().string();
    t.dir = entry.path();
    std::string error;
    if (auto msg = messages::decoded_message::parse(read_whole_file(t.dir / "request.bin"), error)) {
      try {
        auto sub = msg->root<schema::ClientRequest>().getSubmit();
        t.name = fs::path(sub.getSpecName().cStr()).stem().string();
        auto args = sub.getArgs();
        for (unsigned i = 0; i < args.size(); ++i) {
          std::string a = args[i].cStr();
          if (a == "--mode" && i + 1 < args.size())
            t.mode = args[i + 1].cStr();
          else if (a.rfind("--mode=", 0) == 0)
            t.mode = a.substr(7);
        }
      } catch (const kj::Exception&) {
      }
    }
    if (fs::exists(t.dir / "exit_code", ec)) {
      t.state = "finished";
      t.exit_code = std::atoi(read_whole_file(t.dir / "exit_code").c_str());
    } else {
      t.state = ctx.running.count(t.id) ? "running" : "interrupted";
    }
    if (fs::exists(t.dir / "out" / "result.json", ec)) {
      auto parsed = json::parse(read_whole_file(t.dir / "out" / "result.json"), nullptr, false);
      if (!parsed.is_discarded())
        t.result = std::move(parsed);
    }
    tasks.push_back(std::move(t));
  }
  std::sort(tasks.begin(), tasks.end(), [](auto& a, auto& b) { return a.id < b.id; });
  return tasks;
}

// TASK: an id, a unique id prefix, or a task name (its latest submission).
std::optional<task_entry> find_task(const shell_context& ctx, const std::string& key,
                                    std::string& error) {
  auto tasks = list_tasks(ctx);
  std::vector<const task_entry*> by_prefix;
  const task_entry* by_name = nullptr;
  for (auto& t : tasks) {
    if (t.id == key)
      return t;
    if (t.id.rfind(key, 0) == 0)
      by_prefix.push_back(&t);
    if (t.name == key)
      by_name = &t;  // sorted by id: the last is the latest
  }
  if (by_prefix.size() == 1)
    return *by_prefix.front();
  if (by_name)
    return *by_name;
  error = by_prefix.size() > 1 ? "'" + key + "' names several tasks: give more of the id"
                               : "no task '" + key + "' (see `tasks`)";
  return std::nullopt;
}

std::string speedup_text(const std::optional<json>& r) {
  if (!r || !r->contains("speedup_vs_reference") || (*r)["speedup_vs_reference"].is_null())
    return "-";
  return fmt::format("{:.2f}x", (*r)["speedup_vs_reference"].get<double>());
}

void fail(schema::ShellReply::Builder reply, const std::string& why) {
  reply.setOk(false);
  reply.setText(why + "\n");
}

void done(schema::ShellReply::Builder reply, const std::string& text, const json& j) {
  reply.setOk(true);
  reply.setText(text);
  reply.setJson(j.dump());
}

std::vector<std::string> log_lines(const task_entry& t) {
  std::vector<std::string> lines;
  std::istringstream in(read_whole_file(t.dir / "log.txt"));
  for (std::string line; std::getline(in, line);) {
    auto cr = line.rfind('\r');  // a progress line rewritten in place: its last state
    lines.push_back(cr == std::string::npos ? line : line.substr(cr + 1));
  }
  return lines;
}

void tasks_command(shell_context& ctx, schema::ShellReply::Builder reply) {
  auto tasks = list_tasks(ctx);
  std::string text;
  json j = json::array();
  for (auto& t : tasks) {
    text += fmt::format("{}  {:<28} {:<5} {:<11} {}\n", t.id, t.name, t.mode,
                        t.state == "finished" ? fmt::format("exit {}", t.exit_code) : t.state,
                        speedup_text(t.result));
    j.push_back({{"id", t.id}, {"task", t.name}, {"mode", t.mode}, {"state", t.state},
                 {"exit_code", t.exit_code},
                 {"speedup_vs_reference", t.result ? (*t.result)["speedup_vs_reference"] : json()}});
  }
  done(reply, tasks.empty() ? "no tasks submitted\n" : text, j);
}

void show_command(const task_entry& t, schema::ShellReply::Builder reply) {
  std::string text = fmt::format("{} ({}): {} search, {}\n", t.id, t.name, t.mode,
                                 t.state == "finished" ? fmt::format("exit {}", t.exit_code)
                                                       : t.state);
  if (t.result) {
    auto& r = *t.result;
    text += fmt::format("  correct {}, kernel {} us, reference {} us, speedup {}; {} candidates, "
                        "stopped on {}; {} node(s), {} lost\n",
                        r.value("correct", false), r.value("kernel_time_us", json()).dump(),
                        r.value("reference_time_us", json()).dump(), speedup_text(t.result),
                        r.value("candidates_evaluated", json()).dump(),
                        r.value("stop_reason", std::string("?")),
                        r.value("nodes", json()).dump(), r.value("nodes_lost", json()).dump());
  }
  auto lines = log_lines(t);
  for (size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i)
    text += "  | " + lines[i] + "\n";
  done(reply, text, t.result ? *t.result : json{{"id", t.id}, {"state", t.state}});
}

// The best vertex's ancestry from the first candidate, as a tree.
void graph_command(const task_entry& t, schema::ShellReply::Builder reply) {
  auto graph = json::parse(read_whole_file(t.dir / "out" / "graph.json"), nullptr, false);
  if (graph.is_discarded() || !graph.contains("vertices"))
    return fail(reply, t.id + ": no search graph yet (the task has not finished with outputs)");
  std::map<int, json> by_index;
  std::map<int, int> children;
  for (auto& v : graph["vertices"]) {
    by_index[v["index"].get<int>()] = v;
    children[v["parent"].get<int>()]++;
  }
  int best = -1;
  if (t.result && (*t.result).contains("best_candidate") && !(*t.result)["best_candidate"].is_null())
    best = (*t.result)["best_candidate"].value("vertex", -1);
  if (best < 0 || !by_index.count(best))
    return fail(reply, t.id + ": no correct candidate, so no best path");
  std::vector<json> path;
  for (int i = best; i >= 0 && by_index.count(i); i = by_index[i]["parent"].get<int>())
    path.push_back(by_index[i]);
  std::reverse(path.begin(), path.end());
  std::string text = fmt::format("{}: the best path ({} of {} vertices)\n", t.id, path.size(),
                                 by_index.size());
  json j = json::array();
  for (size_t d = 0; d < path.size(); ++d) {
    auto& v = path[d];
    int idx = v["index"].get<int>();
    text += fmt::format("{}{}v{} {}  {:.2f} us  {:.2f}x{}\n", std::string(2 * d, ' '),
                        d ? "└─ " : "", idx, v.value("strategy", std::string()),
                        v.value("time_us", 0.0), v.value("speedup", 0.0),
                        children[idx] > 1 ? fmt::format("  ({} children)", children[idx]) : "");
    j.push_back(v);
  }
  done(reply, text, j);
}

// stop, pause, resume, budget: a SearchControl to the task's running search; the answer is
// its progress afterwards.
void control_command(shell_context& ctx, const task_entry& t, const std::vector<std::string>& words,
                     schema::ShellReply::Builder reply) {
  const auto& cmd = words[0];
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::SearchControl>();
  if (cmd == "budget") {
    char* end = nullptr;
    errno = 0;
    auto n = words.size() == 3 ? std::strtoul(words[2].c_str(), &end, 10) : 0;
    if (words.size() != 3 || words[2].empty() || !end || *end || errno != 0 ||
        n > std::numeric_limits<uint32_t>::max())
      return fail(reply, "usage: budget TASK N (the new cap on candidates; 0: none)");
    c.setBudgetEvals(static_cast<uint32_t>(n));
  } else if (cmd == "stop") {
    std::string why;
    for (size_t i = 2; i < words.size(); ++i)
      why += (i > 2 ? " " : "") + words[i];
    c.setStop(why);
  } else if (words.size() != 2) {
    return fail(reply, "usage: " + cmd + " TASK");
  } else if (cmd == "pause") {
    c.setPause();
  } else {
    c.setResume();
  }
  auto controller = ctx.controls ? ctx.controls->get(t.id) : search_controller{};
  if (t.state != "running" || !controller)
    return fail(reply, t.id + " is " + (t.state == "running" ? "starting" : t.state) +
                         ": no search of it runs here");
  std::string progress, error;
  if (!controller(messages::encode(msg), progress, error))
    return fail(reply, cmd + " " + t.id + ": " + error);
  auto decoded = messages::decode<schema::Progress>(progress, error);
  if (!decoded)
    return fail(reply, cmd + " " + t.id + ": the supervisor's answer: " + error);
  auto p = decoded->root<schema::Progress>();
  auto cap = p.getBudgetEvals() ? std::to_string(p.getBudgetEvals()) : std::string("no cap");
  auto text = fmt::format("{}: {}\n  {} evaluated (budget {}), {} in flight{}\n", t.id,
                          p.getMessage().cStr(), p.getEvaluations(), cap, p.getInFlight(),
                          p.getPaused() ? ", paused" : "");
  done(reply, text,
       json{{"id", t.id}, {"message", p.getMessage().cStr()}, {"evaluations", p.getEvaluations()},
            {"budget_evals", p.getBudgetEvals()}, {"in_flight", p.getInFlight()},
            {"paused", p.getPaused()}});
}

void nodes_command(shell_context& ctx, schema::ShellReply::Builder reply) {
  done(reply, ctx.session.cluster_status(), json{{"status", ctx.session.cluster_status()}});
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& shell_commands() {
  static const std::vector<std::pair<std::string, std::string>> commands{
    {"help", "this list"},
    {"status", "the cluster: nodes, work, tasks running"},
    {"nodes", "every node: alive, draining, in flight, done"},
    {"tasks", "the tasks submitted: id, name, mode, state, speedup"},
    {"show", "show TASK: its result and its last lines"},
    {"best", "best TASK: the best kernel's source"},
    {"graph", "graph TASK: the best path through the search graph, as a tree"},
    {"diff", "diff A B: the best kernels of two tasks, as a unified diff"},
    {"log", "log TASK [N]: the last N (default 20) lines the task printed"},
    {"export", "export TASK DIR: the task's outputs into DIR (here)"},
    {"attach", "attach TASK: decide a hitl task's proposals from this terminal"},
    {"pause", "pause TASK: in-flight candidates finish, no new step starts"},
    {"resume", "resume TASK: a paused search goes on"},
    {"stop", "stop TASK [WHY]: the search ends after its in-flight candidates, outputs kept"},
    {"budget", "budget TASK N: the new cap on candidates (0: none)"},
    {"drain", "drain NODE: the node finishes what it holds and takes no more"},
    {"scale", "scale [N]: what to run to add N devices"},
    {"submit", "submit SPEC [options]: start a search, as `maxkernel optimize`"},
    {"quit", "leave the shell (the cluster goes on)"}};
  return commands;
}

void answer_shell(shell_context& ctx, const std::vector<std::string>& words,
                  schema::ShellReply::Builder reply) {
  if (words.empty())
    return fail(reply, "no command (try `help`)");
  const auto& cmd = words[0];
  auto want = [&](size_t n, const char* usage) {
    if (words.size() == n)
      return true;
    fail(reply, std::string("usage: ") + usage);
    return false;
  };
  std::string error;
  if (cmd == "help") {
    std::string text;
    json j = json::object();
    for (auto& [name, what] : shell_commands()) {
      text += fmt::format("  {:<8} {}\n", name, what);
      j[name] = what;
    }
    return done(reply, text, j);
  }
  if (cmd == "status") {
    auto tasks = list_tasks(ctx);
    auto running = std::count_if(tasks.begin(), tasks.end(),
                                 [](auto& t) { return t.state == "running"; });
    return done(reply,
                ctx.session.cluster_status()
                  + fmt::format("{} task(s) submitted, {} running\n", tasks.size(), running),
                json{{"tasks", tasks.size()}, {"running", running}});
  }
  if (cmd == "nodes")
    return nodes_command(ctx, reply);
  if (cmd == "tasks")
    return tasks_command(ctx, reply);
  if (cmd == "scale") {
    int devices = words.size() > 1 ? std::max(1, std::atoi(words[1].c_str())) : 4;
    auto line = fmt::format("maxkernel node --join {}{} --devices {}", ctx.node_endpoint,
                            ctx.with_token ? " --token-file TOKEN" : "", devices);
    return done(reply,
                "on each host to add (TOKEN: this cluster's token file, copied there):\n  " + line
                  + "\n",
                json{{"command", line}});
  }
  if (cmd == "drain") {
    if (!want(2, "drain NODE (its index in `nodes`)"))
      return;
    char* end = nullptr;
    auto index = std::strtoul(words[1].c_str(), &end, 10);
    if (!end || *end || words[1].empty())
      return fail(reply, "drain: NODE is the index `nodes` shows");
    if (!ctx.session.drain_node(static_cast<uint32_t>(index), error))
      return fail(reply, "drain: " + error);
    return done(reply, fmt::format("node {} drains: it finishes what it holds\n", index),
                json{{"drained", index}});
  }
  if (cmd == "diff") {
    if (!want(3, "diff A B (two tasks)"))
      return;
    auto a = find_task(ctx, words[1], error);
    auto b = a ? find_task(ctx, words[2], error) : std::nullopt;
    if (!a || !b)
      return fail(reply, error);
    auto before = read_whole_file(a->dir / "out" / "kernel.py");
    auto after = read_whole_file(b->dir / "out" / "kernel.py");
    auto d = actors::unified_diff(before, after, a->id + "/kernel.py", b->id + "/kernel.py");
    return done(reply, d.empty() ? "the best kernels are the same\n" : d, json{{"diff", d}});
  }
  // The rest name one task.
  static const std::set<std::string> per_task{"show",  "best",  "graph",  "log",   "export",
                                              "attach", "pause", "resume", "stop", "budget"};
  if (!per_task.count(cmd))
    return fail(reply, "unknown command '" + cmd + "' (try `help`)");
  if (words.size() < 2)
    return fail(reply, "usage: " + cmd + " TASK");
  auto t = find_task(ctx, words[1], error);
  if (!t)
    return fail(reply, error);
  if (cmd == "pause" || cmd == "resume" || cmd == "stop" || cmd == "budget")
    return control_command(ctx, *t, words, reply);
  if (cmd == "show")
    return show_command(*t, reply);
  if (cmd == "graph")
    return graph_command(*t, reply);
  if (cmd == "best") {
    std::error_code ec;
    if (!fs::exists(t->dir / "out" / "kernel.py", ec))
      return fail(reply, t->id + ": no kernel yet (it has not finished with outputs)");
    auto source = read_whole_file(t->dir / "out" / "kernel.py");
    return done(reply, source, json{{"id", t->id}, {"kernel", source}});
  }
  if (cmd == "log") {
    size_t n = words.size() > 2 ? static_cast<size_t>(std::max(1, std::atoi(words[2].c_str()))) : 20;
    auto lines = log_lines(*t);
    std::string text;
    json j = json::array();
    for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
      text += lines[i] + "\n";
      j.push_back(lines[i]);
    }
    return done(reply, text, j);
  }
  if (cmd == "attach") {
    auto lines = log_lines(*t);
    for (auto& line : lines) {
      auto at = line.find("operator gateway: ");
      if (at == std::string::npos)
        continue;
      auto endpoint = line.substr(at + 18, line.find(' ', at + 18) - at - 18);
      if (t->state != "running")
        return fail(reply, t->id + " is " + t->state + ": nothing to decide");
      reply.setEndpoint(endpoint);
      return done(reply, "attaching to " + endpoint + "\n", json{{"endpoint", endpoint}});
    }
    return fail(reply, t->id + " has no operator gateway (not a running hitl task)");
  }
  // export
  std::error_code ec;
  std::vector<std::pair<std::string, std::string>> files;
  auto out = t->dir / "out";
  for (auto it = fs::recursive_directory_iterator(out, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec))
      files.emplace_back(fs::relative(it->path(), out, ec).string(), read_whole_file(it->path()));
  if (files.empty())
    return fail(reply, t->id + ": no outputs (it has not finished, or was submitted without --out)");
  auto list = reply.initFiles(static_cast<unsigned>(files.size()));
  for (unsigned i = 0; i < files.size(); ++i) {
    list[i].setPath(files[i].first);
    list[i].setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(files[i].second.data()),
                                 files[i].second.size()));
  }
  done(reply, fmt::format("{} file(s)\n", files.size()), json{{"files", files.size()}});
}

}  // namespace maxkernel::cli
