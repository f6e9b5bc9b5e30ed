#include "cli/operator_console.hpp"

#include "cli/operator_command.hpp"
#include "cluster/cluster_credentials.hpp"
#include "cluster/secure_transport.hpp"
#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/decision_kind.hpp"

#include <capnp/message.h>
#include <fmt/format.h>
#include <zmq.hpp>

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace maxkernel::cli {

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::string text_of(capnp::Text::Reader t) {
  return std::string(t.cStr(), t.size());
}

std::string us(double v) {
  return fmt::format("{:.2f} us", v);
}

size_t line_count(const std::string& s) {
  if (s.empty())
    return 0;
  size_t n = 0;
  for (char c : s)
    n += c == '\n';
  return s.back() == '\n' ? n : n + 1;
}

// `vertex 4 (growBlock {"bm":512}) parent 2`
std::string vertex_head(schema::Vertex::Reader v) {
  auto strategy = text_of(v.getStrategy());
  std::string parent = v.getParent() < 0 ? "none" : std::to_string(v.getParent());
  return fmt::format("vertex {} ({}) parent {}", v.getIndex(), strategy.empty() ? "?" : strategy,
                     parent);
}

void proposal_body(std::ostringstream& o, schema::Proposal::Reader p) {
  auto v = p.getVertex();
  o << fmt::format("\n  task {} on {}; evaluations {}", text_of(p.getTask()), text_of(p.getChip()),
                   p.getEvaluations());
  if (p.getBudgetEvals() > 0)
    o << "/" << p.getBudgetEvals();
  if (v.getRationale().size() > 0)
    o << "\n  rationale: " << text_of(v.getRationale());
  if (p.getExpectedEffect().size() > 0)
    o << "\n  expected: " << text_of(p.getExpectedEffect());
  auto verdict = text_of(v.getVerdict());
  // The tester's summary of a correct kernel may itself begin with "correct: ".
  if (v.getCorrect() && verdict.rfind("correct: ", 0) == 0)
    verdict = verdict.substr(9);
  if (v.getCorrect())
    o << "\n  result: correct" << (verdict.empty() ? "" : ": " + verdict);
  else
    o << "\n  result: incorrect ("
      << (v.getFailureClass().size() > 0 ? text_of(v.getFailureClass()) : "unknown") << ")"
      << (verdict.empty() ? "" : ": " + verdict);
  auto timing = text_of(p.getTiming());
  double t = v.getTimeUs();
  if (t > 0) {
    o << "\n  time: " << us(t) << " (" << (timing.empty() ? "modeled" : timing) << ")";
    std::vector<std::string> speedups;
    if (p.getReferenceTimeUs() > 0)
      speedups.push_back(fmt::format("{:.2f}x vs reference", p.getReferenceTimeUs() / t));
    if (p.getParentTimeUs() > 0)
      speedups.push_back(fmt::format("{:.2f}x vs parent", p.getParentTimeUs() / t));
    if (p.getBestIndex() >= 0 && p.getBestTimeUs() > 0)
      speedups.push_back(
        fmt::format("{:.2f}x vs best (vertex {})", p.getBestTimeUs() / t, p.getBestIndex()));
    if (!speedups.empty())
      o << "; speedup " << fmt::format("{}", fmt::join(speedups, ", "));
    if (v.getRooflineUs() > 0)
      o << fmt::format("\n  roofline: {:.0f}% (roofline {})", 100.0 * v.getRooflineUs() / t,
                       us(v.getRooflineUs()));
  } else {
    o << "\n  time: none";
  }
  if (v.getHasDiagnosis()) {
    auto d = v.getDiagnosis();
    o << "\n  diagnosis: " << (d.getBound().size() > 0 ? text_of(d.getBound()) : "?") << " bound";
    if (d.getBottleneckCall() >= 0)
      o << "; bottleneck call " << d.getBottleneckCall()
        << (d.getBottleneckCallName().size() > 0 ? " (" + text_of(d.getBottleneckCallName()) + ")"
                                                 : "");
    if (d.getHeadroomUs() > 0)
      o << "; " << us(d.getHeadroomUs()) << " above roofline";
    for (auto s : d.getSuggestions())
      if (s.getRationale().size() > 0)
        o << "\n    - " << text_of(s.getRationale());
  }
  auto diff = text_of(p.getDiff());
  if (diff.empty()) {
    o << "\n  diff: " << (v.getParent() < 0 ? "none (a first candidate)" : "none");
  } else {
    o << "\n  diff:";
    std::istringstream lines(diff);
    for (std::string line; std::getline(lines, line);)
      o << "\n    " << line;
  }
}

std::string describe_decision(schema::Decision::Reader d) {
  auto who = text_of(d.getOperator());
  auto out = fmt::format("decided #{}: {} by {}", d.getSeq(), messages::decision_kind_name(d.getKind()),
                         who.empty() ? "?" : who);
  auto text = text_of(d.getText());
  auto source = text_of(d.getSource());
  switch (d.getKind()) {
    case schema::DecisionKind::REJECT:
    case schema::DecisionKind::HINT:
      if (!text.empty())
        out += ": " + text;
      break;
    case schema::DecisionKind::EDIT:
      if (d.getChanges().size() > 0) {
        out += ":";
        for (auto c : d.getChanges())
          out += " " + text_of(c.getName()) + "=" + text_of(c.getValue());
      } else {
        out += fmt::format(": source ({} lines)", line_count(source));
      }
      break;
    case schema::DecisionKind::TAKE_OVER:
      out += fmt::format(": source ({} lines)", line_count(source));
      break;
    case schema::DecisionKind::HAND_OVER:
      out += fmt::format(": {} steps", d.getSteps());
      break;
    default:  // approve, stop: a policy or auto says why
      if (!text.empty())
        out += ": " + text;
      break;
  }
  return out;
}

// Reads lines from the input one at a time, on request, in its own thread: the console keeps
// pinging and printing while an operator thinks. The thread shares its state (not the
// reader): a read blocked on a terminal when the console ends is left to finish on its own.
class line_reader {
public:
  struct line {
    bool eof = false;
    std::string text;
  };

  explicit line_reader(std::istream& in)
    : s_(std::make_shared<state>(in)), thread_([s = s_] { run(*s); }) {}
  ~line_reader() {
    std::unique_lock lock(s_->mutex);
    s_->quit = true;
    s_->cv.notify_all();
    // A read in progress on a terminal cannot be interrupted.
    s_->cv.wait_for(lock, 100ms, [this] { return !s_->busy; });
    bool busy = s_->busy;
    lock.unlock();
    if (busy)
      thread_.detach();
    else
      thread_.join();
  }

  void request() {
    std::lock_guard lock(s_->mutex);
    s_->want = true;
    s_->cv.notify_all();
  }

  std::optional<line> take() {
    std::lock_guard lock(s_->mutex);
    if (s_->lines.empty())
      return std::nullopt;
    auto l = std::move(s_->lines.front());
    s_->lines.pop_front();
    return l;
  }

private:
  struct state {
    explicit state(std::istream& i) : in(i) {}
    std::istream& in;
    std::mutex mutex;
    std::condition_variable cv;
    bool want = false, quit = false, busy = false;
    std::deque<line> lines;
  };

  static void run(state& s) {
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.cv.wait(lock, [&] { return s.want || s.quit; });
      if (s.quit)
        return;
      s.want = false;
      s.busy = true;
      lock.unlock();
      line l;
      l.eof = !std::getline(s.in, l.text);
      lock.lock();
      s.busy = false;
      if (s.quit)
        return;
      s.lines.push_back(l);
      s.cv.notify_all();
      if (l.eof)
        return;
    }
  }

  std::shared_ptr<state> s_;
  std::thread thread_;
};

std::string command_bytes(const std::function<void(schema::OperatorCommand::Builder)>& fill) {
  capnp::MallocMessageBuilder msg;
  auto cmd = msg.initRoot<schema::OperatorCommand>();
  cmd.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(cmd);
  return messages::encode(msg);
}

std::string default_name() {
  const char* user = std::getenv("USER");
  return user && *user ? user : "operator";
}

}  // namespace

std::string format_event(schema::OperatorEvent::Reader ev) {
  std::ostringstream o;
  switch (ev.which()) {
    case schema::OperatorEvent::WELCOME:
      o << "welcome: " << text_of(ev.getWelcome());
      break;
    case schema::OperatorEvent::PROPOSAL: {
      auto p = ev.getProposal();
      if (p.getAutoSteps() > 0)
        o << fmt::format("auto #{}: {} (handed over: {} steps left)", p.getSeq(),
                         vertex_head(p.getVertex()), p.getAutoSteps());
      else
        o << fmt::format("proposal #{}: {}", p.getSeq(), vertex_head(p.getVertex()));
      proposal_body(o, p);
      break;
    }
    case schema::OperatorEvent::DECIDED:
      o << describe_decision(ev.getDecided());
      break;
    case schema::OperatorEvent::NOTICE:
      o << "notice: " << text_of(ev.getNotice());
      break;
    case schema::OperatorEvent::REFUSED:
      o << "refused: " << text_of(ev.getRefused());
      break;
    case schema::OperatorEvent::ENDED:
      o << "ended: " << text_of(ev.getEnded());
      break;
    case schema::OperatorEvent::PONG:
      break;
    default:
      o << "notice: an event this console does not know";
  }
  return o.str();
}

int run_console(const console_options& options, std::istream& in, std::ostream& out,
                std::ostream& err) {
  auto name = options.name.empty() ? default_name() : options.name;
  zmq::context_t ctx{1};
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  try {
    sock.set(zmq::sockopt::linger, 500);  // lets a last detach or decision leave
    if (!options.token_file.empty()) {
      std::string error;
      auto creds = cluster::read_cluster_credentials(options.token_file, error);
      if (!creds) {
        err << "attach: --token-file: " << error << "\n";
        return 2;
      }
      cluster::make_curve_client(sock, *creds);
    }
    sock.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    err << "attach: cannot connect to '" << options.endpoint << "': " << e.what() << "\n";
    return 2;
  }
  auto send = [&](const std::string& bytes) {
    try {
      sock.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  };
  auto attach = [&] { send(command_bytes([&](auto c) { c.setAttach(name); })); };
  auto detach = [&] { send(command_bytes([](auto c) { c.setDetach(); })); };
  auto print = [&](const std::string& s) { out << s << "\n" << std::flush; };

  // The next event, or nothing within `wait`.
  auto next_event = [&](std::chrono::milliseconds wait) -> std::optional<messages::decoded_message> {
    zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 1, wait);
    } catch (const zmq::error_t&) {
      return std::nullopt;
    }
    if (!(items[0].revents & ZMQ_POLLIN))
      return std::nullopt;
    zmq::message_t m;
    if (!sock.recv(m, zmq::recv_flags::dontwait))
      return std::nullopt;
    std::string error;
    auto msg = messages::decode<schema::OperatorEvent>(m.to_string(), error);
    if (!msg)
      err << "attach: an event from the gateway does not decode: " << error << "\n";
    return msg;
  };

  attach();
  auto timeout = std::chrono::milliseconds(
    static_cast<int64_t>(options.connect_timeout_seconds * 1000.0));
  auto until = clock_type::now() + timeout;
  bool welcomed = false;
  while (!welcomed && clock_type::now() < until) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
    auto msg = next_event(std::max(left, 1ms));
    if (!msg)
      continue;
    auto ev = msg->root<schema::OperatorEvent>();
    print(format_event(ev));
    if (ev.isWelcome())
      welcomed = true;
    else if (ev.isRefused() || ev.isEnded())
      return 3;
  }
  if (!welcomed) {
    sock.set(zmq::sockopt::linger, 0);  // the attach has no one to go to
    err << "attach: no answer from the operator gateway at " << options.endpoint << " within "
        << options.connect_timeout_seconds << " s\n";
    return 3;
  }

  line_reader reader(in);
  std::optional<messages::decoded_message> waiting;  // the OperatorEvent{proposal}
  uint32_t waiting_seq = 0;
  std::optional<uint32_t> line_for;  // a line was asked for this proposal
  bool decision_sent = false;
  auto next_ping = clock_type::now() + options.ping_interval;
  auto last_heard = clock_type::now();

  for (;;) {
    if (waiting && !line_for && !decision_sent) {
      if (options.prompt)
        out << "decision #" << waiting_seq << "> " << std::flush;
      reader.request();
      line_for = waiting_seq;
    }
    if (auto msg = next_event(50ms)) {
      last_heard = clock_type::now();
      auto ev = msg->root<schema::OperatorEvent>();
      if (ev.isPong())
        continue;
      print(format_event(ev));
      switch (ev.which()) {
        case schema::OperatorEvent::PROPOSAL:
          if (ev.getProposal().getAutoSteps() == 0) {
            waiting_seq = ev.getProposal().getSeq();
            waiting = std::move(msg);
            decision_sent = false;
          }
          break;
        case schema::OperatorEvent::DECIDED:
          if (waiting && ev.getDecided().getSeq() == waiting_seq) {
            waiting.reset();
            decision_sent = false;
          }
          break;
        case schema::OperatorEvent::REFUSED:
          if (text_of(ev.getRefused()) == "attach first") {
            // The gateway dropped us (silent too long): attach again.
            attach();
          } else {
            decision_sent = false;  // ask again for the same proposal
          }
          break;
        case schema::OperatorEvent::ENDED:
          detach();
          return 0;
        default:
          break;
      }
    }
    if (auto line = reader.take()) {
      auto asked_for = line_for.value_or(0);
      line_for.reset();
      if (line->eof) {
        detach();
        print("detached: end of input");
        return 0;
      }
      if (!waiting || asked_for != waiting_seq) {
        print(fmt::format("ignored (proposal #{} is no longer waiting): {}", asked_for, line->text));
        continue;
      }
      auto parsed = parse_operator_command(line->text);
      if (!parsed.ok) {
        print("error: " + parsed.error);
        continue;
      }
      switch (parsed.command.what) {
        case operator_command::action::none:
          break;
        case operator_command::action::help:
          out << operator_command_help() << std::flush;
          break;
        case operator_command::action::show:
          print(format_event(waiting->root<schema::OperatorEvent>()));
          break;
        case operator_command::action::quit:
          detach();
          print("detached");
          return 0;
        case operator_command::action::release:
          send(command_bytes([](auto c) { c.setRelease(); }));
          break;
        case operator_command::action::decide:
          send(encode_decision(parsed.command, waiting_seq));
          decision_sent = true;
          break;
      }
    }
    if (clock_type::now() >= next_ping) {
      send(command_bytes([](auto c) { c.setPing(); }));
      next_ping = clock_type::now() + options.ping_interval;
    }
    if (clock_type::now() - last_heard > options.gateway_silence) {
      err << "error: the operator gateway at " << options.endpoint << " stopped answering ("
          << options.gateway_silence.count() / 1000.0 << " s without a word): is the search "
          << "still running?\n";
      return 3;
    }
  }
}

int run_attach(console_options options) {
  options.prompt = ::isatty(STDIN_FILENO) == 1;
  return run_console(options, std::cin, std::cout, std::cerr);
}

}  // namespace maxkernel::cli
