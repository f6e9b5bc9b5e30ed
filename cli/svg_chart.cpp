#include "cli/svg_chart.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace maxkernel::cli {

namespace {

constexpr double label_width = 240;  // left of bar plots: the group labels
constexpr double text_width = 270;   // right of bar plots: each bar's text
constexpr size_t label_chars = 36;
constexpr const char* failure_colour = "#c62828";

bool drawable(double v) { return std::isfinite(v); }

std::string svg_open(double width, double height) {
  return fmt::format(
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
    "font-family=\"sans-serif\" font-size=\"11\">\n",
    width, height);
}

// The legend's entries in rows from (x0, y0) within `width`; returns the svg and its height.
std::pair<std::string, double> legend_svg(const std::vector<legend_entry>& legend, double x0,
                                          double y0, double width) {
  if (legend.empty())
    return {"", 0};
  std::string out;
  double x = x0, y = y0;
  for (const auto& e : legend) {
    double w = 24 + 6.5 * static_cast<double>(e.name.size());
    if (x > x0 && x + w > width) {
      x = x0;
      y += 16;
    }
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"10\" fill=\"{}\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                       x, y, html_escape(e.colour), x + 16, y + 9, html_escape(e.name));
    x += w;
  }
  return {out, y - y0 + 18};
}

// A round step (1, 2 or 5 times a power of ten) giving about `count` ticks over `span`.
double nice_step(double span, double count) {
  if (!(span > 0))
    return 1;
  double raw = span / count, power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * power)
      return m * power;
  return 10 * power;
}

std::string tick_text(double v, const std::string& unit) {
  return fmt::format("{:g}{}", std::abs(v) < 1e-12 ? 0.0 : v, unit);
}

// The horizontal axis of a bar chart: its domain, mapping and ticks.
struct bar_axis {
  chart_scale scale;
  double lo, hi, x0, x1;
  double x(double v) const {
    v = std::clamp(v, lo, hi);
    if (scale == chart_scale::log)
      return x0 + (x1 - x0) * (std::log2(v) - std::log2(lo)) / (std::log2(hi) - std::log2(lo));
    return x0 + (x1 - x0) * (v - lo) / (hi - lo);
  }
  double origin() const { return scale == chart_scale::log ? 1.0 : 0.0; }
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (scale == chart_scale::log) {
      int a = static_cast<int>(std::ceil(std::log2(lo) - 1e-9));
      int b = static_cast<int>(std::floor(std::log2(hi) + 1e-9));
      int step = b - a > 10 ? 2 : 1;
      for (int e = a; e <= b; e += step)
        out.push_back(std::ldexp(1.0, e));
      if (std::find(out.begin(), out.end(), 1.0) == out.end())
        out.push_back(1.0);
      return out;
    }
    double step = nice_step(hi - lo, 5);
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
      out.push_back(v);
    return out;
  }
};

bar_axis make_axis(const bar_chart& chart, double x0, double x1) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& g : chart.groups)
    for (const auto& b : g.bars)
      if (drawable(b.value) && (chart.scale == chart_scale::linear || b.value > 0)) {
        lo = std::min(lo, b.value);
        hi = std::max(hi, b.value);
      }
  if (chart.scale == chart_scale::log) {
    // Room on both sides of 1.0, and never wider than 1/1024..1024 (beyond is clipped).
    double l = std::isfinite(lo) ? std::min(0.5, lo / 1.25) : 0.5;
    double h = std::isfinite(hi) ? std::max(2.0, hi * 1.25) : 2.0;
    return {chart.scale, std::max(l, 1.0 / 1024), std::min(h, 1024.0), x0, x1};
  }
  double h = std::isfinite(hi) && hi > 0 ? hi * 1.05 : 1.0;
  double l = std::isfinite(lo) && lo < 0 ? lo * 1.05 : 0.0;
  double step = nice_step(h - l, 5);
  return {chart.scale, std::floor(l / step) * step, std::ceil(h / step) * step, x0, x1};
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string shorten(const std::string& s, size_t max_chars) {
  size_t chars = 0, i = 0, cut = std::string::npos;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
      continue;  // a UTF-8 continuation byte: part of the previous character
    if (chars == max_chars - std::min<size_t>(max_chars, 3))
      cut = i;
    if (++chars > max_chars)
      return s.substr(0, cut) + "...";
  }
  return s;
}

std::string bar_chart_svg(const bar_chart& chart) {
  const double bar_h = 12, bar_gap = 3, group_gap = 9, top_pad = 8;
  double x0 = label_width, x1 = std::max(chart.width - text_width, x0 + 100);
  auto [legend, legend_h] = legend_svg(chart.legend, x0, top_pad, chart.width);
  double top = top_pad + legend_h + 4, y = top, body;
  auto axis = make_axis(chart, x0, x1);
  std::string bars;
  for (const auto& g : chart.groups) {
    double group_top = y;
    for (const auto& b : g.bars) {
      double xo = axis.x(axis.origin());
      // A bar at the origin (1.0x, or a count of 0) is drawn 1 px wide on a log axis only.
      bool at_origin = chart.scale == chart_scale::linear && b.value == 0;
      if (drawable(b.value) && !at_origin &&
          (chart.scale == chart_scale::linear || b.value > 0)) {
        double xv = axis.x(b.value);
        double left = std::min(xo, xv), w = std::max(std::abs(xv - xo), 1.0);
        bars += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" "
                            "fill=\"{}\"/>\n",
                            left, y, w, bar_h, html_escape(b.colour));
      }
      if (b.failure)
        bars += fmt::format("<path d=\"M{a:.1f},{t:.1f} L{b:.1f},{u:.1f} M{a:.1f},{u:.1f} "
                            "L{b:.1f},{t:.1f}\" stroke=\"{c}\" stroke-width=\"2\"/>\n",
                            fmt::arg("a", xo - 5), fmt::arg("b", xo + 5), fmt::arg("t", y + 1),
                            fmt::arg("u", y + bar_h - 1), fmt::arg("c", failure_colour));
      bars += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>\n", x1 + 8, y + bar_h - 2,
                          b.failure ? fmt::format(" fill=\"{}\"", failure_colour) : "",
                          html_escape(shorten(b.text, 44)));
      y += bar_h + bar_gap;
    }
    if (g.bars.empty())
      y += bar_h + bar_gap;
    bars += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\"><title>{}</title>{}"
                        "</text>\n",
                        x0 - 8, group_top + bar_h - 2, html_escape(g.label),
                        html_escape(shorten(g.label, label_chars)));
    y += group_gap;
  }
  body = y;
  std::string grid;
  for (double t : axis.ticks()) {
    double x = axis.x(t);
    bool origin = t == axis.origin();
    grid += fmt::format("<line x1=\"{x:.1f}\" y1=\"{t:.1f}\" x2=\"{x:.1f}\" y2=\"{b:.1f}\" "
                        "stroke=\"{c}\"{d}/>\n<text x=\"{x:.1f}\" y=\"{l:.1f}\" "
                        "text-anchor=\"middle\">{v}</text>\n",
                        fmt::arg("x", x), fmt::arg("t", top - 2), fmt::arg("b", body),
                        fmt::arg("c", origin ? "#555" : "#ddd"),
                        fmt::arg("d", origin ? " stroke-dasharray=\"4 3\"" : ""),
                        fmt::arg("l", body + 14), fmt::arg("v", tick_text(t, chart.unit)));
  }
  double height = body + (chart.axis_label.empty() ? 22 : 36);
  std::string label;
  if (!chart.axis_label.empty())
    label = fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                        (x0 + x1) / 2, body + 30, html_escape(chart.axis_label));
  return svg_open(chart.width, height) + legend + grid +
         fmt::format("<line x1=\"{x0:.1f}\" y1=\"{b:.1f}\" x2=\"{x1:.1f}\" y2=\"{b:.1f}\" "
                     "stroke=\"black\"/>\n",
                     fmt::arg("x0", x0), fmt::arg("x1", x1), fmt::arg("b", body)) +
         bars + label + "</svg>";
}

std::string line_chart_svg(const line_chart& chart) {
  const double left = 56, right = 16, bottom = 40;
  auto [legend, legend_h] = legend_svg(
    [&] {
      std::vector<legend_entry> l;
      for (const auto& s : chart.lines)
        l.push_back({s.name, s.colour});
      return l;
    }(),
    left, 8, chart.width);
  double top = 8 + legend_h + 6, w = chart.width, h = chart.height + legend_h;
  size_t n = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : chart.lines) {
    n = std::max(n, s.ys.size());
    for (double v : s.ys)
      if (drawable(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  }
  if (std::isfinite(chart.reference_y)) {
    lo = std::min(lo, chart.reference_y);
    hi = std::max(hi, chart.reference_y);
  }
  if (!std::isfinite(lo)) {
    lo = 0;
    hi = 1;
  }
  double span = hi - lo > 0 ? hi - lo : std::max(std::abs(hi) * 0.1, 0.1);
  double ylo = lo - 0.05 * span, yhi = hi + 0.1 * span;
  if (lo >= 0)
    ylo = std::max(ylo, 0.0);
  double plot_b = h - bottom, plot_r = w - right;
  double nx = static_cast<double>(std::max<size_t>(n, 1));
  auto x = [&](double i) { return left + (plot_r - left) * i / nx; };
  auto y = [&](double v) { return plot_b - (plot_b - top) * (v - ylo) / (yhi - ylo); };
  std::string out = svg_open(w, h) + legend;
  double ystep = nice_step(yhi - ylo, 5);
  for (double v = std::ceil(ylo / ystep) * ystep; v <= yhi + 1e-9 * ystep; v += ystep)
    out += fmt::format("<line x1=\"{l:.1f}\" y1=\"{y:.1f}\" x2=\"{r:.1f}\" y2=\"{y:.1f}\" "
                       "stroke=\"#eee\"/><text x=\"{tx:.1f}\" y=\"{ty:.1f}\" "
                       "text-anchor=\"end\">{v}</text>\n",
                       fmt::arg("l", left), fmt::arg("r", plot_r), fmt::arg("y", y(v)),
                       fmt::arg("tx", left - 4), fmt::arg("ty", y(v) + 4),
                       fmt::arg("v", tick_text(v, chart.y_unit)));
  double xstep = std::max(1.0, std::round(nice_step(nx, 8)));
  for (double k = xstep; k <= nx + 1e-9 && n > 0; k += xstep)
    out += fmt::format("<line x1=\"{x:.1f}\" y1=\"{b:.1f}\" x2=\"{x:.1f}\" y2=\"{c:.1f}\" "
                       "stroke=\"black\"/><text x=\"{x:.1f}\" y=\"{t:.1f}\" "
                       "text-anchor=\"middle\">{k:.0f}</text>\n",
                       fmt::arg("x", x(k)), fmt::arg("b", plot_b), fmt::arg("c", plot_b + 4),
                       fmt::arg("t", plot_b + 15), fmt::arg("k", k));
  out += fmt::format("<line x1=\"{l:.1f}\" y1=\"{b:.1f}\" x2=\"{r:.1f}\" y2=\"{b:.1f}\" "
                     "stroke=\"black\"/>\n<line x1=\"{l:.1f}\" y1=\"{t:.1f}\" x2=\"{l:.1f}\" "
                     "y2=\"{b:.1f}\" stroke=\"black\"/>\n<text x=\"{cx:.1f}\" y=\"{ly:.1f}\" "
                     "text-anchor=\"middle\">{xl}</text>\n",
                     fmt::arg("l", left), fmt::arg("r", plot_r), fmt::arg("b", plot_b),
                     fmt::arg("t", top), fmt::arg("cx", (left + plot_r) / 2),
                     fmt::arg("ly", h - 6), fmt::arg("xl", html_escape(chart.x_label)));
  if (std::isfinite(chart.reference_y))
    out += fmt::format("<line x1=\"{l:.1f}\" y1=\"{y:.1f}\" x2=\"{r:.1f}\" y2=\"{y:.1f}\" "
                       "stroke=\"#555\" stroke-dasharray=\"4 3\"/>\n",
                       fmt::arg("l", left), fmt::arg("r", plot_r),
                       fmt::arg("y", y(chart.reference_y)));
  if (n == 0)
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">no data</text>\n",
                       (left + plot_r) / 2, (top + plot_b) / 2);
  for (const auto& s : chart.lines) {
    std::string path;
    bool open = false;
    for (size_t i = 0; i < s.ys.size(); ++i) {
      if (!drawable(s.ys[i])) {
        open = false;
        continue;
      }
      double a = x(static_cast<double>(i)), b = x(static_cast<double>(i + 1)), v = y(s.ys[i]);
      path += fmt::format("{}{:.1f},{:.1f} L{:.1f},{:.1f} ", open ? "L" : "M", a, v, b, v);
      open = true;
    }
    if (!path.empty())
      out += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\">"
                         "<title>{}</title></path>\n",
                         path, html_escape(s.colour), html_escape(s.name));
  }
  return out + "</svg>";
}

std::string stacked_bar_chart_svg(const stacked_chart& chart) {
  const double bar_h = 14, gap = 6;
  double x0 = label_width, x1 = std::max(chart.width - text_width, x0 + 100);
  auto [legend, legend_h] = legend_svg(chart.parts, x0, 8, chart.width);
  double y = 8 + legend_h + 4;
  std::string rows;
  for (const auto& r : chart.rows) {
    double total = 0;
    for (double p : r.parts)
      total += drawable(p) && p > 0 ? p : 0;
    if (total > 0) {
      double x = x0;
      for (size_t i = 0; i < r.parts.size(); ++i) {
        double p = drawable(r.parts[i]) && r.parts[i] > 0 ? r.parts[i] : 0;
        if (p <= 0)
          continue;
        double w = (x1 - x0) * p / total;
        const legend_entry* part = i < chart.parts.size() ? &chart.parts[i] : nullptr;
        std::string pct = fmt::format("{:.0f}%", 100 * p / total);
        rows += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" "
                            "fill=\"{}\"><title>{}: {}</title></rect>\n",
                            x, y, w, bar_h, part ? html_escape(part->colour) : "#999",
                            part ? html_escape(part->name) : "other", pct);
        if (w > 32)
          rows += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
                              "fill=\"white\">{}</text>\n",
                              x + w / 2, y + bar_h - 3, pct);
        x += w;
      }
    } else {
      rows += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" "
                          "fill=\"none\" stroke=\"#999\"/>\n",
                          x0, y, x1 - x0, bar_h);
    }
    rows += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\"><title>{}</title>{}"
                        "</text>\n<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                        x0 - 8, y + bar_h - 3, html_escape(r.label),
                        html_escape(shorten(r.label, label_chars)), x1 + 8, y + bar_h - 3,
                        html_escape(shorten(r.text, 44)));
    y += bar_h + gap;
  }
  return svg_open(chart.width, y + 4) + legend + rows + "</svg>";
}

}  // namespace maxkernel::cli
