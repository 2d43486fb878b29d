// Paged-KV block allocator with reference counts and a prefix cache (vLLM-style).
//
// Blocks with refcount 0 sit in a free list (allocate from the front, release to the back). A
// block that holds a computed block of a shared prefix is registered in the prefix cache under
// (prefix_id, index in the prefix); it stays registered after its last holder releases it, so a
// later request can still hit it, until allocate() hands it out for new data (eviction). All
// operations are O(1) (expected) except the constructor.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace mlakit::sim {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_list_.size()); }  // incl. cached
  int64_t num_used() const { return num_blocks() - num_free(); }                // refcount > 0
  int32_t refcount(int32_t block) const;
  int64_t num_evictions() const { return num_evictions_; }

  // Takes the front of the free list (refcount 0 -> 1), evicting its prefix-cache entry.
  // Throws mlakit::Error (kInternal) when no block is free.
  int32_t allocate();
  // One more holder of `block` (a prefix-cache hit); a free block leaves the free list.
  void retain(int32_t block);
  // One holder fewer; at 0 the block joins the back of the free list (prefix entry kept).
  void release(int32_t block);

  // Registers `block` as block `index` of prefix `prefix_id`; no-op when that key already has a
  // block or `block` already holds a key. `block` must be held (refcount > 0).
  void cache_prefix_block(int32_t prefix_id, int64_t index, int32_t block);
  std::optional<int32_t> cached_prefix_block(int32_t prefix_id, int64_t index) const;
  int64_t num_cached() const { return static_cast<int64_t>(cache_.size()); }

 private:
  using Key = std::pair<int32_t, int64_t>;  // (prefix_id, block index within the prefix)

  void check_block(const char* what, int32_t block) const;

  std::vector<int32_t> refcount_;                       // [num_blocks]
  std::list<int32_t> free_list_;                        // blocks with refcount 0
  std::vector<std::list<int32_t>::iterator> free_pos_;  // [num_blocks], valid when free
  std::map<Key, int32_t> cache_;                        // prefix block -> physical block
  std::vector<std::optional<Key>> key_of_;              // [num_blocks] reverse of cache_
  int64_t num_evictions_ = 0;
};

}  // namespace mlakit::sim
