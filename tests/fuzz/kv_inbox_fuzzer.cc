// Decode's KV inbox (common/kv/inbox.h) against a hostile or confused peer: arbitrary
// sequences of opening and closing reservations and of writes and commits under known,
// stale and made-up tokens, at any offset and length. The invariant that makes KV lifetime
// safe: a write lands only in the blocks of the open reservation it names, inside its
// stream, each byte once; anything else changes no byte of the pool.
// Input: a program of operations, 8 bytes each.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/kv/inbox.h"
#include "common/kv/kv_stream.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::engine::KvBlockPool;
  // 2 layers, 1 KV head of 8, blocks of 4 tokens: 128 bytes a piece, 8 blocks.
  auto pool = KvBlockPool::Create({2, 1, 8, 4, 8});
  FUZZ_CHECK(pool.ok());
  KvBlockPool& p = **pool;
  tandem::kv::KvInbox inbox(&p);
  struct Open {
    std::string token;
    std::vector<int32_t> blocks;
  };
  std::vector<Open> open;
  std::vector<std::string> closed;
  std::vector<char> before(p.size_bytes());
  const auto snapshot = [&] { std::memcpy(before.data(), p.data(), p.size_bytes()); };
  // Whether byte `i` of the pool's memory belongs to one of `blocks`.
  const auto in_blocks = [&](size_t i, const std::vector<int32_t>& blocks) {
    const size_t stride = KvBlockPool::PoolStrideBytes(p.config());
    const size_t within = i % stride;
    const size_t block = within / p.block_bytes();
    for (int32_t b : blocks) {
      if (static_cast<size_t>(b) == block) return true;
    }
    return false;
  };
  std::vector<char> payload(4096, 'z');
  for (size_t at = 0; at + 8 <= size; at += 8) {
    const uint8_t* op = data + at;
    const uint16_t offset = static_cast<uint16_t>(op[2] | op[3] << 8);
    const uint16_t length = static_cast<uint16_t>((op[4] | op[5] << 8) % 1024);
    std::memset(payload.data(), op[6], length);
    switch (op[0] % 5) {
      case 0: {  // open a reservation of 1 to 3 distinct blocks
        std::vector<int32_t> blocks;
        for (int i = 0; i < 1 + op[1] % 3; ++i) {
          const int32_t b = (op[2 + i] + i) % 8;
          bool taken = false;
          for (const Open& o : open) {
            for (int32_t x : o.blocks) taken = taken || x == b;
          }
          for (int32_t x : blocks) taken = taken || x == b;
          if (!taken) blocks.push_back(b);
        }
        if (blocks.empty()) break;
        auto token = inbox.Open(blocks);
        FUZZ_CHECK(token.ok() && token->size() == tandem::kv::kTokenBytes);
        open.push_back({*token, blocks});
        break;
      }
      case 1:  // close one
        if (!open.empty()) {
          const size_t i = op[1] % open.size();
          FUZZ_CHECK(inbox.Close(open[i].token));
          closed.push_back(open[i].token);
          open.erase(open.begin() + static_cast<long>(i));
        }
        break;
      case 2:
      case 3: {  // write under an open, a closed, or a made-up token
        std::string token(tandem::kv::kTokenBytes, static_cast<char>(op[1]));
        const Open* target = nullptr;
        if (op[0] % 5 == 2 && !open.empty()) {
          target = &open[op[1] % open.size()];
          token = target->token;
        } else if (!closed.empty() && op[1] % 2 == 0) {
          token = closed[op[1] % closed.size()];
        }
        snapshot();
        const absl::Status s = inbox.Write(token, offset, {payload.data(), length});
        for (size_t i = 0; i < p.size_bytes(); ++i) {
          const char now = reinterpret_cast<const char*>(p.data())[i];
          if (now == before[i]) continue;
          // A byte changed: the write succeeded and it is one of the target's blocks.
          FUZZ_CHECK(s.ok() && target != nullptr && in_blocks(i, target->blocks));
        }
        break;
      }
      default: {  // commit
        if (open.empty()) break;
        const Open& o = open[op[1] % open.size()];
        const uint64_t total = tandem::kv::KvStream::BytesFor(p.config(), o.blocks.size());
        const absl::Status s = inbox.Commit(o.token, op[6] % 2 ? total : offset);
        if (s.ok()) FUZZ_CHECK(inbox.CheckComplete(o.token).ok());
        break;
      }
    }
  }
  return 0;
}
