// What decides an evaluation's result besides the request itself: the worker's code (the
// tester's verdicts, lowering, structure extraction) and, on the model backend, the pricing
// code and the chip file it prices with. Its digest goes into every evaluation key, so a store
// never answers with a verdict or a time that an older worker, other pricing or a chip file
// since recalibrated gave; a build that changes none of them keeps its stores warm.
#pragma once

#include <string>
#include <string_view>

namespace maxkernel::tpu_nodes {

// Hex sha256 over the files below `dir` whose names end in `suffix` (path relative to dir and
// contents, in path order; __pycache__ skipped): the same for a copy of the tree elsewhere.
// "missing" when dir is not a directory.
std::string tree_digest(const std::string& dir, std::string_view suffix);

// Hex sha256 of a file's bytes; "missing" when it cannot be read.
std::string file_digest(const std::string& path);

// The revision from its parts: the worker package's tree_digest, the pricing code's digest
// (compiled in) and, on the model backend, the chip file's file_digest (ignored otherwise).
std::string evaluator_revision_of(std::string_view worker_digest, std::string_view backend,
                                  std::string_view chip_digest);

// This process's revision for a backend and chip: the worker package of
// worker_options::defaults(), the chip file config::chips_dir()/CHIP.yaml. Computed once per
// (backend, chip) and process, as the chip files are read once.
std::string evaluator_revision(std::string_view backend, std::string_view chip);

}  // namespace maxkernel::tpu_nodes
