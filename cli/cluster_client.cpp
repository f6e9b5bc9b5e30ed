#include "cli/cluster_client.hpp"

#include "cli/client_event.hpp"
#include "cli/interrupt_stop.hpp"
#include "cli/operator_console.hpp"
#include "cli/output_file.hpp"
#include "maxkernel/schema/submission.capnp.h"
#include "messages/payload_codec.hpp"

#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace maxkernel::cli {

namespace {

// The supervisor's status text, or the exit code after writing why to `err`.
int ask_status(const cluster_client_options& client, std::ostream& err, std::string& text) {
  cluster_connection conn;
  if (int code = conn.open(client, err))
    return code;
  try {
    conn.send(status_request());
    auto bytes = conn.receive(
      std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000)));
    if (!bytes) {
      err << no_answer_message(client, false);
      return 3;
    }
    std::string error;
    auto msg = read_client_event(*bytes, error);
    if (!msg || msg->root<schema::ClientEvent>().which() != schema::ClientEvent::STATUS) {
      err << "error: the supervisor sent no status" << (error.empty() ? "" : ": " + error)
          << "\n";
      return 3;
    }
    text = msg->root<schema::ClientEvent>().getStatus().cStr();
    return 0;
  } catch (const kj::Exception& e) {
    err << "error: the supervisor sent a malformed event: " << e.getDescription().cStr()
        << "\n";
    return 3;
  }
}

}  // namespace

int run_cluster_status(const cluster_client_options& client) {
  std::string text;
  int code = ask_status(client, std::cerr, text);
  if (code == 0)
    std::cout << text;
  return code;
}

int check_cluster(const cluster_client_options& client, std::ostream& err) {
  std::string text;
  return ask_status(client, err, text);
}

namespace {

// "error: why\n" -> "why".
std::string bare(std::string message) {
  if (message.rfind("error: ", 0) == 0)
    message.erase(0, 7);
  while (!message.empty() && message.back() == '\n')
    message.pop_back();
  return message;
}

}  // namespace

cluster_outcome run_cluster_submission(const cluster_submission& sub,
                                       const cluster_client_options& client) {
  cluster_outcome out;
  auto fail = [&](int code, std::string why) {
    out.exit_code = code;
    out.error = bare(std::move(why));
    return out;
  };
  auto interrupted = [&] { return sub.interrupted && sub.interrupted->load(); };
  if (interrupted())
    return fail(3, "interrupted before it was submitted");
  std::string error;
  auto submit = submit_request(sub.spec, sub.args, !sub.out.empty(),
                               sub.out_shown.empty() ? sub.out : sub.out_shown, error);
  if (submit.empty())
    return fail(2, error);
  cluster_connection conn;
  std::ostringstream why;
  if (int code = conn.open(client, why))
    return fail(code, why.str());
  try {
    conn.send(submit);
    auto silence = std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000));
    auto last_word = std::chrono::steady_clock::now();
    auto last_ping = last_word;
    bool heard = false;
    // Ctrl-C: the submission's id (its first reply) gets the shell's `stop`, sent again
    // while the run is still starting (no search to stop yet).
    std::string id;
    bool stop_taken = false;
    auto next_stop = last_word;
    for (;;) {
      if (interrupted() && !stop_taken && !id.empty()
          && std::chrono::steady_clock::now() >= next_stop) {
        conn.send(command_request({"stop", id, "interrupted at the client"}));
        next_stop = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      }
      auto bytes = conn.receive(std::chrono::milliseconds(200));
      if (!bytes) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_word > silence)
          return fail(3, no_answer_message(client, heard));
        // The run may print nothing for minutes; a status request shows the supervisor lives.
        if (now - last_ping > silence / 3) {
          conn.send(status_request());
          last_ping = now;
        }
        continue;
      }
      heard = true;
      last_word = std::chrono::steady_clock::now();
      auto msg = read_client_event(*bytes, error);
      if (!msg)
        return fail(3, "the supervisor sent a malformed event: " + error);
      auto e = msg->root<schema::ClientEvent>();
      switch (e.which()) {
        case schema::ClientEvent::OUTPUT:
          if (sub.on_output)
            sub.on_output(e.getOutput().getText().cStr(), e.getOutput().getStream());
          break;
        case schema::ClientEvent::STATUS:
          break;  // a sign of life
        case schema::ClientEvent::REPLY: {
          std::string text = e.getReply().getText().cStr();
          if (id.empty() && text.rfind("submitted ", 0) == 0)
            id = text.substr(10, text.find_first_of(" \n", 10) - 10);
          else if (interrupted() && !stop_taken)
            // The stop's answer: taken, or refused for good unless the run is starting.
            stop_taken = e.getReply().getOk() || text.find("starting") == std::string::npos;
          break;
        }
        case schema::ClientEvent::REFUSED:
          return fail(2, std::string("the supervisor refused the task: ") +
                           e.getRefused().cStr());
        case schema::ClientEvent::FINISHED: {
          auto f = e.getFinished();
          if (!sub.out.empty() && f.getFiles().size() > 0
              && !write_task_files(sub.out, f.getFiles(), error))
            return fail(3, error);
          out.exit_code = f.getExitCode();
          out.json = f.getJson().cStr();
          return out;
        }
      }
    }
  } catch (const kj::Exception& e) {
    return fail(3, std::string("the supervisor sent a malformed event: ") +
                     e.getDescription().cStr());
  }
}

search_controller stop_by_flag(std::atomic<bool>& flag) {
  return [&flag](const std::string&, std::string&, std::string&) {
    flag = true;
    return true;
  };
}

std::vector<std::string> search_args(const optimize_options& s) {
  auto num = [](double x) { return fmt::format("{}", x); };
  std::vector<std::string> a{"--mode", s.mode,
                             "--budget-evals", std::to_string(s.budget_evals),
                             "--budget-seconds", num(s.budget_seconds),
                             "--patience", std::to_string(s.patience),
                             "--target-roofline", num(s.target_roofline),
                             "--beam-width", std::to_string(s.beam_width),
                             "--branching", std::to_string(s.branching),
                             "--policy", s.policy,
                             "--max-repairs", std::to_string(s.max_repairs),
                             "--seed", std::to_string(s.seed),
                             "--deadline", num(s.deadline_seconds),
                             "--simulate-device-ms", std::to_string(s.simulate_device_ms),
                             "--memory-limit", std::to_string(s.memory_limit_bytes)};
  if (!s.chip.empty())
    a.insert(a.end(), {"--chip", s.chip});
  if (!s.brains.empty())
    a.insert(a.end(), {"--brains", s.brains});
  if (s.test_every_candidate)
    a.emplace_back("--test-every-candidate");
  if (s.no_dive)
    a.emplace_back("--no-dive");
  if (s.no_store)
    a.emplace_back("--no-store");
  if (!s.store_scope.empty())
    a.insert(a.end(), {"--store-scope", s.store_scope});
  if (s.resume)
    a.emplace_back("--resume");
  return a;
}

int run_cluster_optimize(const optimize_options& opts, const std::vector<std::string>& args,
                         const cluster_client_options& client) {
  std::string error;
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  std::thread console;
  struct leave {
    std::thread& t;
    ~leave() {
      if (t.joinable())
        t.detach();  // an error ends the client; the console's reader may still block
    }
  } on_exit{console};
  // Ctrl-C stops the search on the supervisor (its outputs still come back), as embedded;
  // again, it ends this client at once.
  std::atomic<bool> interrupted{false};
  interrupt_stop ctrl_c(std::cerr);
  ctrl_c.on_search(stop_by_flag(interrupted));
  cluster_submission sub{opts.spec, args, opts.out, opts.out, nullptr, &interrupted};
  sub.on_output = [&](const std::string& text, int stream) {
    // --console: this terminal attaches to the run's operator gateway, as embedded.
    auto at = text.find("operator gateway: ");
    if (opts.console && !console.joinable() && at != std::string::npos) {
      console_options co;
      co.endpoint = text.substr(at + 18, text.find(' ', at + 18) - at - 18);
      co.token_file = client.token_file;
      co.prompt = ::isatty(STDIN_FILENO) == 1;
      console = std::thread([co] { run_console(co, std::cin, std::cout, std::cerr); });
    }
    bool to_stdout = stream == 1 && opts.json != "-";
    (to_stdout ? std::cout : std::cerr) << text << std::flush;  // stdout may carry JSON
  };
  auto outcome = run_cluster_submission(sub, client);
  if (!outcome.error.empty()) {
    std::cerr << "error: " << outcome.error << "\n";
    return outcome.exit_code;
  }
  if (console.joinable())
    console.join();  // it leaves on the gateway's `ended`
  if (!opts.json.empty() && !outcome.json.empty()
      && !write_output(opts.json, outcome.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return outcome.exit_code;
}

}  // namespace maxkernel::cli
