// Generates the Python (jnp / lax) code that evaluates a piece of the reference's dataflow
// graph on blocks inside a Pallas kernel: the fused epilogue of a matmul or convolution, or
// a whole row-wise kernel. The templates stay generic over "any elementwise and row-reduction
// chain" by running this generator instead of matching fixed epilogues.
//
// The iteration SPACE. The caller describes a space of a few axes (for a matmul: batch, rows
// M, columns N; for a row-wise kernel: rows, D). Each axis is the product of one or more
// canonical FACTORS, dims of the reference (M = B*S when lhs is (B, S, K)); each factor has
// its size at configuration 0 and a Python expression for its size at trace time
// ("a.shape[1]"). SEEDS are values whose every dim maps onto the space (the dot_general
// result; row inputs of a row-wise kernel): the caller says, per dim of the seed, which
// factors of which axis it spans. The generator walks from the requested outputs back to
// the seeds and maps every value in between onto the space (a dim spans whole factors of one
// axis, or is a unit dim); a value is PRESENT along an axis when it spans it, else it is
// broadcast (unit) along it.
//
// Accepted between the seeds and the outputs (anything else: refused with a reason):
//  - elementwise primitives (arithmetic, min/max, comparisons, select_n, clamp, exp, log,
//    log1p, expm1, tanh, logistic, erf, sqrt, rsqrt, pow, integer_pow, square, sign, floor,
//    ceil, round, abs, is_finite, logical ops, stop_gradient ...);
//  - convert_element_type: floats are computed in f32; a cast to a narrower float in the
//    middle of the chain is kept as a rounding round trip; ints are int32, bools bool;
//  - broadcast_in_dim, reshape, squeeze, expand_dims that add or drop unit dims, broadcast
//    along axes, or merge/split dims along whole factors of one axis;
//  - scalar literals ("inf", "-inf", "nan" strings too); a float literal that equals the
//    number of elements a reduction summed (jnp.mean, jnp.var) becomes the runtime count,
//    and an int literal that equals the extent of a gathered axis becomes that extent, so
//    the code stays right at the reduced shapes the tester uses;
//  - reductions (reduce_sum, reduce_max, reduce_min, argmax, argmin) over whole axes, with
//    keepdims semantics in the generated code;
//  - iota along whole axes (global indices: the block offset is added);
//  - gather of one element per row along an axis (take_along_axis with an index per row),
//    generated as a one-hot compare with iota and a sum;
//  - other graph inputs that broadcast against the space (a bias (N,), a per-row vector (M,)
//    or (M, 1), a residual (M, N), scalars): they become extra kernel OPERANDS, reported with
//    how their dims map onto the space so the template gives them BlockSpecs.
//
// The generated code. All arrays in it have one dim per non-squeezed space axis (squeezed
// axes, typically batch axes with block size 1, are dropped), of the block's size along the
// axes where the value is present and 1 elsewhere; floats are f32. `code` defines
//
//   def <name>(seeds, extras, offsets, extents):   # -> list of outputs
//
// seeds: the seed blocks in request order; extras: per operand, its block in the same form
// (a scalar operand: a scalar; a bool operand may come as ints, nonzero meaning true);
// offsets[a]: global index of the block's first element along
// space axis a (program_id * block); extents[a]: the full size of axis a (a Python int at
// trace time). Outputs come back in that form, f32 / int32 / bool: the template casts to the
// output dtype when it stores. A reduction along an axis needs the block to span it whole
// (see `reduced`), unless the streamed form is used along it.
//
// The STREAMED form (request.stream_axis = a): when every output is a row statistic (not
// present along a) and every reduction along a reads only values known from the current
// block, plus the online-softmax form reduce_sum(exp(x - r)) (x from the block, r a row
// statistic such as a running max, rescaled as r moves), the generator also emits
//
//   def <name>_init(row_shape):                          # -> list of accumulators
//   def <name>_step(accs, seeds, extras, offsets, extents):  # one block along a -> accs
//   def <name>_final(accs, extras, offsets, extents, row_shape):  # -> list of outputs
//
// so a kernel can loop over blocks of a (logsumexp, cross-entropy over a vocabulary, row
// sums of a matmul's output) without holding a full row. Accumulators have the row shape
// (the kernel block shape with 1 along a) and the dtypes in accumulator_dtypes.
//
// The wrapper side. `operands[i].space_shape` is a Python expression of the operand's shape
// in space form (every space axis, extent or 1) to reshape the input to before the
// pallas_call; `outputs[j].ref_shape` the expression of the output's reference shape to
// reshape the kernel's space-form result to. Both only use the caller's factor expressions.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

// One axis of the iteration space: the product of its canonical factors.
struct space_axis {
  std::vector<int64_t> factors;             // sizes at configuration 0
  std::vector<std::string> factor_exprs;    // Python expressions of the sizes at trace time
  bool squeezed = false;                    // block size 1, dropped from kernel arrays
  int64_t extent() const;
  std::string extent_expr() const;          // "(a.shape[0] * a.shape[1])"
};

// How one dim of a value maps onto the space: factors [lo, hi) of `axis`, or a unit dim.
struct dim_map {
  int axis = -1;          // -1: a unit dim (size 1)
  int lo = 0, hi = 0;
  bool unit() const { return axis < 0; }
  bool operator==(const dim_map&) const = default;
};

struct block_seed {
  value_ref value;                  // a node result or a graph input; value.result >= 0 on
                                    // a multi-result node names one result (a jnp.split half)
  std::vector<dim_map> dims;        // per dim of the value
};

struct block_request {
  std::vector<space_axis> space;
  std::vector<block_seed> seeds;
  std::vector<value_ref> outputs;   // graph values to compute (typically graph outputs)
  std::string name = "block_fn";    // name of the generated function(s)
  int stream_axis = -1;             // >= 0: also try the streamed form along this axis
  // MEMBER-OUTER pooling (the gates of an LSTM: gates[:, g] of a [M, G, N'] product): on the
  // lane axis, values may list the dims of its trailing constant factors (the members) before
  // those of its leading ones (the groups). Blocks along the axis are member-major either way
  // (see block_program::pool_axis); only how the template fetches them differs: member g of
  // a column block is one contiguous column block of the reference's layout, so no copy.
  bool member_outer = false;
};

// A graph input the code reads besides the seeds.
struct block_operand {
  int input = -1;                   // graph input index (analyze's numbering: non-static args)
  std::vector<int64_t> shape;       // at configuration 0
  std::string dtype;
  std::vector<dim_map> dims;        // per dim of the input
  std::vector<bool> present;        // per space axis: spans it (false: broadcast along it)
  bool scalar = false;              // present along no axis: passed as a scalar
  // One value per group along block_program::pool_axis (the cell state of an LSTM next to
  // its gates): its blocks are block / pool wide, in natural order.
  bool pooled = false;
  std::string space_shape;          // Python tuple expression of its space-form shape
};

struct block_output {
  value_ref value;
  std::vector<int64_t> shape;       // reference shape at configuration 0
  std::string dtype;                // reference dtype (the template casts on store)
  std::vector<dim_map> dims;
  std::vector<bool> present;        // per space axis
  std::string ref_shape;            // Python tuple expression of the reference shape
  bool pooled = false;              // one value per group along block_program::pool_axis
};

struct block_program {
  std::vector<block_operand> operands;  // extras, in the order the code takes them
  std::vector<block_output> outputs;    // in request order
  std::vector<bool> reduced;            // per space axis: some reduction runs along it
  // A POOLED reduction (maxout: z.reshape(m, n // g, g).max(-1)): along the lane axis
  // pool_axis, groups of `pool` adjacent elements (a constant count, the trailing factors of
  // the axis) reduce to one. The code expects every block along pool_axis in MEMBER-MAJOR
  // order: element c * pool + r of a block (of the seeds and of the operands spanning the
  // axis at full size) at position r * (block / pool) + c, so a group's reduction is one of
  // `pool` lane-aligned slices. Pooled outputs come back in natural order, block / pool wide.
  // Iotas and arg-reductions along pool_axis are refused (the order is permuted).
  // A static slice of one member (gates[:, g], a slice of width 1 along the member factors)
  // is the lane-aligned slice g of the block, pooled like a reduction's result.
  int pool_axis = -1;
  int64_t pool = 1;
  std::vector<std::string> primitives;  // the primitives fused (for summaries)
  int transcendentals = 0;              // transcendental ops per element (for cost notes)
  std::string code;                     // def <name>(seeds, extras, offsets, extents)
  // Streamed form along request.stream_axis (empty with a reason when not possible).
  bool streamable = false;
  std::string stream_refusal;
  std::string stream_code;              // <name>_init, <name>_step, <name>_final
  int accumulators = 0;
  std::vector<std::string> accumulator_dtypes;  // "float32" / "int32", per accumulator
};

// Builds the program; false with `reason` (one line) when something between the seeds and
// the outputs cannot be expressed on blocks.
bool build_block_program(const graph_view& graph, const block_request& request,
                         block_program& out, std::string& reason);

// Dims of a value whose shape is the space's factors in order (each dim one factor, or a
// unit dim of size 1 where `shape` has a 1 that is not a factor): the usual seed mapping.
// False when the shape does not line up with the factors.
bool map_dims_to_factors(const std::vector<int64_t>& shape,
                         const std::vector<space_axis>& space, std::vector<dim_map>& dims);

}  // namespace maxkernel::agents::expert
