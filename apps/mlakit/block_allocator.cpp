#include "block_allocator.hpp"

#include <string>

#include "mlakit/error.hpp"

namespace mlakit::sim {

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  if (num_blocks < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockAllocator: num_blocks must be >= 1, got " + std::to_string(num_blocks));
  }
  refcount_.assign(num_blocks, 0);
  key_of_.assign(num_blocks, std::nullopt);
  free_pos_.resize(num_blocks);
  for (int64_t b = 0; b < num_blocks; ++b) {
    free_pos_[b] = free_list_.insert(free_list_.end(), static_cast<int32_t>(b));
  }
}

void BlockAllocator::check_block(const char* what, int32_t block) const {
  if (block < 0 || block >= num_blocks()) {
    throw Error(ErrorCode::kOutOfRange, std::string("BlockAllocator::") + what + ": block " +
                                            std::to_string(block) + " outside [0, " +
                                            std::to_string(num_blocks()) + ")");
  }
}

int32_t BlockAllocator::refcount(int32_t block) const {
  check_block("refcount", block);
  return refcount_[block];
}

int32_t BlockAllocator::allocate() {
  if (free_list_.empty()) {
    throw Error(ErrorCode::kInternal, "BlockAllocator::allocate: no free block (all " +
                                          std::to_string(num_blocks()) + " in use)");
  }
  const int32_t block = free_list_.front();
  free_list_.pop_front();
  refcount_[block] = 1;
  if (key_of_[block]) {  // the block held a cached prefix block: its data is about to change
    cache_.erase(*key_of_[block]);
    key_of_[block].reset();
    ++num_evictions_;
  }
  return block;
}

void BlockAllocator::retain(int32_t block) {
  check_block("retain", block);
  if (refcount_[block] == 0) free_list_.erase(free_pos_[block]);
  ++refcount_[block];
}

void BlockAllocator::release(int32_t block) {
  check_block("release", block);
  if (refcount_[block] == 0) {
    throw Error(ErrorCode::kInternal,
                "BlockAllocator::release: block " + std::to_string(block) + " is already free");
  }
  if (--refcount_[block] == 0) free_pos_[block] = free_list_.insert(free_list_.end(), block);
}

void BlockAllocator::cache_prefix_block(int32_t prefix_id, int64_t index, int32_t block) {
  check_block("cache_prefix_block", block);
  if (refcount_[block] == 0) {
    throw Error(ErrorCode::kInternal, "BlockAllocator::cache_prefix_block: block " +
                                          std::to_string(block) + " is not held");
  }
  if (key_of_[block]) return;
  const auto [it, inserted] = cache_.emplace(Key{prefix_id, index}, block);
  if (inserted) key_of_[block] = it->first;
}

std::optional<int32_t> BlockAllocator::cached_prefix_block(int32_t prefix_id, int64_t index) const {
  const auto it = cache_.find(Key{prefix_id, index});
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

}  // namespace mlakit::sim
