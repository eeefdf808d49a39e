// Resource limits against hostile inputs (SECURITY.md). Checkpoints, network files and inputs
// come from people a user does not control; these bounds keep them from exhausting memory or
// the stack before tessera has allocated anything for them.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// Largest tensor rank tessera computes with: NumPy's own cap (NPY_MAXDIMS, 64 since NumPy 2.0);
// attention models stay under 8. Every rank-dependent loop is then bounded, and a hostile shape
// cannot make index vectors or messages grow with it. A safetensors file may still declare more
// (the reference reads it, and so does `inspect`); computing with such a tensor is E_SHAPE.
inline constexpr int64_t kMaxRank = 64;

// Deepest nesting of JSON arrays and objects a network file may use. Real files nest 4 levels
// (root, nodes, node, args/init); nlohmann copies and prints values recursively, about 200 bytes
// of stack per level, so an unbounded depth lets a 200 KB file of '[' overflow an 8 MB stack.
// 128 is serde_json's default limit, which the safetensors header parser follows as well.
inline constexpr int kMaxJsonDepth = 128;

// The memory a model or a plan may use, in bytes. Building a Model whose parameters (plus what
// its layers precompute) exceed it, or a Plan whose buffers, inputs and layer scratch exceed it
// together with its model, is E_SHAPE before anything is allocated.
//
// The default is half of the machine's memory: /proc/meminfo MemTotal, or the cgroup v2 limit
// (/sys/fs/cgroup/memory.max) when that is lower. The environment variable
// TESSERA_MEMORY_BUDGET overrides it: a byte count with an optional K, M, G or T suffix (powers of
// 1024), e.g. "512M"; an invalid value is E_ARG when the budget is first needed.
uint64_t memory_budget();
// Sets the budget for the whole process (every thread); 0 restores the default (environment or
// half of memory). Thread-safe.
void set_memory_budget(uint64_t bytes);

// E_SHAPE at `where` when `bytes` exceeds the budget: "<what> needs 1.50 GiB, over the memory
// budget of 1.00 GiB (TESSERA_MEMORY_BUDGET)". `bytes` is a double so that estimates built from
// products of hostile dims cannot overflow on the way here.
void check_memory_budget(double bytes, const std::string& where, const std::string& what);

// "1.50 GiB", "512 B": a byte count for messages.
std::string format_bytes(double bytes);

}  // namespace tessera
