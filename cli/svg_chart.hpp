// Small inline-SVG charts for the offline HTML reports (no scripts, no external resources):
// horizontal bars on a log or linear axis, step lines with a legend, 100% stacked bars. Every
// text given here is plain text and is escaped here; non-finite values are never drawn.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::cli {

// Text for HTML element content and quoted attribute values (also right for SVG).
std::string html_escape(const std::string& text);
// At most `max_chars` characters (UTF-8 aware), with "..." when cut; plain text in and out.
std::string shorten(const std::string& text, size_t max_chars);

struct legend_entry {
  std::string name, colour;
};

// One bar of a horizontal bar chart. On a log axis the bar runs from 1.0 to its value (left
// of the 1.0 line when below it); on a linear axis from 0.
struct chart_bar {
  double value = 0;         // drawn when finite and in the axis' domain (> 0 on a log axis)
  std::string colour;
  std::string text;         // written in the column right of the plot ("graph 1.42x")
  bool failure = false;     // text in red and a red cross at the bar's origin
};
struct chart_group {
  std::string label;        // left of the group's first bar (shortened; full text as tooltip)
  std::vector<chart_bar> bars;
};
enum class chart_scale { linear, log };
struct bar_chart {
  std::vector<chart_group> groups;
  std::vector<legend_entry> legend;
  chart_scale scale = chart_scale::log;
  std::string unit = "x";   // after each tick value
  std::string axis_label;   // under the axis
  double width = 900;
};
std::string bar_chart_svg(const bar_chart& chart);

// Step lines over x = 1..n (ys[i] is the value at x = i + 1; non-finite values leave a gap).
struct chart_line {
  std::string name, colour;
  std::vector<double> ys;
};
struct line_chart {
  std::vector<chart_line> lines;
  std::string x_label, y_unit = "x";
  double reference_y = 1.0;  // a dashed line there (the reference) when finite
  double width = 700, height = 280;
};
std::string line_chart_svg(const line_chart& chart);

// One bar per row, its parts as shares of the row's total (the total is in the row's text).
struct stacked_row {
  std::string label, text;
  std::vector<double> parts;  // in the order of stacked_chart::parts; negative ones count 0
};
struct stacked_chart {
  std::vector<legend_entry> parts;
  std::vector<stacked_row> rows;
  double width = 900;
};
std::string stacked_bar_chart_svg(const stacked_chart& chart);

}  // namespace maxkernel::cli
