// Host memory for Arrays. Large blocks are cached after release and handed out again: a fresh
// block costs a page fault per 4 KiB on first touch, which for a 64 MB output costs more than
// the op that fills it.
#pragma once

#include <cstddef>

namespace kiln::host {

/// 64-byte aligned memory of at least `bytes`; throws OutOfMemory.
void* allocate(size_t bytes);
/// Returns memory from allocate(bytes).
void release(void* p, size_t bytes);
/// Bytes held in the cache now (for tests).
size_t cached_bytes();
/// Frees every cached block.
void trim();

}  // namespace kiln::host
