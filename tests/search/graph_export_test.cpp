// The search graph's JSON and DOT exports from Vertex bytes, and SVG through Graphviz.
#include "search/graph_export.hpp"

#include "messages/capnp_io.hpp"

#include <maxkernel/schema/search.capnp.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace maxkernel::search {
namespace {

using nlohmann::json;

struct vertex_fields {
  uint32_t index = 0;
  int32_t parent = -1;
  std::string strategy = "template";
  schema::VertexState state = schema::VertexState::EVALUATED;
  bool correct = true;
  double time_us = 10;
  bool profiled = true;
  schema::Timing timing = schema::Timing::MODELED;
  std::string template_name = "matmul";
  std::vector<std::pair<std::string, std::string>> params = {{"bm", "128"},
                                                             {"order", "\"parallel\""}};
  std::string failure_class;
  std::string verdict = "passed 3 cases";
};

std::string make_vertex(const vertex_fields& f) {
  capnp::MallocMessageBuilder message;
  auto v = message.initRoot<schema::Vertex>();
  v.setIndex(f.index);
  v.setParent(f.parent);
  v.setStrategy(f.strategy);
  v.setState(f.state);
  v.setCorrect(f.correct);
  v.setTimeUs(f.time_us);
  v.setFailureClass(f.failure_class);
  v.setVerdict(f.verdict);
  auto c = v.initCandidate();
  c.setId("cand-" + std::to_string(f.index));
  c.setTemplate(f.template_name);
  auto params = c.initParams(static_cast<unsigned>(f.params.size()));
  for (unsigned i = 0; i < f.params.size(); ++i) {
    params[i].setName(f.params[i].first);
    params[i].setValue(f.params[i].second);
  }
  if (f.profiled) {
    v.setHasResult(true);
    auto r = v.initResult();
    r.setCorrect(f.correct);
    r.setHasProfile(true);
    r.initProfile().setTiming(f.timing);
    r.getProfile().setTimeUs(f.time_us);
  }
  return messages::encode(message);
}

// 0: root 20 us; 1: its child 10 us (the best); 2: a failed child; 3: a pending grandchild.
std::vector<std::string> small_graph() {
  vertex_fields root;
  root.time_us = 20;
  vertex_fields fast;
  fast.index = 1;
  fast.parent = 0;
  fast.strategy = "growBlock {bm: 256}";
  fast.time_us = 10;
  fast.params = {{"bm", "256"}, {"order", "\"parallel\""}};
  vertex_fields broken;
  broken.index = 2;
  broken.parent = 0;
  broken.strategy = "splitK {k: 4}";
  broken.state = schema::VertexState::FAILED;
  broken.correct = false;
  broken.time_us = 0;
  broken.profiled = false;
  broken.failure_class = "lower_error";
  broken.verdict = "Mosaic said \"no\"\nat line 3";
  vertex_fields pending;
  pending.index = 3;
  pending.parent = 1;
  pending.strategy = "pipeline";
  pending.state = schema::VertexState::PENDING;
  pending.correct = false;
  pending.time_us = 0;
  pending.profiled = false;
  return {make_vertex(root), make_vertex(fast), make_vertex(broken), make_vertex(pending)};
}

bool dot_installed() {
  return std::system("command -v dot >/dev/null 2>&1") == 0;
}

TEST(GraphExport, JsonHasEveryVertexSpeedupAndEdge) {
  auto j = json::parse(graph_json(small_graph(), 30));
  EXPECT_EQ(j["reference_time_us"], 30.0);
  EXPECT_EQ(j["best"], 1);
  ASSERT_EQ(j["vertices"].size(), 4u);
  auto& v0 = j["vertices"][0];
  EXPECT_EQ(v0["index"], 0);
  EXPECT_EQ(v0["parent"], -1);
  EXPECT_EQ(v0["state"], "evaluated");
  EXPECT_EQ(v0["correct"], true);
  EXPECT_DOUBLE_EQ(v0["time_us"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(v0["speedup"].get<double>(), 1.5);
  EXPECT_EQ(v0["timing"], "modeled");
  EXPECT_EQ(v0["template"], "matmul");
  EXPECT_EQ(v0["params"], (json{{"bm", 128}, {"order", "parallel"}}));
  EXPECT_DOUBLE_EQ(j["vertices"][1]["speedup"].get<double>(), 3.0);
  auto& v2 = j["vertices"][2];
  EXPECT_EQ(v2["state"], "failed");
  EXPECT_TRUE(v2["speedup"].is_null());
  EXPECT_TRUE(v2["time_us"].is_null());
  EXPECT_TRUE(v2["timing"].is_null());
  EXPECT_EQ(v2["failure_class"], "lower_error");
  EXPECT_EQ(v2["verdict"], "Mosaic said \"no\"\nat line 3");
  EXPECT_EQ(j["vertices"][3]["state"], "pending");
  EXPECT_EQ(j["edges"], (json::array({
                            {{"parent", 0}, {"child", 1}, {"strategy", "growBlock {bm: 256}"},
                             {"move", "growBlock"}},
                            {{"parent", 0}, {"child", 2}, {"strategy", "splitK {k: 4}"},
                             {"move", "splitK"}},
                            {{"parent", 1}, {"child", 3}, {"strategy", "pipeline"},
                             {"move", "pipeline"}},
                        })));
  EXPECT_TRUE(j["errors"].empty());
}

TEST(GraphExport, JsonWithoutAReferenceHasNoSpeedups) {
  auto j = json::parse(graph_json(small_graph(), 0));
  EXPECT_TRUE(j["reference_time_us"].is_null());
  for (auto& v : j["vertices"])
    EXPECT_TRUE(v["speedup"].is_null());
  EXPECT_DOUBLE_EQ(j["vertices"][1]["time_us"].get<double>(), 10);
  EXPECT_EQ(j["best"], 1);
}

TEST(GraphExport, JsonNamesBytesThatAreNotAVertex) {
  auto vs = small_graph();
  vs.insert(vs.begin() + 1, "garbage");
  auto j = json::parse(graph_json(vs, 30));
  EXPECT_EQ(j["vertices"].size(), 4u);
  ASSERT_EQ(j["errors"].size(), 1u);
  EXPECT_NE(j["errors"][0].get<std::string>().find("vertex bytes 1"), std::string::npos);
  EXPECT_TRUE(json::parse(graph_json({}, 30))["best"].is_null());
}

TEST(GraphExport, DotLabelsSpeedupsStylesFailuresAndHighlightsTheBest) {
  auto dot = graph_dot(small_graph(), 30, 1);
  EXPECT_EQ(dot.rfind("digraph search {\n", 0), 0u) << dot;
  EXPECT_NE(dot.find("v0 [label=\"#0 matmul\\nbm=128 order=parallel\\n1.50x modeled\""),
            std::string::npos)
      << dot;
  EXPECT_NE(dot.find("v1 [label=\"#1 matmul\\nbm=256 order=parallel\\n3.00x modeled\""),
            std::string::npos)
      << dot;
  // The best is filled; the failed vertex is dashed with its class; pending is dotted.
  auto line = [&](const std::string& node) {
    auto at = dot.find("  " + node + " [");
    return at == std::string::npos ? "" : dot.substr(at, dot.find('\n', at) - at);
  };
  EXPECT_NE(line("v1").find("fillcolor=\"palegreen\""), std::string::npos) << line("v1");
  EXPECT_EQ(line("v0").find("fillcolor"), std::string::npos) << line("v0");
  EXPECT_NE(line("v2").find("dashed"), std::string::npos) << line("v2");
  EXPECT_NE(line("v2").find("failed: lower_error"), std::string::npos) << line("v2");
  EXPECT_EQ(line("v2").find("x modeled"), std::string::npos) << line("v2");
  EXPECT_NE(line("v3").find("dotted"), std::string::npos) << line("v3");
  EXPECT_EQ(line("v0").find("dashed"), std::string::npos) << line("v0");
  // The verdict's quotes and line break are escaped inside the tooltip.
  EXPECT_NE(line("v2").find("Mosaic said \\\"no\\\"\\nat line 3"), std::string::npos) << line("v2");
  EXPECT_NE(dot.find("v0 -> v1 [label=\"growBlock\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("v0 -> v2 [label=\"splitK\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("v1 -> v3 [label=\"pipeline\""), std::string::npos) << dot;
  // No best: nothing filled.
  EXPECT_EQ(graph_dot(small_graph(), 30, -1).find("fillcolor"), std::string::npos);
}

TEST(GraphExport, DotLabelsMeasuredTimesAndTimesWithoutAReference) {
  vertex_fields measured;
  measured.time_us = 12.5;
  measured.timing = schema::Timing::MEASURED;
  auto dot = graph_dot({make_vertex(measured)}, 25, 0);
  EXPECT_NE(dot.find("2.00x measured"), std::string::npos) << dot;
  EXPECT_EQ(dot.find("modeled"), std::string::npos) << dot;
  dot = graph_dot({make_vertex(measured)}, 0, 0);
  EXPECT_NE(dot.find("12.5 us measured"), std::string::npos) << dot;
}

TEST(GraphExport, DotEscapesQuotesBackslashesAndNewlines) {
  vertex_fields odd;
  odd.template_name = "weird\"tmpl\\x";
  odd.params = {{"note", "\"a\\nb\""}};  // the JSON string a<newline>b
  odd.strategy = "fix \"dtype\"\nthen\tretry";
  auto dot = graph_dot({make_vertex(odd)}, 20, -1);
  EXPECT_NE(dot.find("#0 weird\\\"tmpl\\\\x\\nnote=a\\nb\\n2.00x modeled"), std::string::npos)
      << dot;
  EXPECT_NE(dot.find("tooltip=\"fix \\\"dtype\\\"\\nthen retry"), std::string::npos) << dot;
  // Every statement is on its own line: no raw line break inside a quoted string.
  std::istringstream lines(dot);
  std::string l;
  while (std::getline(lines, l))
    EXPECT_TRUE(l == "digraph search {" || l == "}" || l.rfind("  ", 0) == 0) << l;
}

TEST(GraphExport, SvgFromDot) {
  if (!dot_installed())
    GTEST_SKIP() << "Graphviz dot is not installed (apt-get install graphviz)";
  vertex_fields odd;
  odd.template_name = "weird\"tmpl";
  auto graph = small_graph();
  graph[0] = make_vertex(odd);
  std::string svg, error;
  ASSERT_TRUE(dot_to_svg(graph_dot(graph, 30, 1), svg, error)) << error;
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("3.00x modeled"), std::string::npos);
  EXPECT_NE(svg.find("failed: lower_error"), std::string::npos);
  // The escaped quote came through as a quote of the label.
  EXPECT_NE(svg.find("weird&quot;tmpl"), std::string::npos);
  EXPECT_NE(svg.find("growBlock"), std::string::npos);
}

TEST(GraphExport, SvgOfAGraphLargerThanAPipeBuffer) {
  if (!dot_installed())
    GTEST_SKIP() << "Graphviz dot is not installed (apt-get install graphviz)";
  std::vector<std::string> graph;
  for (uint32_t i = 0; i < 400; ++i) {
    vertex_fields f;
    f.index = i;
    f.parent = i == 0 ? -1 : static_cast<int32_t>((i - 1) / 3);
    f.strategy = "growBlock {bm: " + std::to_string(i) + ", note: \"" + std::string(80, 'x') +
                 "\"}";
    f.time_us = 100.0 / (1 + i % 7);
    graph.push_back(make_vertex(f));
  }
  auto dot = graph_dot(graph, 100, 6);
  ASSERT_GT(dot.size(), 65536u);
  std::string svg, error;
  ASSERT_TRUE(dot_to_svg(dot, svg, error)) << error;
  EXPECT_NE(svg.find("#399 matmul"), std::string::npos);
}

TEST(GraphExport, SvgErrors) {
  if (dot_installed()) {
    std::string svg, error;
    EXPECT_FALSE(dot_to_svg("digraph { a -> ", svg, error));
    EXPECT_NE(error.find("Graphviz dot failed"), std::string::npos) << error;
    EXPECT_TRUE(svg.empty());
  }
  // Without dot on PATH the error says what to install.
  std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  auto empty = std::filesystem::temp_directory_path() / "maxkernel_no_dot_here";
  setenv("PATH", empty.c_str(), 1);
  std::string svg, error;
  bool ok = dot_to_svg("digraph { a }", svg, error);
  setenv("PATH", old_path.c_str(), 1);
  EXPECT_FALSE(ok);
  EXPECT_NE(error.find("Graphviz is not installed"), std::string::npos) << error;
}

}  // namespace
}  // namespace maxkernel::search
