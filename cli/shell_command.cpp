#include "cli/shell_command.hpp"

#include "cli/client_event.hpp"
#include "cli/operator_console.hpp"
#include "cli/optimize_cli.hpp"
#include "cli/shell_service.hpp"
#include "config/chip_names.hpp"
#include "config/cluster_config.hpp"
#include "maxkernel/schema/submission.capnp.h"
#include "messages/payload_codec.hpp"

#include <CLI/CLI.hpp>
#include <editline/readline.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <sstream>

#include <unistd.h>

namespace maxkernel::cli {

namespace {

// Words of a command line: split on blanks, "double quotes" keep blanks.
std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && (c == ' ' || c == '\t')) {
      if (any)
        words.push_back(std::exchange(word, {}));
      any = false;
    } else {
      word.push_back(c);
      any = true;
    }
  }
  if (any)
    words.push_back(word);
  return words;
}

std::vector<std::string> split_commands(const std::string& script) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(script);
  while (std::getline(in, part, ';'))
    out.push_back(part);
  return out;
}

// For completion: command names and, refreshed after each command, the tasks' ids and names.
std::vector<std::string> completion_words;

char* complete_next(const char* text, int state) {
  static size_t at;
  if (state == 0)
    at = 0;
  std::string prefix = text;
  while (at < completion_words.size()) {
    const auto& w = completion_words[at++];
    if (w.rfind(prefix, 0) == 0)
      return strdup(w.c_str());
  }
  return nullptr;
}

char** complete(const char* text, int, int) {
  rl_attempted_completion_over = 1;  // no file names
  return rl_completion_matches(text, complete_next);
}

class shell {
public:
  explicit shell(const shell_options& opts) : opts_(opts) {}

  int open() { return conn_.open(opts_.client, std::cerr); }

  // One command: 0 ok, 1 failed, 3 no answer (the shell ends).
  int run(const std::vector<std::string>& words) {
    const auto& cmd = words[0];
    if (cmd == "submit")
      return submit(words);
    auto reply = ask(words);
    if (int code = verdict(reply))
      return code;
    auto r = reply->root<schema::ClientEvent>().getReply();
    if (cmd == "export") {
      if (words.size() < 3) {
        std::cerr << "error: usage: export TASK DIR\n";
        return 1;
      }
      std::string error;
      if (!write_task_files(words[2], r.getFiles(), error)) {
        std::cerr << "error: export: " << error << "\n";
        return 1;
      }
      print(r, "wrote " + words[2] + "/: " + std::string(r.getText().cStr()));
      return 0;
    }
    if (cmd == "attach") {
      console_options co;
      co.endpoint = r.getEndpoint().cStr();
      co.token_file = opts_.client.token_file;
      co.prompt = ::isatty(STDIN_FILENO) == 1;
      print(r, "");
      return run_console(co, std::cin, std::cout, std::cerr) == 0 ? 0 : 1;
    }
    print(r, "");
    return 0;
  }

  void refresh_completion() {
    completion_words.clear();
    for (auto& [name, what] : shell_commands())
      completion_words.push_back(name);
    auto reply = ask({"tasks"});
    if (!reply)
      return;
    auto tasks = nlohmann::json::parse(
      std::string(reply->root<schema::ClientEvent>().getReply().getJson().cStr()), nullptr, false);
    if (tasks.is_array())
      for (auto& t : tasks) {
        completion_words.push_back(t.value("id", std::string()));
        completion_words.push_back(t.value("task", std::string()));
      }
  }

private:
  // 0 when the supervisor answered and says ok; else 3 (no answer) or 1 (it says why).
  static int verdict(std::optional<messages::decoded_message>& reply) {
    if (!reply)
      return 3;
    auto r = reply->root<schema::ClientEvent>().getReply();
    if (r.getOk())
      return 0;
    std::cerr << "error: " << r.getText().cStr();
    return 1;
  }

  void print(schema::ShellReply::Reader r, const std::string& text) {
    if (opts_.json)
      std::cout << (r.getJson().size() ? r.getJson().cStr() : "{}") << "\n";
    else
      std::cout << (text.empty() ? std::string(r.getText().cStr()) : text + "\n");
    std::cout << std::flush;
  }

  // Sends a request and waits for its reply; words and ends of tasks submitted from this shell
  // that arrive meanwhile are noted.
  std::optional<messages::decoded_message> ask(const std::vector<std::string>& words) {
    conn_.send(command_request(words));
    return await_reply();
  }

  std::optional<messages::decoded_message> await_reply() {
    auto silence = std::chrono::milliseconds(static_cast<int64_t>(opts_.client.silence_seconds * 1000));
    auto until = std::chrono::steady_clock::now() + silence;
    while (std::chrono::steady_clock::now() < until) {
      auto bytes = conn_.receive(std::chrono::milliseconds(200));
      if (!bytes)
        continue;
      std::string error;
      auto msg = read_client_event(*bytes, error);
      if (!msg)
        continue;
      try {
        auto e = msg->root<schema::ClientEvent>();
        switch (e.which()) {
          case schema::ClientEvent::REPLY:
            return msg;
          case schema::ClientEvent::REFUSED: {
            capnp::MallocMessageBuilder b;
            auto out = b.initRoot<schema::ClientEvent>();
            out.setSchemaVersion(schema::SCHEMA_VERSION);
            auto r = out.initReply();
            r.setOk(false);
            r.setText(std::string(e.getRefused().cStr()) + "\n");
            return messages::decoded_message::parse(messages::encode(b), error);
          }
          case schema::ClientEvent::FINISHED:
            std::cerr << "[a task submitted from this shell finished: exit "
                      << e.getFinished().getExitCode() << "]\n";
            break;
          default:
            break;  // a submitted task's words: `log TASK` shows them
        }
      } catch (const kj::Exception&) {
      }
    }
    std::cerr << no_answer_message(opts_.client, true);
    return std::nullopt;
  }

  int submit(const std::vector<std::string>& words) {
    // Read by optimize's own parser here, so a mistake is told before anything is sent.
    optimize_options o;
    CLI::App parser{"submit SPEC [options]", "submit"};
    add_optimize_options(&parser, o, config::chip_names());
    std::vector<std::string> argv_words{"maxkernel", "submit"};
    argv_words.insert(argv_words.end(), words.begin() + 1, words.end());
    std::vector<std::string> reversed(words.rbegin(), words.rend() - 1);
    try {
      parser.parse(reversed);
    } catch (const CLI::ParseError& e) {
      std::cerr << "error: submit: " << e.what() << "\n";
      return 1;
    }
    if (!o.out.empty() || !o.json.empty() || o.console) {
      std::cerr << "error: submit: --out, --json and --console belong to `maxkernel optimize "
                   "--cluster`; here use `export TASK DIR` and `attach TASK`\n";
      return 1;
    }
    std::vector<const char*> argv;
    for (auto& w : argv_words)
      argv.push_back(w.c_str());
    auto args = submitted_args(parser, static_cast<int>(argv.size()), argv.data(), o.spec);
    std::string error;
    auto request = submit_request(o.spec, args, false, "", error);
    if (request.empty()) {
      std::cerr << "error: submit: " << error << "\n";
      return 1;
    }
    conn_.send(request);
    auto reply = await_reply();
    if (int code = verdict(reply))
      return code;
    print(reply->root<schema::ClientEvent>().getReply(), "");
    return 0;
  }

  const shell_options& opts_;
  cluster_connection conn_;
};

std::string history_path() {
  const char* home = std::getenv("HOME");
  return home ? std::string(home) + "/.maxkernel_history" : std::string();
}

}  // namespace

int run_shell(const shell_options& given) {
  auto opts = given;
  if (!opts.config.empty()) {
    std::string error;
    auto cfg = config::load_cluster_config(opts.config, error);
    if (!cfg) {
      std::cerr << "error: " << error << "\n";
      return 2;
    }
    if (opts.client.endpoint.empty())
      opts.client.endpoint = cfg->shell_listen.to_string();
    if (opts.client.token_file.empty())
      opts.client.token_file = cfg->token_file;
  }
  if (opts.client.endpoint.empty()) {
    std::cerr << "error: --attach HOST:PORT (the supervisor's client port) or --config "
                 "cluster.yaml\n";
    return 2;
  }
  shell sh(opts);
  if (int code = sh.open())
    return code;
  if (!opts.commands.empty()) {
    int worst = 0;
    for (auto& part : split_commands(opts.commands)) {
      auto words = split_words(part);
      if (words.empty())
        continue;
      if (words[0] == "quit" || words[0] == "exit")
        break;
      int code = sh.run(words);
      if (code == 3)
        return 3;
      worst = std::max(worst, code);
    }
    return worst;
  }
  // Interactive: libedit's line editing, history across sessions, completion.
  auto history = history_path();
  using_history();
  if (!history.empty())
    read_history(history.c_str());
  rl_attempted_completion_function = complete;
  sh.refresh_completion();
  bool tty = ::isatty(STDIN_FILENO) == 1;
  int worst = 0;
  for (;;) {
    char* raw = tty ? readline("maxkernel> ") : nullptr;
    std::string line;
    if (tty) {
      if (!raw)
        break;
      line = raw;
      std::free(raw);
    } else if (!std::getline(std::cin, line)) {
      break;
    }
    auto words = split_words(line);
    if (words.empty())
      continue;
    if (tty)
      add_history(line.c_str());
    if (words[0] == "quit" || words[0] == "exit")
      break;
    int code = sh.run(words);
    if (code == 3)
      return 3;
    worst = std::max(worst, code);
    if (tty)
      sh.refresh_completion();
  }
  if (tty && !history.empty())
    write_history(history.c_str());
  return tty ? 0 : worst;
}

}  // namespace maxkernel::cli
