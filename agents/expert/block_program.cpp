#include "agents/expert/block_program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace maxkernel::agents::expert {

int64_t space_axis::extent() const {
  int64_t n = 1;
  for (auto f : factors)
    n *= f;
  return n;
}

std::string space_axis::extent_expr() const {
  if (factor_exprs.empty())
    return "1";
  if (factor_exprs.size() == 1)
    return factor_exprs[0];
  std::string s = "(";
  for (size_t i = 0; i < factor_exprs.size(); ++i)
    s += (i ? " * " : "") + factor_exprs[i];
  return s + ")";
}

bool map_dims_to_factors(const std::vector<int64_t>& shape,
                         const std::vector<space_axis>& space, std::vector<dim_map>& dims) {
  dims.assign(shape.size(), dim_map{});
  size_t a = 0, f = 0;
  auto skip_units = [&] {
    while (a < space.size()) {
      if (f >= space[a].factors.size()) {
        ++a;
        f = 0;
      } else if (space[a].factors[f] == 1) {
        ++f;
      } else {
        break;
      }
    }
  };
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1)
      continue;
    skip_units();
    if (a >= space.size())
      return false;
    int64_t prod = 1;
    int lo = static_cast<int>(f);
    while (f < space[a].factors.size() && prod < shape[d])
      prod *= space[a].factors[f++];
    if (prod != shape[d])
      return false;
    dims[d] = {static_cast<int>(a), lo, static_cast<int>(f)};
  }
  skip_units();
  return a >= space.size();
}

namespace {

// ---------------------------------------------------------------------------- small helpers

char kind_of(const std::string& dtype) {
  if (dtype == "bool")
    return 'b';
  if (dtype.rfind("int", 0) == 0 || dtype.rfind("uint", 0) == 0)
    return 'i';
  return 'f';
}

bool narrow_float(const std::string& dtype) {
  return dtype == "bfloat16" || dtype == "float16" || dtype.rfind("float8", 0) == 0;
}

std::string py_float(double v) {
  if (std::isnan(v))
    return "float(\"nan\")";
  if (std::isinf(v))
    return v > 0 ? "float(\"inf\")" : "float(\"-inf\")";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

// Replaces {0}, {1}, ... in `pattern` by args.
std::string render(const std::string& pattern, const std::vector<std::string>& args) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{' && i + 2 < pattern.size() && std::isdigit(pattern[i + 1]) &&
        pattern[i + 2] == '}') {
      size_t k = static_cast<size_t>(pattern[i + 1] - '0');
      out += k < args.size() ? args[k] : std::string("?");
      i += 2;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

const std::map<std::string, std::string>& unary_ops() {
  static const std::map<std::string, std::string> ops = {
      {"neg", "(-{0})"},
      {"abs", "jnp.abs({0})"},
      {"sign", "jnp.sign({0})"},
      {"floor", "jnp.floor({0})"},
      {"ceil", "jnp.ceil({0})"},
      {"exp", "jnp.exp({0})"},
      {"exp2", "jnp.exp2({0})"},
      {"log", "jnp.log({0})"},
      {"log1p", "jnp.log1p({0})"},
      {"expm1", "(jnp.exp({0}) - 1.0)"},  // no Mosaic rule for expm1
      {"tanh", "jnp.tanh({0})"},
      {"logistic", "jax.nn.sigmoid({0})"},
      {"erf", "jax.lax.erf({0})"},
      {"erfc", "(1.0 - jax.lax.erf({0}))"},  // no Mosaic rule for erfc
      {"erf_inv", "jax.lax.erf_inv({0})"},
      {"sqrt", "jnp.sqrt({0})"},
      {"rsqrt", "jax.lax.rsqrt({0})"},
      {"square", "({0} * {0})"},
      {"reciprocal", "(1.0 / {0})"},
      {"sin", "jnp.sin({0})"},
      {"cos", "jnp.cos({0})"},
      {"tan", "jnp.tan({0})"},
      {"is_finite", "jnp.isfinite({0})"},
      {"not", "(~{0})"},
  };
  return ops;
}

const std::map<std::string, std::string>& binary_ops() {
  static const std::map<std::string, std::string> ops = {
      {"add", "({0} + {1})"},          {"add_any", "({0} + {1})"},
      {"sub", "({0} - {1})"},          {"mul", "({0} * {1})"},
      {"max", "jnp.maximum({0}, {1})"}, {"min", "jnp.minimum({0}, {1})"},
      {"pow", "jax.lax.pow({0}, {1})"}, {"atan2", "jax.lax.atan2({0}, {1})"},
      {"rem", "jax.lax.rem({0}, {1})"}, {"and", "({0} & {1})"},
      {"or", "({0} | {1})"},           {"xor", "({0} ^ {1})"},
      {"eq", "({0} == {1})"},          {"ne", "({0} != {1})"},
      {"lt", "({0} < {1})"},           {"le", "({0} <= {1})"},
      {"gt", "({0} > {1})"},           {"ge", "({0} >= {1})"},
  };
  return ops;
}

// Ops that pass their operand through unchanged (in f32 block form).
bool identity_op(const std::string& p) {
  return p == "stop_gradient" || p == "copy" || p == "copy_p" || p == "optimization_barrier" ||
         p == "pvary" || p == "broadcast_in_dim" || p == "reshape" || p == "squeeze" ||
         p == "expand_dims";
}

bool transcendental(const std::string& p) {
  static const std::set<std::string> t = {"exp", "exp2", "log", "log1p", "expm1", "tanh",
                                          "logistic", "erf", "erfc", "erf_inv", "sqrt",
                                          "rsqrt", "sin", "cos", "tan", "pow", "reciprocal"};
  return t.count(p) > 0;
}

// ---------------------------------------------------------------------------- the IR

// A graph input (or a value computed from graph inputs only) whose layout is not known yet:
// its first consumer that knows the layout binds the inputs. Input dim i is value dim pos[i]
// (-1: a unit dim of the input).
struct source {
  int input = -1;
  std::vector<int> pos;
};

struct val {
  bool known = false;               // layout known; else pending on `sources`
  std::vector<source> sources;
  std::vector<int64_t> shape;
  std::string dtype;
  char kind = 'f';
  std::vector<dim_map> dims;
  std::vector<bool> present, mat;  // per space axis: spans it / holds it materialised
  // Per space axis: how many leading factors it spans. Below the axis's full level the value
  // is COARSE (one element per group of the trailing factors, as after a GroupNorm's mean).
  std::vector<int> level;
  std::string var;                 // python name or literal text
  bool is_const = false;           // a scalar known at generation time (literals folded)
  double cval = 0;
  double count = 0;                // elements a reduce_sum summed into it (mean detection)
  std::string count_text;           // Python expression of `count` at trace time
};

struct stmt {
  std::string var;
  std::string expr;                 // pattern over {k} = args[k]
  std::vector<std::string> args;
  std::vector<bool> present;
  char kind = 'f';
  // Reductions (a pick is the one-hot sum of a gather)
  std::string red;                  // "", sum, max, min, argmax, argmin, and, or, pick
  std::vector<int> axes;
  std::string prim;
  bool pending = false;             // computed from graph inputs of then unknown layout
};

std::string combine_update(const std::string& red, const std::string& acc,
                           const std::string& part) {
  if (red == "max")
    return "jnp.maximum(" + acc + ", " + part + ")";
  if (red == "min")
    return "jnp.minimum(" + acc + ", " + part + ")";
  return "(" + acc + " + " + part + ")";
}

class builder {
public:
  builder(const graph_view& g, const block_request& r, block_program& out)
      : g_(g), req_(r), out_(out) {}

  bool run(std::string& reason);

private:
  const graph_view& g_;
  const block_request& req_;
  block_program& out_;
  std::vector<space_axis> space_;           // the request's, with factors refined
  std::vector<block_seed> seeds_;           // the request's, over the refined factors
  // A reshape that splits factor `factor` of `axis` into (parts, size / parts): the parts
  // (a group count) are taken to be constant, the rest scales with the axis.
  struct refinement {
    int axis = -1, factor = -1;
    int64_t parts = 0;
    bool trailing = false;  // (size / parts, parts): the trailing part is the constant
  } refine_;
  std::string why_;

  std::vector<int> kaxis_;                  // space axis -> kernel dim (-1 squeezed)
  int kdims_ = 0;
  std::map<int, val> nodes_;                // node id -> value
  // Seeds that are one result of a multi-result node (a half of jnp.split): (id, result).
  std::map<std::pair<int, int>, val> results_;
  std::map<int, val> inputs_;               // graph input -> value (seeds and extras)
  std::map<int, int> seed_of_input_;        // graph input -> seed index
  std::map<int, int> seed_of_node_;
  std::vector<int> program_;                // node ids in graph order
  std::vector<stmt> stmts_;
  std::map<int64_t, int> gathered_axis_;   // extent -> space axis, of gathered axes
  std::map<int64_t, int> gathered_found_;
  int var_counter_ = 0;

  bool fail(const std::string& w) {
    if (why_.empty())
      why_ = w;
    return false;
  }
  int naxes() const { return static_cast<int>(space_.size()); }
  std::string node_desc(int id) const { return fmt::format("{} (node {})", g_.primitive(id), id); }

  bool collect();
  bool check_value(val& v, const std::string& what);
  std::vector<dim_map> factor_order(const std::vector<dim_map>& dims) const;
  bool in_factor_order(const std::vector<dim_map>& dims) const;
  bool slice_member(int id, val& r);
  void finish_presence(val& v);
  bool positional(const std::vector<int64_t>& shape, size_t j, dim_map& m) const;
  bool operand_val(int node, unsigned k, val& v, bool allow_unknown_input);
  bool bind_input(int input, const std::vector<dim_map>& dims, val& out);
  bool resolve(val& v, const std::vector<dim_map>& dims, const std::string& what);
  bool reshape_map(const std::vector<int64_t>& from, const std::vector<dim_map>& from_dims,
                   const std::vector<int64_t>& to, std::vector<dim_map>& to_dims);
  bool process(int id);
  bool elementwise(int id, const std::string& p);
  bool literal_text(int id, unsigned k, const val& v, const val* other, std::string& text);
  bool fold(const std::string& p, const std::vector<val>& ops, char kind, double& out) const;
  std::string materialize(const val& v, const std::vector<int>& axes);
  std::string materialize_expr(const val& v, const std::vector<int>& axes) const;
  std::string broadcast_shape(const val& v) const;
  std::string shape_tuple(const std::vector<bool>& present) const;
  std::string add_stmt(stmt s);
  std::string count_expr(const std::vector<int>& axes) const;
  int full_level(int a) const;
  int64_t const_prefix(int a, int level) const;   // -1 when a factor is not a constant
  bool coarse(const val& v, int a) const;
  int64_t pool_of(const val& v, int a) const;     // > 1: pooled along a (group size)
  bool pooled(const val& v, int a) const { return pool_of(v, a) > 1; }
  std::string kernel_size(const val& v, int a) const;  // the value's size along a, in code
  std::string onehot(const std::string& cur, const std::string& groups) const;
  std::string adapt(const val& v, const std::vector<int>& level);
  bool has_coarse_ = false;
  bool emit_full();
  void emit_streamed();
  bool streamed(std::string& code, std::string& why);
  std::string prologue(bool with_seeds, const std::set<std::string>& used) const;
  bool apply_refinement();
};

void builder::finish_presence(val& v) {
  v.present.assign(static_cast<size_t>(naxes()), false);
  v.level.assign(static_cast<size_t>(naxes()), 0);
  for (auto& d : v.dims)
    if (!d.unit()) {
      v.present[static_cast<size_t>(d.axis)] = true;
      auto& l = v.level[static_cast<size_t>(d.axis)];
      l = std::max(l, d.hi);
    }
  for (int a = 0; a < naxes(); ++a)
    if (v.present[static_cast<size_t>(a)] && v.level[static_cast<size_t>(a)] >= full_level(a))
      v.level[static_cast<size_t>(a)] = static_cast<int>(space_[static_cast<size_t>(a)].factors.size());
}

int builder::full_level(int a) const {
  const auto& f = space_[static_cast<size_t>(a)].factors;
  int last = 0;
  for (size_t i = 0; i < f.size(); ++i)
    if (f[i] != 1)
      last = static_cast<int>(i) + 1;
  return last;
}

int64_t builder::const_prefix(int a, int level) const {
  const auto& ax = space_[static_cast<size_t>(a)];
  int64_t n = 1;
  for (int i = 0; i < level; ++i) {
    const auto& e = ax.factor_exprs[static_cast<size_t>(i)];
    if (e.empty() || !std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(c); }))
      return ax.factors[static_cast<size_t>(i)] == 1 ? n : -1;
    n *= std::stoll(e);
  }
  return n;
}

bool builder::coarse(const val& v, int a) const {
  if (v.level.size() != static_cast<size_t>(naxes()))
    return false;
  int l = v.level[static_cast<size_t>(a)];
  return l > 0 && l < full_level(a) && const_prefix(a, l) > 0;
}

// Product of the trailing factors a value does not span along a, when they are all
// constants and the leading ones are not (one value per group of adjacent elements).
int64_t builder::pool_of(const val& v, int a) const {
  if (v.level.size() != static_cast<size_t>(naxes()))
    return 0;
  int l = v.level[static_cast<size_t>(a)];
  if (l <= 0 || l >= full_level(a) || const_prefix(a, l) > 0)
    return 0;
  const auto& ax = space_[static_cast<size_t>(a)];
  int64_t n = 1;
  for (size_t i = static_cast<size_t>(l); i < ax.factors.size(); ++i) {
    const auto& e = ax.factor_exprs[i];
    if (e.empty() || !std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(c); }))
      return ax.factors[i] == 1 ? n : 0;
    n *= std::stoll(e);
  }
  return n;
}

std::string builder::kernel_size(const val& v, int a) const {
  if (coarse(v, a))
    return std::to_string(const_prefix(a, v.level[static_cast<size_t>(a)]));
  if (pooled(v, a))
    return fmt::format("(_blk[{}] // {})", kaxis_[static_cast<size_t>(a)], pool_of(v, a));
  return fmt::format("_blk[{}]", kaxis_[static_cast<size_t>(a)]);
}

// (cur, groups) one-hot matrix: column g gathers rows g*cur/groups .. (g+1)*cur/groups - 1.
std::string builder::onehot(const std::string& cur, const std::string& groups) const {
  return fmt::format("(jax.lax.broadcasted_iota(jnp.int32, ({0}, {1}), 0) // ({0} // {1}) == "
                     "jax.lax.broadcasted_iota(jnp.int32, ({0}, {1}), 1)).astype(jnp.float32)",
                     cur, groups);
}

// The value expanded along its coarse axes to `level` (each group element repeated), by a
// one-hot matmul on the MXU (exact at HIGHEST precision).
std::string builder::adapt(const val& v, const std::vector<int>& level) {
  std::string var = v.var;
  for (int a = 0; a < naxes(); ++a) {
    if (!coarse(v, a) || level[static_cast<size_t>(a)] <= v.level[static_cast<size_t>(a)])
      continue;
    val target = v;
    target.level[static_cast<size_t>(a)] = level[static_cast<size_t>(a)];
    std::string cur = kernel_size(target, a), groups = kernel_size(v, a);
    stmt s;
    s.present = v.present;
    s.kind = 'f';
    s.prim = "expand";
    s.args = {var};
    s.expr = "jax.lax.dot_general({0}, " + onehot(cur, groups) +
             ", (((" + std::to_string(kaxis_[static_cast<size_t>(a)]) +
             ",), (1,)), ((), ())), precision=jax.lax.Precision.HIGHEST, "
             "preferred_element_type=jnp.float32)";
    var = add_stmt(s);
  }
  return var;
}

// Every dim spans whole factors; dims of one axis consecutive and in order, covering every
// factor of size > 1; axes in increasing order along the dims.
// The dims in factor order: with member-outer pooling the lane axis's member dims may come
// first in the reference's layout (see block_request::member_outer); the block is
// member-major either way, so the checks below read them sorted.
std::vector<dim_map> builder::factor_order(const std::vector<dim_map>& dims) const {
  std::vector<dim_map> out = dims;
  if (!req_.member_outer || kdims_ == 0)
    return out;
  std::vector<size_t> at;
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].unit() && kaxis_[static_cast<size_t>(out[i].axis)] == kdims_ - 1)
      at.push_back(i);
  std::vector<dim_map> lane;
  for (size_t i : at)
    lane.push_back(out[i]);
  std::stable_sort(lane.begin(), lane.end(),
                   [](const dim_map& a, const dim_map& b) { return a.lo < b.lo; });
  for (size_t j = 0; j < at.size(); ++j)
    out[at[j]] = lane[j];
  return out;
}

bool builder::in_factor_order(const std::vector<dim_map>& dims) const {
  return factor_order(dims) == dims;
}

bool builder::check_value(val& v, const std::string& what) {
  finish_presence(v);
  int last_axis = -1, next_lo = 0;
  for (auto& d : factor_order(v.dims)) {
    if (d.unit())
      continue;
    if (d.axis != last_axis) {
      if (d.axis < last_axis)
        return fail(what + ": dims in another order than the space's axes (a transpose)");
      if (last_axis >= 0) {
        auto& f = space_[static_cast<size_t>(last_axis)].factors;
        for (size_t i = static_cast<size_t>(next_lo); i < f.size(); ++i)
          if (f[i] != 1)
            return fail(what + ": spans part of space axis " + std::to_string(last_axis));
      }
      auto& f = space_[static_cast<size_t>(d.axis)].factors;
      for (int i = 0; i < d.lo; ++i)
        if (f[static_cast<size_t>(i)] != 1)
          return fail(what + ": spans part of space axis " + std::to_string(d.axis));
      last_axis = d.axis;
    } else if (d.lo < next_lo) {
      return fail(what + ": dims of one axis out of order");
    } else {
      auto& f = space_[static_cast<size_t>(d.axis)].factors;
      for (int i = next_lo; i < d.lo; ++i)
        if (f[static_cast<size_t>(i)] != 1)
          return fail(what + ": spans part of space axis " + std::to_string(d.axis));
    }
    next_lo = d.hi;
  }
  if (last_axis >= 0) {
    auto& f = space_[static_cast<size_t>(last_axis)].factors;
    for (size_t i = static_cast<size_t>(next_lo); i < f.size(); ++i)
      if (f[i] != 1) {
        // Coarse: the leading factors of the lane axis, all constants (group counts).
        if (kaxis_[static_cast<size_t>(last_axis)] == kdims_ - 1 &&
            const_prefix(last_axis, next_lo) > 0) {
          has_coarse_ = true;
          return true;
        }
        // Pooled: the trailing factors of the lane axis, all constants (group sizes).
        if (kaxis_[static_cast<size_t>(last_axis)] == kdims_ - 1 && pooled(v, last_axis))
          return true;
        return fail(what + ": spans part of space axis " + std::to_string(last_axis));
      }
  }
  return true;
}

bool builder::positional(const std::vector<int64_t>& shape, size_t j, dim_map& m) const {
  for (const auto& s : seeds_) {
    auto sshape = g_.shape(s.value);
    if (sshape.size() == shape.size() && j < s.dims.size() && sshape[j] == shape[j] &&
        !s.dims[j].unit()) {
      m = s.dims[j];
      return true;
    }
  }
  return false;
}

bool builder::collect() {
  for (size_t i = 0; i < seeds_.size(); ++i) {
    const auto& s = seeds_[i];
    if (s.value.is_input())
      seed_of_input_[s.value.id] = static_cast<int>(i);
    else if (s.value.is_node())
      seed_of_node_[s.value.id] = static_cast<int>(i);
    else
      return fail("seed " + std::to_string(i) + " is neither a node nor an input");
  }
  std::set<int> seen;
  std::vector<int> stack;
  for (const auto& o : req_.outputs) {
    if (o.is_node() && !seed_of_node_.count(o.id))
      stack.push_back(o.id);
    else if (o.is_input() && !seed_of_input_.count(o.id))
      return fail("an output is graph input " + std::to_string(o.id) + " passed through");
    else if (!o.is_node() && !o.is_input())
      return fail("an output has no producer");
  }
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second)
      continue;
    if (g_.in_loop(id))
      return fail(node_desc(id) + " runs inside a loop");
    for (unsigned k = 0; k < g_.operand_count(id); ++k) {
      auto v = g_.operand(id, k);
      if (v.is_node() && !seed_of_node_.count(v.id))
        stack.push_back(v.id);
      else if (v.what == value_ref::kind::unknown)
        return fail(node_desc(id) + " reads a constant array or an unknown value");
    }
  }
  program_.assign(seen.begin(), seen.end());
  std::sort(program_.begin(), program_.end());
  return true;
}

std::string builder::shape_tuple(const std::vector<bool>& present) const {
  std::string s = "(";
  for (int a = 0; a < naxes(); ++a) {
    int k = kaxis_[static_cast<size_t>(a)];
    if (k < 0)
      continue;
    s += present[static_cast<size_t>(a)] ? fmt::format("_blk[{}]", k) : "1";
    s += ", ";
  }
  if (kdims_ > 1)
    s.resize(s.size() - 2);
  else if (kdims_ == 1)
    s.resize(s.size() - 1);
  return s + ")";
}

std::string builder::materialize(const val& v, const std::vector<int>& axes) {
  std::string e = materialize_expr(v, axes);
  if (e == v.var)
    return e;
  stmt s;
  s.present = v.present;
  s.kind = v.kind;
  s.prim = "broadcast_to";
  s.args = {v.var};
  s.expr = "jnp.broadcast_to({0}, " + broadcast_shape(v) + ")";
  return add_stmt(s);
}

std::string builder::materialize_expr(const val& v, const std::vector<int>& axes) const {
  bool need = false;
  for (int a : axes)
    if (v.present[static_cast<size_t>(a)] && !v.mat[static_cast<size_t>(a)] &&
        kaxis_[static_cast<size_t>(a)] >= 0)
      need = true;
  if (!need)
    return v.var;
  return "jnp.broadcast_to(" + v.var + ", " + broadcast_shape(v) + ")";
}

std::string builder::broadcast_shape(const val& v) const {
  std::string shape = "(";
  for (int a = 0; a < naxes(); ++a) {
    if (kaxis_[static_cast<size_t>(a)] < 0)
      continue;
    shape += (v.present[static_cast<size_t>(a)] ? kernel_size(v, a) : std::string("1")) + ", ";
  }
  return shape + ")";
}

std::string builder::add_stmt(stmt s) {
  // The same value computed twice is computed once (a variance recomputes its mean; a mean
  // and an rstd are expanded back over a group by the same one-hot dot): plain statements
  // only, not reductions across blocks or ones whose layout is still open.
  if (s.red.empty() && !s.pending) {
    for (const auto& t : stmts_)
      if (t.red.empty() && !t.pending && t.expr == s.expr && t.args == s.args &&
          t.kind == s.kind && t.prim == s.prim && t.present == s.present)
        return t.var;
  }
  if (s.var.empty())
    s.var = "b" + std::to_string(var_counter_++);
  stmts_.push_back(s);
  return stmts_.back().var;
}

std::string builder::count_expr(const std::vector<int>& axes) const {
  std::string s;
  for (int a : axes)
    s += (s.empty() ? "" : " * ") + fmt::format("extents[{}]", a);
  return s.empty() ? "1" : "(" + s + ")";
}

bool builder::bind_input(int input, const std::vector<dim_map>& dims, val& out) {
  auto it = inputs_.find(input);
  if (it != inputs_.end()) {
    if (it->second.dims != dims)
      return fail("graph input " + std::to_string(input) +
                  " is used with two different layouts");
    out = it->second;
    return true;
  }
  val v;
  v.known = true;
  value_ref ref;
  ref.what = value_ref::kind::input;
  ref.id = input;
  v.shape = g_.shape(ref);
  v.dtype = g_.dtype(ref);
  v.kind = kind_of(v.dtype);
  v.dims = dims;
  for (size_t d = 0; d < dims.size() && d < v.shape.size(); ++d)
    if (dims[d].unit() && v.shape[d] != 1)
      return fail("cannot tell which space axis dim " + std::to_string(d) + " of graph input " +
                  std::to_string(input) + " runs along");
  if (!check_value(v, "graph input " + std::to_string(input)))
    return false;
  int pool_axis = -1;
  for (int a = 0; a < naxes(); ++a) {
    if (coarse(v, a))
      return fail("graph input " + std::to_string(input) + " holds one value per group");
    if (pooled(v, a)) {
      // One value per group of the lane axis, as the pooled values it meets (natural order).
      if (out_.pool_axis >= 0 && (out_.pool_axis != a || out_.pool != pool_of(v, a)))
        return fail("graph input " + std::to_string(input) + " is pooled otherwise");
      pool_axis = a;
    }
  }
  v.mat = v.present;
  block_operand op;
  op.input = input;
  op.shape = v.shape;
  op.dtype = v.dtype;
  op.dims = dims;
  op.present = v.present;
  op.pooled = pool_axis >= 0;
  if (op.pooled) {
    out_.pool_axis = pool_axis;
    out_.pool = pool_of(v, pool_axis);
  }
  op.scalar = std::none_of(v.present.begin(), v.present.end(), [](bool b) { return b; });
  if (op.scalar) {
    op.space_shape = "(1,)";
  } else {
    std::string s = "(";
    for (int a = 0; a < naxes(); ++a) {
      const auto& ax = space_[static_cast<size_t>(a)];
      std::string e = "1";
      if (op.present[static_cast<size_t>(a)] && a == pool_axis) {
        e.clear();  // the groups only: the leading factors
        for (int f = 0; f < v.level[static_cast<size_t>(a)]; ++f)
          e += (e.empty() ? "" : " * ") + ax.factor_exprs[static_cast<size_t>(f)];
        e = "(" + e + ")";
      } else if (op.present[static_cast<size_t>(a)]) {
        e = ax.extent_expr();
      }
      s += e + ", ";
    }
    s.resize(s.size() - 2);
    op.space_shape = s + (naxes() == 1 ? ",)" : ")");
  }
  out_.operands.push_back(op);
  v.var = "in" + std::to_string(input);
  inputs_[input] = v;
  out = v;
  return true;
}

// Binds the graph inputs behind a pending value now that its dims are known.
bool builder::resolve(val& v, const std::vector<dim_map>& dims, const std::string& what) {
  if (v.known)
    return true;
  if (dims.size() != v.shape.size())
    return fail(what + ": rank mismatch while placing graph inputs");
  std::vector<bool> mat(static_cast<size_t>(naxes()), false);
  for (auto& src : v.sources) {
    std::vector<dim_map> idims(src.pos.size());
    for (size_t i = 0; i < src.pos.size(); ++i)
      if (src.pos[i] >= 0)
        idims[i] = dims[static_cast<size_t>(src.pos[i])];
    val bound;
    if (!bind_input(src.input, idims, bound))
      return false;
    for (int a = 0; a < naxes(); ++a)
      if (bound.present[static_cast<size_t>(a)])
        mat[static_cast<size_t>(a)] = true;
  }
  v.known = true;
  v.sources.clear();
  v.dims = dims;
  if (!check_value(v, what))
    return false;
  v.mat = mat;
  return true;
}

bool builder::operand_val(int node, unsigned k, val& v, bool allow_unknown_input) {
  auto ref = g_.operand(node, k);
  if (ref.is_node() && ref.result >= 0 && results_.count({ref.id, ref.result})) {
    v = results_.at({ref.id, ref.result});
    return true;
  }
  if (ref.is_node()) {
    auto it = nodes_.find(ref.id);
    if (it == nodes_.end())
      return fail(node_desc(node) + ": operand " + std::to_string(k) + " was not computed");
    v = it->second;
    if (!v.known && !allow_unknown_input)
      return fail(node_desc(node) + ": cannot tell how the graph inputs it reads line up with "
                                    "the space");
    return true;
  }
  if (ref.is_input()) {
    auto it = inputs_.find(ref.id);
    if (it != inputs_.end()) {
      v = it->second;
      return true;
    }
    v = val{};
    v.known = false;
    v.shape = g_.shape(ref);
    v.dtype = g_.dtype(ref);
    v.kind = kind_of(v.dtype);
    v.var = "in" + std::to_string(ref.id);
    if (v.shape.empty() || std::all_of(v.shape.begin(), v.shape.end(),
                                       [](int64_t d) { return d == 1; })) {
      std::vector<dim_map> dims(v.shape.size());
      return bind_input(ref.id, dims, v);
    }
    source src;
    src.input = ref.id;
    for (size_t i = 0; i < v.shape.size(); ++i)
      src.pos.push_back(v.shape[i] == 1 ? -1 : static_cast<int>(i));
    v.sources = {src};
    return true;
  }
  if (ref.is_literal()) {
    v = val{};
    v.known = true;
    auto t = g_.node(node).getOperands()[k];
    v.shape = to_vector(t.getShape());
    v.dtype = t.getDtype().cStr();
    v.kind = kind_of(v.dtype);
    v.dims.assign(v.shape.size(), dim_map{});
    finish_presence(v);
    v.mat = v.present;
    v.var = "";  // filled by literal_text
    auto j = nlohmann::json::parse(ref.literal, nullptr, false);
    if (j.is_boolean()) {
      v.cval = j.get<bool>() ? 1 : 0;
    } else if (j.is_number()) {
      v.cval = j.get<double>();
    } else if (j.is_string() && (j == "inf" || j == "-inf" || j == "nan")) {
      auto t = j.get<std::string>();
      v.cval = t == "inf" ? INFINITY : t == "-inf" ? -INFINITY : NAN;
    } else {
      return fail(node_desc(node) + ": literal " + ref.literal + " is not a scalar number");
    }
    v.is_const = true;
    return true;
  }
  return fail(node_desc(node) + ": operand " + std::to_string(k) + " is an unknown value");
}

// The Python text of a constant operand (a literal or a folded scalar), in the operand's kind.
bool builder::literal_text(int id, unsigned k, const val& v, const val* other,
                           std::string& text) {
  double x = v.cval;
  bool finite = std::isfinite(x);
  auto p = g_.primitive(id);
  // A mean's divisor (or its reciprocal) that counts the elements summed: the runtime count.
  if (finite && other && other->count > 0 && v.kind == 'f') {
    if (p == "div" && k == 1 && std::abs(x - other->count) < 0.5) {
      text = other->count_text;
      return true;
    }
    if (p == "mul" && std::abs(x * other->count - 1.0) < 1e-6) {
      text = "(1.0 / " + other->count_text + ")";
      return true;
    }
  }
  if (v.kind == 'i') {
    auto n = static_cast<int64_t>(x);
    if (finite && static_cast<double>(n) == x && gathered_axis_.count(n) && n > 1) {
      text = fmt::format("extents[{}]", gathered_axis_.at(n));
      return true;
    }
    text = std::to_string(n);
    return true;
  }
  if (v.kind == 'b') {
    text = x != 0 ? "True" : "False";
    return true;
  }
  text = py_float(x);
  return true;
}

// Folds scalar arithmetic on constants (N - ddof of jnp.var, casts of literals ...).
bool builder::fold(const std::string& p, const std::vector<val>& ops, char kind,
                   double& out) const {
  auto n = ops.size();
  double a = n > 0 ? ops[0].cval : 0, b = n > 1 ? ops[1].cval : 0;
  if (p == "convert_element_type" && n == 1) {
    out = kind == 'i' ? std::trunc(a) : kind == 'b' ? (a != 0) : a;
  } else if (p == "neg" && n == 1) {
    out = -a;
  } else if ((p == "add" || p == "add_any") && n == 2) {
    out = a + b;
  } else if (p == "sub" && n == 2) {
    out = a - b;
  } else if (p == "mul" && n == 2) {
    out = a * b;
  } else if (p == "div" && n == 2 && kind == 'f') {
    out = a / b;
  } else if (p == "max" && n == 2) {
    out = std::max(a, b);
  } else if (p == "min" && n == 2) {
    out = std::min(a, b);
  } else if ((p == "gt" || p == "ge" || p == "lt" || p == "le" || p == "eq" || p == "ne") &&
             n == 2) {
    out = p == "gt" ? a > b : p == "ge" ? a >= b : p == "lt" ? a < b : p == "le" ? a <= b
        : p == "eq" ? a == b : a != b;
  } else {
    return false;
  }
  if (kind == 'f' && n > 0 && ops[0].kind == 'f') {
    // f32 arithmetic: round like the reference would
    out = static_cast<double>(static_cast<float>(out));
  }
  return true;
}

// Maps `to`'s dims from `from`'s through a reshape: unit dims aside, runs of dims with
// equal products line up, and must split along whole factors of one axis.
bool builder::reshape_map(const std::vector<int64_t>& from, const std::vector<dim_map>& from_dims,
                          const std::vector<int64_t>& to, std::vector<dim_map>& to_dims) {
  to_dims.assign(to.size(), dim_map{});
  std::vector<size_t> fi, ti;
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1)
      fi.push_back(i);
  for (size_t i = 0; i < to.size(); ++i)
    if (to[i] != 1)
      ti.push_back(i);
  size_t a = 0, b = 0;
  while (a < fi.size() || b < ti.size()) {
    if (a >= fi.size() || b >= ti.size())
      return fail("reshape: element counts differ");
    size_t a0 = a, b0 = b;
    int64_t pa = from[fi[a++]], pb = to[ti[b++]];
    while (pa != pb) {
      if (pa < pb) {
        if (a >= fi.size())
          return fail("reshape: element counts differ");
        pa *= from[fi[a++]];
      } else {
        if (b >= ti.size())
          return fail("reshape: element counts differ");
        pb *= to[ti[b++]];
      }
    }
    // from dims [a0, a) and to dims [b0, b) hold the same elements.
    const dim_map& first = from_dims[fi[a0]];
    if (first.unit())
      return fail("reshape of a dim that is not on the space");
    int axis = first.axis, lo = first.lo, hi = first.lo;
    for (size_t i = a0; i < a; ++i) {
      const dim_map& d = from_dims[fi[i]];
      if (d.axis != axis || d.lo != hi)
        return fail("reshape merges dims of different space axes");
      hi = d.hi;
    }
    const auto& f = space_[static_cast<size_t>(axis)].factors;
    int cur = lo;
    for (size_t i = b0; i < b; ++i) {
      int64_t want = to[ti[i]], prod = 1;
      int start = cur;
      while (cur < hi && prod < want)
        prod *= f[static_cast<size_t>(cur++)];
      if (prod != want) {
        // `want` splits factor cur-1 (or cur): ask for it to be refined into groups.
        int f = prod > want ? cur - 1 : cur;
        if (prod > want && i == b0 && start == cur - 1 && f >= 0) {
          refine_.axis = axis;
          refine_.factor = f;
          refine_.parts = want;
          // The smaller part is the constant: a group count (GroupNorm's (G, n // G)) or
          // a group size (maxout's (n // g, g)).
          int64_t rest = prod / want;
          refine_.trailing = prod % want == 0 && rest < want;
          if (refine_.trailing)
            refine_.parts = rest;
        }
        return fail("reshape splits a dim inside one factor of space axis " +
                    std::to_string(axis) + " (a grouped reduction?)");
      }
      to_dims[ti[i]] = {axis, start, cur};
    }
    to_dims[ti[b - 1]].hi = hi;  // trailing size-1 factors
  }
  return true;
}

bool builder::elementwise(int id, const std::string& p) {
  auto n = g_.node(id);
  val r;
  r.known = true;
  r.shape = to_vector(n.getResults()[0].getShape());
  r.dtype = n.getResults()[0].getDtype().cStr();
  r.kind = kind_of(r.dtype);
  unsigned nops = g_.operand_count(id);
  std::vector<val> ops(nops);
  for (unsigned k = 0; k < nops; ++k)
    if (!operand_val(id, k, ops[k], true))
      return false;
  // Result dims: from the operands that span them, else positionally from a seed.
  r.dims.assign(r.shape.size(), dim_map{});
  bool undetermined = false;
  for (size_t j = 0; j < r.shape.size(); ++j) {
    if (r.shape[j] == 1)
      continue;
    bool found = false;
    for (auto& o : ops) {
      if (!o.known || o.shape.size() != r.shape.size() || o.shape[j] != r.shape[j])
        continue;
      if (o.dims[j].unit())
        continue;
      if (found && !(r.dims[j] == o.dims[j]))
        return fail(node_desc(id) + ": operands disagree on how dim " + std::to_string(j) +
                    " maps onto the space");
      r.dims[j] = o.dims[j];
      found = true;
    }
    // No operand spans it: positionally from a seed; else, with operands of unknown layout,
    // the result waits for its consumer; else it is constant along the dim (a wildcard).
    if (!found && !positional(r.shape, j, r.dims[j]))
      for (auto& o : ops)
        if (!o.known)
          undetermined = true;
  }
  if (undetermined) {
    // Pending: only graph inputs of unknown layout and constants feed it.
    for (unsigned k = 0; k < nops; ++k) {
      auto& o = ops[k];
      if (o.known) {
        if (std::any_of(o.dims.begin(), o.dims.end(), [](const dim_map& d) { return !d.unit(); }))
          return fail(node_desc(id) + ": mixes graph inputs of unknown layout with the seeds");
        continue;
      }
      if (o.shape.size() != r.shape.size())
        return fail(node_desc(id) + ": an operand of unknown layout has another rank");
      for (auto& src : o.sources)
        r.sources.push_back(src);
    }
    r.known = false;
  } else {
    if (!check_value(r, node_desc(id)))
      return false;
    // Graph inputs read here for the first time take the result's layout.
    for (unsigned k = 0; k < nops; ++k) {
      if (ops[k].known)
        continue;
      if (ops[k].shape.size() != r.shape.size())
        return fail(node_desc(id) + ": a graph input has another rank than the result");
      std::vector<dim_map> dims(r.shape.size());
      for (size_t j = 0; j < r.shape.size(); ++j) {
        if (ops[k].shape[j] == 1)
          continue;
        if (ops[k].shape[j] != r.shape[j])
          return fail(node_desc(id) + ": a graph input does not broadcast against the result");
        dims[j] = r.dims[j];
      }
      if (!resolve(ops[k], dims, node_desc(id)))
        return false;
    }
  }
  if (r.known && std::all_of(ops.begin(), ops.end(), [](const val& o) { return o.is_const; }) &&
      std::none_of(r.dims.begin(), r.dims.end(), [](const dim_map& d) { return !d.unit(); })) {
    double c = 0;
    if (fold(p, ops, r.kind, c)) {
      r.is_const = true;
      r.cval = c;
      r.mat.assign(static_cast<size_t>(naxes()), false);
      std::string text;
      if (!literal_text(id, 0, r, nullptr, text))
        return false;
      r.var = text;
      nodes_[id] = r;
      return true;
    }
  }
  std::vector<std::string> args(nops);
  for (unsigned k = 0; k < nops; ++k) {
    if (ops[k].is_const) {
      const val* other = nullptr;
      for (unsigned o = 0; o < nops; ++o)
        if (o != k && !ops[o].is_const)
          other = &ops[o];
      if (!literal_text(id, k, ops[k], other, args[k]))
        return false;
      ops[k].var = args[k];
    } else if (r.known && ops[k].known) {
      for (int a = 0; a < naxes(); ++a)
        if (ops[k].present[static_cast<size_t>(a)] && pooled(ops[k], a) &&
            r.level[static_cast<size_t>(a)] != ops[k].level[static_cast<size_t>(a)])
          return fail(node_desc(id) + ": combines a pooled value with one per element");
      args[k] = adapt(ops[k], r.level);  // coarse operands expanded to the result's level
    } else {
      args[k] = ops[k].var;
    }
  }
  r.mat.assign(static_cast<size_t>(naxes()), false);
  for (auto& o : ops)
    for (int a = 0; a < naxes(); ++a)
      if (o.mat.size() == static_cast<size_t>(naxes()) && o.mat[static_cast<size_t>(a)])
        r.mat[static_cast<size_t>(a)] = true;
  if (!r.known)
    finish_presence(r);

  stmt s;
  s.pending = !r.known;
  s.present = r.present;
  s.kind = r.kind;
  s.prim = p;
  s.args = args;
  const auto& un = unary_ops();
  const auto& bin = binary_ops();
  if (un.count(p) && nops == 1) {
    s.expr = un.at(p);
  } else if (bin.count(p) && nops == 2) {
    s.expr = bin.at(p);
    if (p == "div")
      s.expr = r.kind == 'i' ? "jax.lax.div({0}, {1})" : "({0} / {1})";
  } else if (p == "div" && nops == 2) {
    s.expr = r.kind == 'i' ? "jax.lax.div({0}, {1})" : "({0} / {1})";
  } else if (p == "integer_pow" && nops == 1) {
    int y = g_.params(id).value("y", 0);
    if (y == 2)
      s.expr = "({0} * {0})";
    else if (y == 3)
      s.expr = "({0} * {0} * {0})";
    else if (y == 1)
      s.expr = "{0}";
    else
      s.expr = fmt::format("jax.lax.integer_pow({{0}}, {})", y);
  } else if (p == "round" && nops == 1) {
    auto m = g_.params(id).value("rounding_method", nlohmann::json()).dump();
    bool even = m.find("EVEN") != std::string::npos || m == "1";
    s.expr = std::string("jax.lax.round({0}, jax.lax.RoundingMethod.") +
             (even ? "TO_NEAREST_EVEN" : "AWAY_FROM_ZERO") + ")";
  } else if (p == "clamp" && nops == 3) {
    s.expr = "jnp.minimum(jnp.maximum({1}, {0}), {2})";
  } else if (p == "select_n" && nops >= 2) {
    if (ops[0].kind == 'b' && nops == 3) {
      s.expr = "jnp.where({0}, {2}, {1})";
    } else if (nops == 2) {
      s.expr = "{1}";
    } else {
      std::string e = "{" + std::to_string(nops - 1) + "}";
      for (int c = static_cast<int>(nops) - 2; c >= 1; --c)
        e = fmt::format("jnp.where({{0}} == {}, {{{}}}, {})", c - 1, c, e);
      s.expr = e;
    }
  } else if (p == "convert_element_type" && nops == 1) {
    std::string to = g_.params(id).value("new_dtype", r.dtype);
    char from = ops[0].kind;
    char tk = kind_of(to);
    if (tk == 'f') {
      std::string e = from == 'f' ? "{0}" : "{0}.astype(jnp.float32)";
      if (narrow_float(to))
        e = "{0}.astype(jnp." + to + ").astype(jnp.float32)";
      s.expr = e;
    } else if (tk == 'i') {
      s.expr = from == 'i' ? "{0}" : "{0}.astype(jnp.int32)";
    } else {
      s.expr = from == 'b' ? "{0}" : "({0} != 0)";
    }
  } else if (p == "reduce_precision" && nops == 1) {
    int e = g_.params(id).value("exponent_bits", 8), m = g_.params(id).value("mantissa_bits", 23);
    if (e == 8 && m == 7)
      s.expr = "{0}.astype(jnp.bfloat16).astype(jnp.float32)";
    else if (e == 5 && m == 10)
      s.expr = "{0}.astype(jnp.float16).astype(jnp.float32)";
    else if (e >= 8 && m >= 23)
      s.expr = "{0}";
    else
      return fail(node_desc(id) + ": reduce_precision to an unusual format");
  } else {
    return fail(node_desc(id) + ": primitive not supported on blocks");
  }
  if (transcendental(p))
    ++out_.transcendentals;
  s.var = "v" + std::to_string(id);
  r.var = add_stmt(s);
  nodes_[id] = r;
  return true;
}

bool builder::process(int id) {
  auto p = g_.primitive(id);
  auto n = g_.node(id);
  if (n.getResults().size() != 1)
    return fail(node_desc(id) + ": has several results");
  if (std::find(out_.primitives.begin(), out_.primitives.end(), p) == out_.primitives.end())
    out_.primitives.push_back(p);
  val r;
  r.known = true;
  r.shape = to_vector(n.getResults()[0].getShape());
  r.dtype = n.getResults()[0].getDtype().cStr();
  r.kind = kind_of(r.dtype);

  if (identity_op(p)) {
    val o;
    if (!operand_val(id, 0, o, true))
      return false;
    auto& params = g_.params(id);
    // pos_of[i]: the result dim that operand dim i becomes (-1: dropped or unit).
    std::vector<int> pos_of(o.shape.size(), -1);
    bool pos_ok = true;
    if (p == "broadcast_in_dim") {
      std::vector<int> bd;
      for (auto& x : params.value("broadcast_dimensions", nlohmann::json::array()))
        bd.push_back(x.get<int>());
      if (bd.size() != o.shape.size())
        return fail(node_desc(id) + ": broadcast_dimensions do not match the operand");
      for (size_t i = 0; i < bd.size(); ++i)
        pos_of[i] = bd[i];
      r.dims.assign(r.shape.size(), dim_map{});
      std::vector<bool> from_operand(r.shape.size(), false);
      if (o.known)
        for (size_t i = 0; i < bd.size(); ++i)
          if (!o.dims[i].unit()) {
            r.dims[static_cast<size_t>(bd[i])] = o.dims[i];
            from_operand[static_cast<size_t>(bd[i])] = true;
          }
      // A new dim of a value constant along every axis may stay a wildcard (unit).
      bool constant = o.known && std::none_of(o.dims.begin(), o.dims.end(),
                                              [](const dim_map& d) { return !d.unit(); });
      bool undetermined = false;
      for (size_t j = 0; j < r.shape.size(); ++j)
        if (!from_operand[j] && r.shape[j] != 1 && !positional(r.shape, j, r.dims[j]) &&
            !constant) {
          if (o.known)
            return fail(node_desc(id) + ": cannot tell which space axis the broadcast dim " +
                        std::to_string(j) + " runs along");
          undetermined = true;
        }
      if (!o.known && !undetermined) {
        std::vector<dim_map> dims(o.shape.size());
        for (size_t i = 0; i < bd.size(); ++i)
          if (o.shape[i] != 1)
            dims[i] = r.dims[static_cast<size_t>(bd[i])];
        if (!resolve(o, dims, node_desc(id)))
          return false;
      }
      if (o.known && !check_value(r, node_desc(id)))
        return false;
    } else if (p == "squeeze") {
      std::set<int> drop;
      for (auto& x : params.value("dimensions", nlohmann::json::array())) {
        int d = x.get<int>();
        drop.insert(d < 0 ? d + static_cast<int>(o.shape.size()) : d);
      }
      int j = 0;
      for (size_t i = 0; i < o.shape.size(); ++i)
        if (!drop.count(static_cast<int>(i))) {
          pos_of[i] = j++;
          if (o.known)
            r.dims.push_back(o.dims[i]);
        }
      if (static_cast<size_t>(j) != r.shape.size())
        return fail(node_desc(id) + ": squeeze dims do not match");
      if (o.known && !check_value(r, node_desc(id)))
        return false;
    } else if (p == "reshape" || p == "expand_dims") {
      if (o.known) {
        if (!in_factor_order(o.dims))
          return fail(node_desc(id) + ": reshapes a value whose members lead its groups");
        if (!reshape_map(o.shape, o.dims, r.shape, r.dims))
          return fail(node_desc(id) + ": " + why_);
        if (!check_value(r, node_desc(id)))
          return false;
      } else {
        // Of unknown layout: only unit dims may come or go.
        std::vector<size_t> fi, ti;
        for (size_t i = 0; i < o.shape.size(); ++i)
          if (o.shape[i] != 1)
            fi.push_back(i);
        for (size_t i = 0; i < r.shape.size(); ++i)
          if (r.shape[i] != 1)
            ti.push_back(i);
        pos_ok = fi.size() == ti.size();
        for (size_t i = 0; pos_ok && i < fi.size(); ++i) {
          pos_ok = o.shape[fi[i]] == r.shape[ti[i]];
          pos_of[fi[i]] = static_cast<int>(ti[i]);
        }
        if (!pos_ok)
          return fail(node_desc(id) + ": reshape of graph inputs whose layout is unknown");
      }
    } else {  // stop_gradient, copy ...: same shape
      for (size_t i = 0; i < o.shape.size(); ++i)
        pos_of[i] = static_cast<int>(i);
      if (o.known) {
        r.dims = o.dims;
        if (!check_value(r, node_desc(id)))
          return false;
      }
    }
    if (o.is_const) {
      std::string text;
      if (!literal_text(id, 0, o, nullptr, text))
        return false;
      r.var = text;
      r.is_const = true;
      r.cval = o.cval;
      if (!o.known)
        return fail(node_desc(id) + ": literal of unknown layout");
      finish_presence(r);
      r.mat.assign(static_cast<size_t>(naxes()), false);
      nodes_[id] = r;
      return true;
    }
    r.var = o.var;
    if (o.kind != r.kind)
      return fail(node_desc(id) + ": changes the dtype kind");
    if (!o.known) {
      // Still pending: carry the inputs' dims over to the result's positions.
      r.known = false;
      for (auto src : o.sources) {
        for (auto& q : src.pos)
          if (q >= 0)
            q = pos_of[static_cast<size_t>(q)];
        r.sources.push_back(src);
      }
      r.dims.clear();
      finish_presence(r);
      nodes_[id] = r;
      return true;
    }
    r.mat = o.mat;
    r.count = o.count;
    r.count_text = o.count_text;
    for (int a = 0; a < naxes(); ++a)
      if (pooled(o, a) && r.level[static_cast<size_t>(a)] != o.level[static_cast<size_t>(a)])
        return fail(node_desc(id) + ": broadcasts a pooled value back over its groups");
    for (int a = 0; a < naxes(); ++a)
      if (coarse(o, a) && r.level[static_cast<size_t>(a)] > o.level[static_cast<size_t>(a)]) {
        r.var = adapt(o, r.level);  // broadcast along the trailing factors: expand
        r.mat[static_cast<size_t>(a)] = true;
      }
    nodes_[id] = r;
    return true;
  }

  if (p == "reduce_sum" || p == "reduce_max" || p == "reduce_min" || p == "argmax" ||
      p == "argmin" || p == "reduce_and" || p == "reduce_or") {
    val o;
    if (!operand_val(id, 0, o, false))
      return false;
    if (!o.known)
      return fail(node_desc(id) + ": reduces graph inputs whose layout is unknown");
    std::set<int> rdims;
    for (auto& x : g_.params(id).value("axes", nlohmann::json::array()))
      rdims.insert(x.get<int>());
    std::set<int> axes;
    double count = 1;
    for (int d : rdims) {
      if (d < 0 || static_cast<size_t>(d) >= o.shape.size())
        return fail(node_desc(id) + ": bad axes");
      count *= static_cast<double>(o.shape[static_cast<size_t>(d)]);
      if (o.dims[static_cast<size_t>(d)].unit() && o.shape[static_cast<size_t>(d)] != 1)
        return fail(node_desc(id) + ": reduces a value broadcast along an unknown axis");
      if (!o.dims[static_cast<size_t>(d)].unit())
        axes.insert(o.dims[static_cast<size_t>(d)].axis);
    }
    // An axis whose trailing factors only are reduced: a grouped reduction (per group of
    // the trailing factors; the result is coarse along it).
    int grouped = -1;
    for (size_t d = 0; d < o.dims.size(); ++d)
      if (!o.dims[d].unit() && axes.count(o.dims[d].axis) && !rdims.count(static_cast<int>(d))) {
        int a = o.dims[d].axis;
        // kept dims of the axis must all come before its reduced ones
        for (size_t e = 0; e < d; ++e)
          if (o.dims[e].axis == a && rdims.count(static_cast<int>(e)))
            return fail(node_desc(id) + ": reduces leading factors of a space axis");
        if (grouped >= 0 && grouped != a)
          return fail(node_desc(id) + ": grouped reductions along two axes");
        grouped = a;
      }
    for (size_t d = 0; d < o.dims.size(); ++d)
      if (!rdims.count(static_cast<int>(d)))
        r.dims.push_back(o.dims[d]);
    if (r.dims.size() != r.shape.size())
      return fail(node_desc(id) + ": result rank does not match");
    if (!check_value(r, node_desc(id)))
      return false;
    if (grouped >= 0 && pooled(r, grouped)) {
      // Pooled (maxout): groups of P adjacent elements of the lane axis; the block holds
      // them member-major (see the header), so the reduction combines P lane slices.
      int64_t P = pool_of(r, grouped);
      if ((p != "reduce_sum" && p != "reduce_max" && p != "reduce_min") || axes.size() != 1)
        return fail(node_desc(id) + ": a pooled reduction other than a sum, max or min");
      if (o.level[static_cast<size_t>(grouped)] < full_level(grouped))
        return fail(node_desc(id) + ": pools a value already pooled");
      if (out_.pool_axis >= 0 && (out_.pool_axis != grouped || out_.pool != P))
        return fail(node_desc(id) + ": pools with two group sizes");
      out_.pool_axis = grouped;
      out_.pool = P;
      int k = kaxis_[static_cast<size_t>(grouped)];
      std::string w = fmt::format("(_blk[{}] // {})", k, P);
      auto slice = [&](int64_t q) {
        return fmt::format("jax.lax.slice_in_dim({{0}}, {0} * {1}, {2} * {1}, axis={3})", q, w,
                           q + 1, k);
      };
      std::string e = slice(0);
      for (int64_t q = 1; q < P; ++q)
        e = p == "reduce_sum" ? "(" + e + " + " + slice(q) + ")"
            : fmt::format("jnp.{}({}, {})", p == "reduce_max" ? "maximum" : "minimum", e,
                          slice(q));
      stmt s;
      s.present = r.present;
      s.kind = r.kind;
      s.prim = p;
      s.args = {materialize(o, {grouped})};
      s.expr = e;
      s.var = "v" + std::to_string(id);
      r.mat = o.mat;
      r.count = count;
      r.count_text = std::to_string(P);
      r.var = add_stmt(s);
      nodes_[id] = r;
      return true;
    }
    if (grouped >= 0) {
      if (p != "reduce_sum" || axes.size() != 1)
        return fail(node_desc(id) + ": a grouped reduction other than a sum");
      if (!coarse(r, grouped))
        return fail(node_desc(id) + ": reduces part of a space axis that cannot be grouped");
      out_.reduced[static_cast<size_t>(grouped)] = true;
      std::string cur = kernel_size(o, grouped), groups = kernel_size(r, grouped);
      stmt s;
      s.present = r.present;
      s.kind = 'f';
      s.prim = p;
      s.args = {materialize(o, {grouped})};
      int k = kaxis_[static_cast<size_t>(grouped)];
      s.expr = "jax.lax.dot_general({0}, " + onehot(cur, groups) + ", (((" + std::to_string(k) +
               ",), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST, "
               "preferred_element_type=jnp.float32)";
      s.var = "v" + std::to_string(id);
      r.mat = o.mat;
      r.count = count;
      r.count_text = "(" + cur + " // " + groups + ")";
      r.var = add_stmt(s);
      nodes_[id] = r;
      return true;
    }
    std::vector<int> ax(axes.begin(), axes.end());
    for (int a : ax) {
      if (kaxis_[static_cast<size_t>(a)] < 0)
        return fail(node_desc(id) + ": reduces squeezed space axis " + std::to_string(a));
      out_.reduced[static_cast<size_t>(a)] = true;
    }
    r.mat = o.mat;
    for (int a : ax)
      r.mat[static_cast<size_t>(a)] = false;
    if (ax.empty()) {  // reduces unit dims only
      r.var = o.var;
      nodes_[id] = r;
      return true;
    }
    std::string ks;
    for (int a : ax)
      ks += std::to_string(kaxis_[static_cast<size_t>(a)]) + ", ";
    stmt s;
    s.present = r.present;
    s.kind = r.kind;
    s.prim = p;
    s.axes = ax;
    s.args = {materialize(o, ax)};
    std::string axis = ax.size() == 1 ? std::to_string(kaxis_[static_cast<size_t>(ax[0])])
                                      : "(" + ks + ")";
    if (p == "reduce_sum") {
      s.red = "sum";
      s.expr = "jnp.sum({0}, axis=" + axis + ", keepdims=True)";
      r.count = count;
      std::string c;
      for (int a : ax)  // a coarse operand counts its groups (a constant)
        c += (c.empty() ? "" : " * ") +
             (coarse(o, a) ? kernel_size(o, a) : fmt::format("extents[{}]", a));
      r.count_text = "(" + c + ")";
    } else if (p == "reduce_max") {
      s.red = "max";
      s.expr = "jnp.max({0}, axis=" + axis + ", keepdims=True)";
    } else if (p == "reduce_min") {
      s.red = "min";
      s.expr = "jnp.min({0}, axis=" + axis + ", keepdims=True)";
    } else if (p == "reduce_and") {
      s.red = "and";
      s.expr = "jnp.all({0}, axis=" + axis + ", keepdims=True)";
    } else if (p == "reduce_or") {
      s.red = "or";
      s.expr = "jnp.any({0}, axis=" + axis + ", keepdims=True)";
    } else {
      if (ax.size() != 1)
        return fail(node_desc(id) + ": arg-reduction over several axes");
      s.red = p;
      s.expr = "(jnp." + p + "({0}, axis=" + axis + ", keepdims=True).astype(jnp.int32) + " +
               fmt::format("offsets[{}])", ax[0]);
    }
    s.var = "v" + std::to_string(id);
    r.var = add_stmt(s);
    nodes_[id] = r;
    return true;
  }

  if (p == "iota") {
    auto& params = g_.params(id);
    int d = params.value("dimension", 0);
    r.dims.assign(r.shape.size(), dim_map{});
    for (size_t j = 0; j < r.shape.size(); ++j)
      if (r.shape[j] != 1 && !positional(r.shape, j, r.dims[j]))
        return fail(node_desc(id) + ": cannot tell which space axis dim " + std::to_string(j) +
                    " runs along");
    if (!check_value(r, node_desc(id)))
      return false;
    if (d < 0 || static_cast<size_t>(d) >= r.dims.size() || r.dims[static_cast<size_t>(d)].unit())
      return fail(node_desc(id) + ": iota along a unit dim");
    int a = r.dims[static_cast<size_t>(d)].axis;
    for (size_t j = 0; j < r.dims.size(); ++j)
      if (static_cast<int>(j) != d && r.dims[j].axis == a)
        return fail(node_desc(id) + ": iota along part of space axis " + std::to_string(a));
    int k = kaxis_[static_cast<size_t>(a)];
    std::vector<bool> only(static_cast<size_t>(naxes()), false);
    only[static_cast<size_t>(a)] = true;
    stmt s;
    s.present = r.present;
    s.kind = r.kind;
    s.prim = p;
    std::string e = k < 0 ? fmt::format("offsets[{}]", a)
                          : fmt::format("(jax.lax.broadcasted_iota(jnp.int32, {}, {}) + offsets[{}])",
                                        shape_tuple(only), k, a);
    if (r.kind == 'f')
      e += ".astype(jnp.float32)";
    s.expr = e;
    s.var = "v" + std::to_string(id);
    r.mat.assign(static_cast<size_t>(naxes()), false);
    r.mat[static_cast<size_t>(a)] = k >= 0;
    r.var = add_stmt(s);
    nodes_[id] = r;
    return true;
  }

  if (p == "gather") {
    // take_along_axis: one element per row along one axis, the index from a per-row value.
    val x, idx;
    if (!operand_val(id, 0, x, false) || !operand_val(id, 1, idx, true))
      return false;
    if (!x.known)
      return fail(node_desc(id) + ": gathers from graph inputs whose layout is unknown");
    auto& dn = g_.params(id)["dimension_numbers"];
    auto list = [&](const char* key) {
      std::vector<int> v;
      if (dn.is_object() && dn.contains(key) && dn[key].is_array())
        for (auto& e : dn[key])
          v.push_back(e.get<int>());
      return v;
    };
    auto offset = list("offset_dims"), collapsed = list("collapsed_slice_dims"),
         start_map = list("start_index_map"), obatch = list("operand_batching_dims"),
         ibatch = list("start_indices_batching_dims");
    if (!offset.empty() || collapsed.size() != 1 || start_map != collapsed ||
        obatch.size() + 1 != x.shape.size() || ibatch.size() != obatch.size())
      return fail(node_desc(id) + ": not a gather of one element per row");
    int gd = collapsed[0];
    if (idx.shape.empty() || idx.shape.back() != 1 || idx.shape.size() != x.shape.size() + 1)
      return fail(node_desc(id) + ": indices are not one per row");
    if (x.dims[static_cast<size_t>(gd)].unit())
      return fail(node_desc(id) + ": gathers along a unit dim");
    int a = x.dims[static_cast<size_t>(gd)].axis;
    int k = kaxis_[static_cast<size_t>(a)];
    if (k < 0)
      return fail(node_desc(id) + ": gathers along a squeezed axis");
    // Result dims = indices dims but the index vector; batching dims follow the operand.
    r.dims.assign(r.shape.size(), dim_map{});
    if (r.shape.size() + 1 != idx.shape.size())
      return fail(node_desc(id) + ": unexpected result rank");
    for (size_t j = 0; j < r.shape.size(); ++j) {
      auto it = std::find(ibatch.begin(), ibatch.end(), static_cast<int>(j));
      if (it != ibatch.end()) {
        int od = obatch[static_cast<size_t>(it - ibatch.begin())];
        if (x.shape[static_cast<size_t>(od)] != r.shape[j])
          return fail(node_desc(id) + ": batching dims disagree");
        r.dims[j] = x.dims[static_cast<size_t>(od)];
      } else if (r.shape[j] != 1) {
        return fail(node_desc(id) + ": gathers more than one element per row");
      }
    }
    if (!idx.known) {
      std::vector<dim_map> dims(idx.shape.size());
      for (size_t j = 0; j < r.shape.size(); ++j)
        if (idx.shape[j] != 1)
          dims[j] = r.dims[j];
      if (!resolve(idx, dims, node_desc(id)))
        return false;
    }
    for (size_t j = 0; j < r.shape.size(); ++j)
      if (!idx.dims[j].unit() && !(idx.dims[j] == r.dims[j]))
        return fail(node_desc(id) + ": indices do not line up with the operand");
    for (size_t j = 0; j < idx.dims.size(); ++j)
      if (!idx.dims[j].unit() && idx.dims[j].axis == a)
        return fail(node_desc(id) + ": indices vary along the gathered axis");
    if (!check_value(r, node_desc(id)))
      return false;
    out_.reduced[static_cast<size_t>(a)] = true;
    gathered_found_[space_[static_cast<size_t>(a)].extent()] = a;
    std::vector<bool> only(static_cast<size_t>(naxes()), false);
    only[static_cast<size_t>(a)] = true;
    stmt s;
    s.present = r.present;
    s.kind = r.kind;
    s.prim = p;
    s.red = "pick";
    s.axes = {a};
    s.args = {x.var, idx.var};
    std::string zero = x.kind == 'f' ? "0.0" : "0";
    s.expr = fmt::format(
        "jnp.sum(jnp.where(jax.lax.broadcasted_iota(jnp.int32, {}, {}) + offsets[{}] == {{1}}, "
        "{{0}}, {}), axis={}, keepdims=True)",
        shape_tuple(only), k, a, zero, k);
    s.var = "v" + std::to_string(id);
    r.mat = x.mat;
    r.mat[static_cast<size_t>(a)] = false;
    r.var = add_stmt(s);
    nodes_[id] = r;
    return true;
  }

  if (p == "slice")
    return slice_member(id, r);
  if (p == "dot_general" || p == "conv_general_dilated")
    return fail(node_desc(id) + ": a second matmul after the seeds");
  return elementwise(id, p);
}

// A static slice that keeps one member of the lane axis's trailing constant factors (the
// gate g of gates[:, g]) and every other dim whole: lane slice g of the member-major block,
// one value per group (pooled, see block_program::pool_axis).
bool builder::slice_member(int id, val& r) {
  val o;
  if (!operand_val(id, 0, o, false))
    return false;
  if (!o.known)
    return fail(node_desc(id) + ": slices graph inputs whose layout is unknown");
  const auto& params = g_.params(id);
  auto start = params.value("start_indices", std::vector<int64_t>{});
  auto limit = params.value("limit_indices", std::vector<int64_t>{});
  auto strides = params.value("strides", nlohmann::json());
  if (start.size() != o.shape.size() || limit.size() != o.shape.size())
    return fail(node_desc(id) + ": bad slice bounds");
  if (strides.is_array())
    for (auto& x : strides)
      if (x.get<int64_t>() != 1)
        return fail(node_desc(id) + ": a strided slice");
  int cut = -1;
  for (size_t d = 0; d < o.shape.size(); ++d) {
    if (start[d] == 0 && limit[d] == o.shape[d])
      continue;
    if (cut >= 0 || limit[d] - start[d] != 1)
      return fail(node_desc(id) + ": a slice other than one member of a constant factor");
    cut = static_cast<int>(d);
  }
  if (cut < 0) {  // the whole value
    r.dims = o.dims;
    r.var = o.var;
    r.mat = o.mat;
    if (!check_value(r, node_desc(id)))
      return false;
    nodes_[id] = r;
    return true;
  }
  const auto& m = o.dims[static_cast<size_t>(cut)];
  if (m.unit())
    return fail(node_desc(id) + ": slices a dim of unknown axis");
  int a = m.axis, k = kaxis_[static_cast<size_t>(a)];
  const auto& ax = space_[static_cast<size_t>(a)];
  // The member factors: the trailing factors [m.lo, m.hi) of the lane axis, all constants,
  // sliced from a value spanning the whole axis.
  if (k != kdims_ - 1 || m.hi != static_cast<int>(ax.factors.size()) || m.lo == 0 ||
      o.level[static_cast<size_t>(a)] < full_level(a))
    return fail(node_desc(id) + ": slices something other than the members of the lane axis");
  int64_t P = 1;
  for (int f = m.lo; f < m.hi; ++f) {
    const auto& e = ax.factor_exprs[static_cast<size_t>(f)];
    if (e.empty() || !std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(c); }))
      return fail(node_desc(id) + ": slices a factor whose size is not a constant");
    P *= std::stoll(e);
  }
  r.dims = o.dims;
  r.dims[static_cast<size_t>(cut)] = dim_map{};
  if (!check_value(r, node_desc(id)))
    return false;
  if (pool_of(r, a) != P)
    return fail(node_desc(id) + ": a member slice that does not leave one value per group");
  if (out_.pool_axis >= 0 && (out_.pool_axis != a || out_.pool != P))
    return fail(node_desc(id) + ": pools with two group sizes");
  out_.pool_axis = a;
  out_.pool = P;
  int64_t g = start[static_cast<size_t>(cut)];
  stmt st;
  st.present = r.present;
  st.kind = r.kind;
  st.prim = "slice";
  st.args = {materialize(o, {a})};
  std::string w = fmt::format("(_blk[{}] // {})", k, P);
  st.expr = fmt::format("jax.lax.slice_in_dim({{0}}, {0} * {1}, {2} * {1}, axis={3})", g, w,
                        g + 1, k);
  st.var = "v" + std::to_string(id);
  r.mat = o.mat;
  r.var = add_stmt(st);
  nodes_[id] = r;
  return true;
}

std::string builder::prologue(bool with_seeds, const std::set<std::string>& used) const {
  std::string c;
  if (with_seeds)
    for (size_t i = 0; i < seeds_.size(); ++i) {
      std::string dt = g_.dtype(seeds_[i].value);
      char k = kind_of(dt);
      std::string e = fmt::format("seeds[{}]", i);
      // A matmul's f32 accumulator rounds to the dot's narrower result dtype first.
      if (k == 'f')
        e += narrow_float(dt) && seeds_[i].value.is_node()
                 ? ".astype(jnp." + dt + ").astype(jnp.float32)"
                 : ".astype(jnp.float32)";
      else if (k == 'i')
        e += ".astype(jnp.int32)";
      else
        e = "(" + e + " != 0)";  // bools travel as int32 blocks
      c += fmt::format("    s{} = {}\n", i, e);
    }
  for (size_t j = 0; j < out_.operands.size(); ++j) {
    std::string name = "in" + std::to_string(out_.operands[j].input);
    if (!used.count(name))
      continue;
    char k = kind_of(out_.operands[j].dtype);
    std::string e = fmt::format("extras[{}]", j);
    if (k == 'f')
      e = "jnp.asarray(" + e + ").astype(jnp.float32)";
    else if (k == 'i')
      e = "jnp.asarray(" + e + ").astype(jnp.int32)";
    else
      e = "(jnp.asarray(" + e + ") != 0)";  // bools travel as int32 blocks
    c += fmt::format("    {} = {}\n", name, e);
  }
  if (with_seeds) {
    std::string blk = "    _blk = (";
    for (int a = 0; a < naxes(); ++a) {
      int k = kaxis_[static_cast<size_t>(a)];
      if (k < 0)
        continue;
      std::string src = "1";
      for (size_t i = 0; i < seeds_.size() && src == "1"; ++i)
        for (auto& d : seeds_[i].dims)
          if (d.axis == a)
            src = fmt::format("s{}.shape[{}]", i, k);
      for (size_t j = 0; j < out_.operands.size() && src == "1"; ++j)
        if (out_.operands[j].present[static_cast<size_t>(a)] && !out_.operands[j].scalar &&
            !(out_.operands[j].pooled && a == out_.pool_axis) &&
            used.count("in" + std::to_string(out_.operands[j].input)))
          src = fmt::format("in{}.shape[{}]", out_.operands[j].input, k);
      blk += src + ", ";
    }
    c += blk + ")\n";
  }
  return c;
}

bool builder::emit_full() {
  std::string body;
  std::set<std::string> used;
  for (auto& s : stmts_) {
    body += "    " + s.var + " = " + render(s.expr, s.args) + "\n";
  }
  for (size_t j = 0; j < out_.operands.size(); ++j)
    used.insert("in" + std::to_string(out_.operands[j].input));
  std::string ret = "    return [";
  for (auto& o : out_.outputs) {
    val v = o.value.is_node() && nodes_.count(o.value.id) ? nodes_.at(o.value.id)
                                                            : val{};
    if (o.value.is_node() && seed_of_node_.count(o.value.id)) {
      v.var = "s" + std::to_string(seed_of_node_.at(o.value.id));
      v.present = o.present;
      v.mat = o.present;
    } else if (o.value.is_input() && seed_of_input_.count(o.value.id)) {
      v.var = "s" + std::to_string(seed_of_input_.at(o.value.id));
      v.present = o.present;
      v.mat = o.present;
    }
    std::vector<int> all;
    for (int a = 0; a < naxes(); ++a)
      all.push_back(a);
    ret += materialize_expr(v, all) + ", ";
  }
  ret += "]\n";
  out_.code = "def " + req_.name + "(seeds, extras, offsets, extents):\n" +
              prologue(true, used) + body + ret;
  return true;
}

// The streamed form along axis A (see the header).
bool builder::streamed(std::string& code, std::string& why) {
  const int A = req_.stream_axis;
  if (has_coarse_ || out_.pool_axis >= 0) {
    why = "grouped reductions need whole groups in a block";
    return false;
  }
  const size_t Au = static_cast<size_t>(A);
  if (kaxis_[Au] < 0) {
    why = "the streamed axis is squeezed";
    return false;
  }
  for (auto& o : out_.outputs)
    if (o.present[Au]) {
      why = "an output spans the streamed axis";
      return false;
    }
  std::map<std::string, size_t> by_var;
  for (size_t i = 0; i < stmts_.size(); ++i)
    by_var[stmts_[i].var] = i;
  auto stmt_of = [&](const std::string& v) -> const stmt* {
    auto it = by_var.find(v);
    return it == by_var.end() ? nullptr : &stmts_[it->second];
  };
  std::vector<bool> late(stmts_.size(), false);
  for (size_t i = 0; i < stmts_.size(); ++i) {
    auto& s = stmts_[i];
    bool over_a = !s.red.empty() && std::find(s.axes.begin(), s.axes.end(), A) != s.axes.end();
    if (over_a)
      late[i] = true;
    for (auto& a : s.args)
      if (stmt_of(a) && late[by_var[a]])
        late[i] = true;
  }
  auto is_late = [&](const std::string& v) {
    auto it = by_var.find(v);
    return it != by_var.end() && late[it->second];
  };
  // Which statements span A (pending ones: from what they read).
  std::map<std::string, bool> var_spans;
  for (size_t j = 0; j < out_.operands.size(); ++j)
    var_spans["in" + std::to_string(out_.operands[j].input)] = out_.operands[j].present[Au];
  for (size_t i = 0; i < seeds_.size(); ++i) {
    bool sp = false;
    for (auto& d : seeds_[i].dims)
      sp = sp || d.axis == A;
    var_spans["s" + std::to_string(i)] = sp;
  }
  std::vector<bool> spans(stmts_.size(), false);
  for (size_t i = 0; i < stmts_.size(); ++i) {
    auto& s = stmts_[i];
    if (!s.pending) {
      spans[i] = s.present[Au];
    } else {
      for (auto& a : s.args) {
        auto it = by_var.find(a);
        if (it != by_var.end())
          spans[i] = spans[i] || spans[it->second];
        else if (var_spans.count(a))
          spans[i] = spans[i] || var_spans[a];
      }
    }
  }
  // Accumulators.
  struct acc {
    size_t stmt;
    std::string red;   // sum max min pick online
    std::string r;     // online: the row statistic it is relative to
    std::vector<size_t> chain;  // online: statements between r and the reduction
    std::string dtype;
  };
  std::vector<acc> accs;
  std::map<size_t, size_t> acc_of_stmt;
  std::set<size_t> internal;
  // Online form: reduce_sum(exp(E - R) [* P]) with E, P early and R a late row statistic.
  std::function<bool(const std::string&, std::string&, std::vector<size_t>&)> online =
      [&](const std::string& v, std::string& r, std::vector<size_t>& chain) -> bool {
    const stmt* s = stmt_of(v);
    if (!s)
      return false;
    size_t i = by_var[v];
    if (s->prim == "exp") {
      const stmt* d = stmt_of(s->args[0]);
      if (!d || d->prim != "sub")
        return false;
      if (is_late(d->args[0]) || !is_late(d->args[1]))
        return false;
      if (!stmt_of(d->args[1]) || spans[by_var[d->args[1]]])
        return false;
      r = d->args[1];
      chain.push_back(by_var[s->args[0]]);
      chain.push_back(i);
      return true;
    }
    if (s->prim == "mul") {
      bool l0 = is_late(s->args[0]), l1 = is_late(s->args[1]);
      if (l0 == l1)
        return false;
      if (!online(l0 ? s->args[0] : s->args[1], r, chain))
        return false;
      chain.push_back(i);
      return true;
    }
    return false;
  };
  for (size_t i = 0; i < stmts_.size(); ++i) {
    auto& s = stmts_[i];
    if (s.red.empty() || std::find(s.axes.begin(), s.axes.end(), A) == s.axes.end())
      continue;
    if (s.axes.size() != 1) {
      why = "a reduction over the streamed axis and another one";
      return false;
    }
    acc a;
    a.stmt = i;
    a.dtype = s.kind == 'i' ? "int32" : "float32";
    bool operand_late = is_late(s.args[0]) || (s.args.size() > 1 && is_late(s.args[1]));
    if (s.red == "argmax" || s.red == "argmin" || s.red == "and" || s.red == "or") {
      why = "a " + s.red + " over the streamed axis";
      return false;
    }
    if (!operand_late) {
      a.red = s.red == "pick" ? "sum" : s.red;
    } else {
      if (s.red != "sum" || !online(s.args[0], a.r, a.chain)) {
        why = "a reduction over the streamed axis of a value that needs the whole row";
        return false;
      }
      a.red = "online";
      for (auto c : a.chain)
        internal.insert(c);
    }
    acc_of_stmt[i] = accs.size();
    accs.push_back(a);
  }
  // Every late value spanning the streamed axis is inside an online chain.
  for (size_t i = 0; i < stmts_.size(); ++i)
    if (late[i] && spans[i] && !internal.count(i) && !acc_of_stmt.count(i)) {
      why = "a value spanning the streamed axis needs a whole-row statistic";
      return false;
    }
  // Closure of late row statistics a value needs, in statement order.
  auto closure = [&](const std::vector<std::string>& roots, std::vector<size_t>& order,
                     bool& touches_online) -> bool {
    std::set<size_t> seen;
    std::vector<std::string> stack = roots;
    while (!stack.empty()) {
      auto v = stack.back();
      stack.pop_back();
      auto it = by_var.find(v);
      if (it == by_var.end() || !seen.insert(it->second).second)
        continue;
      size_t i = it->second;
      if (acc_of_stmt.count(i)) {
        if (accs[acc_of_stmt[i]].red == "online")
          touches_online = true;
        continue;
      }
      if (spans[i])
        return false;
      for (auto& a : stmts_[i].args)
        stack.push_back(a);
    }
    order.assign(seen.begin(), seen.end());
    std::sort(order.begin(), order.end());
    return true;
  };
  auto rename = [&](size_t i, const std::string& suffix, const std::string& acc_prefix) {
    std::vector<std::string> args = stmts_[i].args;
    for (auto& a : args) {
      auto it = by_var.find(a);
      if (it == by_var.end())
        continue;
      if (acc_of_stmt.count(it->second))
        a = acc_prefix + std::to_string(acc_of_stmt[it->second]);
      else if (late[it->second] || internal.count(it->second))
        a += suffix;
    }
    return args;
  };
  auto emit_late = [&](const std::vector<size_t>& order, const std::string& suffix,
                       const std::string& acc_prefix, bool only_late) {
    std::string c;
    for (size_t i : order) {
      if (acc_of_stmt.count(i))
        continue;
      bool l = late[i];
      if (only_late && !l)
        continue;
      c += "    " + stmts_[i].var + (l ? suffix : "") + " = " +
           render(stmts_[i].expr, rename(i, suffix, acc_prefix)) + "\n";
    }
    return c;
  };

  std::set<std::string> used;
  for (size_t j = 0; j < out_.operands.size(); ++j)
    used.insert("in" + std::to_string(out_.operands[j].input));
  std::string n = req_.name;
  // init
  code = "def " + n + "_init(row_shape):\n    return [";
  for (auto& a : accs) {
    std::string fill = a.red == "max" ? (a.dtype == "int32" ? "jnp.iinfo(jnp.int32).min"
                                                             : "-jnp.inf")
                       : a.red == "min" ? (a.dtype == "int32" ? "jnp.iinfo(jnp.int32).max"
                                                               : "jnp.inf")
                                        : "0";
    code += "jnp.full(row_shape, " + fill + ", jnp." + a.dtype + "), ";
  }
  code += "]\n\n";
  // step
  code += "def " + n + "_step(accs, seeds, extras, offsets, extents):\n" + prologue(true, used);
  for (size_t i = 0; i < accs.size(); ++i)
    code += fmt::format("    a{} = accs[{}]\n", i, i);
  for (size_t i = 0; i < stmts_.size(); ++i)
    if (!late[i] && !internal.count(i))
      code += "    " + stmts_[i].var + " = " + render(stmts_[i].expr, stmts_[i].args) + "\n";
  for (size_t k = 0; k < accs.size(); ++k) {
    auto& a = accs[k];
    if (a.red == "online")
      continue;
    auto& s = stmts_[a.stmt];
    code += fmt::format("    n{} = {}\n", k,
                        combine_update(a.red, "a" + std::to_string(k), render(s.expr, s.args)));
  }
  for (size_t k = 0; k < accs.size(); ++k) {
    auto& a = accs[k];
    if (a.red != "online")
      continue;
    std::vector<size_t> order;
    bool touches = false;
    if (!closure({a.r}, order, touches) || touches) {
      why = "an online sum relative to a statistic that is not a plain max/sum";
      return false;
    }
    code += emit_late(order, "_o", "a", true);
    code += emit_late(order, "_n", "n", true);
    std::string ro = stmt_of(a.r) && late[by_var[a.r]] ? a.r + "_o" : a.r;
    std::string rn = stmt_of(a.r) && late[by_var[a.r]] ? a.r + "_n" : a.r;
    for (size_t c : a.chain) {
      if (!internal.count(c) || !late[c])
        continue;
      code += "    " + stmts_[c].var + "_n = " + render(stmts_[c].expr, rename(c, "_n", "n")) +
              "\n";
    }
    auto& s = stmts_[a.stmt];
    std::string part = render(s.expr, rename(a.stmt, "_n", "n"));
    code += fmt::format(
        "    n{0} = jnp.where(a{0} == 0.0, 0.0, a{0} * jnp.exp({1} - {2})) + {3}\n", k, ro, rn,
        part);
  }
  code += "    return [";
  for (size_t k = 0; k < accs.size(); ++k)
    code += fmt::format("n{}, ", k);
  code += "]\n\n";
  // final
  std::vector<std::string> roots;
  for (auto& o : out_.outputs)
    if (o.value.is_node() && nodes_.count(o.value.id))
      roots.push_back(nodes_.at(o.value.id).var);
  std::vector<size_t> order;
  bool touches = false;
  if (!closure(roots, order, touches)) {
    why = "an output needs a value spanning the streamed axis";
    return false;
  }
  for (size_t i : order)
    for (auto& a : acc_of_stmt.count(i) ? std::vector<std::string>{} : stmts_[i].args)
      if (a.size() > 1 && a[0] == 's' && std::isdigit(static_cast<unsigned char>(a[1]))) {
        why = "an output reads a seed directly";
        return false;
      }
  code += "def " + n + "_final(accs, extras, offsets, extents, row_shape):\n" +
          prologue(false, used) + "    _blk = row_shape\n";
  for (size_t i = 0; i < accs.size(); ++i)
    code += fmt::format("    a{} = accs[{}]\n", i, i);
  code += emit_late(order, "", "a", false);
  code += "    return [";
  for (auto& o : out_.outputs) {
    val v = nodes_.at(o.value.id);
    auto it = by_var.find(v.var);
    if (it != by_var.end() && acc_of_stmt.count(it->second))
      v.var = "a" + std::to_string(acc_of_stmt[it->second]);
    std::vector<int> all;
    for (int a = 0; a < naxes(); ++a)
      all.push_back(a);
    code += materialize_expr(v, all) + ", ";
  }
  code += "]\n";
  out_.accumulators = static_cast<int>(accs.size());
  for (auto& a : accs)
    out_.accumulator_dtypes.push_back(a.dtype);
  return true;
}

// Splits factor refine_.factor of refine_.axis into (parts, rest): parts constant (a group
// count), rest = the factor's size at trace time // parts. Seeds' dims follow.
bool builder::apply_refinement() {
  auto& ax = space_[static_cast<size_t>(refine_.axis)];
  auto f = static_cast<size_t>(refine_.factor);
  if (f >= ax.factors.size() || refine_.parts <= 1 || ax.factors[f] % refine_.parts != 0)
    return false;
  int64_t size = ax.factors[f];
  std::string expr = ax.factor_exprs[f];
  std::string lead = std::to_string(refine_.parts),
              rest = "(" + expr + " // " + std::to_string(refine_.parts) + ")";
  ax.factors[f] = refine_.trailing ? size / refine_.parts : refine_.parts;
  ax.factor_exprs[f] = refine_.trailing ? rest : lead;
  ax.factors.insert(ax.factors.begin() + static_cast<long>(f) + 1,
                    refine_.trailing ? refine_.parts : size / refine_.parts);
  ax.factor_exprs.insert(ax.factor_exprs.begin() + static_cast<long>(f) + 1,
                         refine_.trailing ? lead : rest);
  for (auto& s : seeds_)
    for (auto& d : s.dims)
      if (d.axis == refine_.axis) {
        if (d.lo > refine_.factor)
          ++d.lo;
        if (d.hi > refine_.factor)
          ++d.hi;
      }
  return true;
}

bool builder::run(std::string& reason) {
  out_ = block_program{};
  space_ = req_.space;
  seeds_ = req_.seeds;
  if (space_.empty()) {
    reason = "empty space";
    return false;
  }
  kaxis_.assign(space_.size(), -1);
  for (size_t a = 0; a < space_.size(); ++a)
    if (!space_[a].squeezed)
      kaxis_[a] = kdims_++;
  bool ok = collect();
  // Two passes when the program gathers: the first finds the gathered axes, so that the
  // second turns an int literal equal to one's extent (index wrap-around) into the extent.
  // A pass that meets a reshape splitting a factor refines the factor and starts over.
  int refinements = 0;
  for (int pass = 0; ok && pass < 2; ++pass) {
    auto found = gathered_found_;
    if (pass == 1 && found.empty())
      break;
    refine_ = refinement{};
    gathered_axis_ = found;
    nodes_.clear();
    results_.clear();
    inputs_.clear();
    stmts_.clear();
    var_counter_ = 0;
    out_.operands.clear();
    out_.primitives.clear();
    out_.transcendentals = 0;
    out_.reduced.assign(space_.size(), false);
    out_.pool_axis = -1;
    out_.pool = 1;
    for (size_t i = 0; ok && i < seeds_.size(); ++i) {
      const auto& s = seeds_[i];
      val v;
      v.known = true;
      v.shape = g_.shape(s.value);
      v.dtype = g_.dtype(s.value);
      v.kind = kind_of(v.dtype);
      v.dims = s.dims;
      if (v.dims.size() != v.shape.size()) {
        ok = fail("seed " + std::to_string(i) + ": dims do not match its rank");
        break;
      }
      ok = check_value(v, "seed " + std::to_string(i));
      v.mat = v.present;
      v.var = "s" + std::to_string(i);
      if (s.value.is_node() && s.value.result >= 0 &&
          g_.node(s.value.id).getResults().size() > 1)
        results_[{s.value.id, s.value.result}] = v;
      else if (s.value.is_node())
        nodes_[s.value.id] = v;
      else
        inputs_[s.value.id] = v;
    }
    for (int id : program_)
      if (ok && !process(id))
        ok = false;
    if (!ok && refine_.axis >= 0 && refinements < 4 && apply_refinement()) {
      ++refinements;
      ok = true;
      why_.clear();
      gathered_found_.clear();
      pass = -1;  // start over on the refined space
    }
  }
  // Along a pooled axis the blocks are member-major: global indices would be wrong.
  for (size_t i = 0; ok && out_.pool_axis >= 0 && i < stmts_.size(); ++i) {
    const auto& s = stmts_[i];
    bool along = std::find(s.axes.begin(), s.axes.end(), out_.pool_axis) != s.axes.end();
    if ((s.prim == "iota" && s.present[static_cast<size_t>(out_.pool_axis)]) ||
        (along && s.red != "sum" && s.red != "max" && s.red != "min"))
      ok = fail(s.prim + " along the pooled axis (its blocks are member-major)");
  }
  // Outputs.
  for (size_t k = 0; ok && k < req_.outputs.size(); ++k) {
    const auto& ref = req_.outputs[k];
    block_output o;
    o.value = ref;
    val v;
    if (ref.is_node() && nodes_.count(ref.id))
      v = nodes_.at(ref.id);
    else if (ref.is_input() && inputs_.count(ref.id))
      v = inputs_.at(ref.id);
    else {
      ok = fail("output " + std::to_string(k) + " was not computed");
      break;
    }
    o.shape = g_.shape(ref);
    o.dtype = g_.dtype(ref);
    o.dims = v.dims;
    for (size_t d = 0; d < o.dims.size() && d < o.shape.size(); ++d)
      if (o.dims[d].unit() && o.shape[d] != 1) {
        ok = fail("output " + std::to_string(k) + " is constant along a dim of unknown axis");
        break;
      }
    for (int a = 0; ok && a < naxes(); ++a)
      if (coarse(v, a))
        ok = fail("output " + std::to_string(k) + " holds one value per group");
    if (ok && out_.pool_axis >= 0 && v.present[static_cast<size_t>(out_.pool_axis)]) {
      o.pooled = pooled(v, out_.pool_axis);
      if (!o.pooled)  // it would come back member-major
        ok = fail("output " + std::to_string(k) + " spans the pooled axis element by element");
    }
    if (!ok)
      break;
    o.present = v.present;
    std::string s = "(";
    for (size_t d = 0; d < o.dims.size(); ++d) {
      auto& m = o.dims[d];
      if (m.unit()) {
        s += "1";
      } else {
        auto& ax = space_[static_cast<size_t>(m.axis)];
        std::string e;
        for (int f = m.lo; f < m.hi; ++f)
          e += (e.empty() ? "" : " * ") + ax.factor_exprs[static_cast<size_t>(f)];
        s += e;
      }
      s += ", ";
    }
    if (o.dims.size() == 1)
      s.resize(s.size() - 1);
    else if (!o.dims.empty())
      s.resize(s.size() - 2);
    o.ref_shape = s + ")";
    out_.outputs.push_back(o);
  }
  if (!ok) {
    reason = why_;
    return false;
  }
  emit_full();
  if (req_.stream_axis >= 0 && req_.stream_axis < naxes()) {
    std::string code, why;
    if (streamed(code, why)) {
      out_.streamable = true;
      out_.stream_code = code;
    } else {
      out_.stream_refusal = why;
    }
  }
  return true;
}

}  // namespace

bool build_block_program(const graph_view& graph, const block_request& request,
                         block_program& out, std::string& reason) {
  builder b(graph, request, out);
  return b.run(reason);
}

}  // namespace maxkernel::agents::expert
