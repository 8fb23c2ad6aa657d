#include "models/model_runner.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "tformers/error.h"

namespace tformers::models {

namespace {

int64_t buffer_bytes(const backends::Buffer& b) {
  return shape_numel(b.type().shape) * int64_t(dtype_size(b.type().dtype));
}

}  // namespace

int64_t ModelRunner::weight_bytes() const {
  std::set<const backends::Buffer*> seen;  // a tied weight is one buffer under two names
  int64_t bytes = 0;
  for (const auto& [name, buf] : m_.weights)
    if (seen.insert(buf.get()).second) bytes += buffer_bytes(*buf);
  return bytes;
}

int64_t ModelRunner::state_bytes() const {
  int64_t bytes = 0;
  for (const auto* states : {&m_.cache, &m_.kv_pool})
    for (const auto& [name, buf] : *states) bytes += buffer_bytes(*buf);
  return bytes;
}

std::map<const backends::Executable*, uint64_t> ModelRunner::step_arena_bytes() const {
  std::map<const backends::Executable*, uint64_t> arenas;
  for (const auto& [shape, step] : m_.steps) arenas[step.exe.get()] = step.exe->arena_bytes();
  return arenas;
}

std::optional<std::pair<uint64_t, uint64_t>> ModelRunner::tp_checkpoint_bytes() const {
  if (!m_.tp) return std::nullopt;
  return std::pair{m_.tp->bytes_read(), m_.tp->bytes_full()};
}

void ModelRunner::set_attention_mask(const Tensor& mask) {
  const Shape want{m_.cache_batch, m_.cache_len};
  if (mask.dtype() != DType::i32 || mask.shape() != want)
    throw InvalidArgumentError("attention_mask must be int32" + shape_str(want) +
                               " (batch, max_cache_len), got " +
                               std::string(dtype_name(mask.dtype())) + shape_str(mask.shape()));
  m_.cache.at("attention_mask") = m_.backend->upload(mask);
}

ModelRunner::Step& ModelRunner::prepare_static(int64_t tokens, int64_t keep, bool uncached) {
  return m_.step({m_.cache_batch, tokens, m_.cache_len, keep == tokens ? 0 : keep}, uncached);
}

void ModelRunner::run_static(Step& step, const Tensor& ids, const Tensor& positions, int64_t start,
                             Tensor& logits) {
  Tensor slot = Tensor::from_vector<int32_t>({}, DType::i32, {int32_t(start)});
  const Tensor* inputs[] = {&ids, &positions, &slot};
  Tensor* outputs[] = {&logits};
  m_.run(step, inputs, outputs);
}

void ModelRunner::allocate_pool(int64_t blocks, int64_t block_size, int64_t table_blocks,
                                int64_t state_slots) {
  send(Call::kAllocatePool, blocks, block_size, table_blocks, state_slots);
  m_.allocate_pool(blocks, block_size, table_blocks, state_slots);
}

ModelRunner::Step& ModelRunner::prepare_paged(int64_t rows, int64_t tokens, int64_t sequences) {
  if (sequences > 0 && (rows != 1 || sequences > tokens))
    throw InvalidArgumentError(
        "prepare_paged: a packed step has one row of at least as many "
        "tokens as sequences, got " +
        std::to_string(rows) + " rows of " + std::to_string(tokens) + " tokens for " +
        std::to_string(sequences) + " sequences");
  send(Call::kPreparePaged, rows, tokens, sequences);
  return m_.step({.batch = rows,
                  .new_tokens = tokens,
                  .cache_len = 0,
                  .logits_to_keep = 1,
                  .kv_blocks = m_.pool_blocks,
                  .block_size = m_.pool_block_size,
                  .table_blocks = m_.pool_table_blocks,
                  .sequences = sequences,
                  .state_slots = m_.pool_state_slots});
}

bool ModelRunner::packs_sequences() const { return m_.backend->capabilities().packs_sequences; }

void ModelRunner::run_paged(Step& step, std::span<const SequenceChunk> seqs, Tensor& logits) {
  const int64_t rows = step.shape.batch, tokens = step.shape.new_tokens;
  const int64_t packed = step.shape.sequences, MB = step.shape.table_blocks;
  const int64_t capacity = packed ? packed : rows;
  if (int64_t(seqs.size()) > capacity)
    throw InvalidArgumentError("run_paged: " + std::to_string(seqs.size()) +
                               " sequences do not fit a step of " + std::to_string(capacity) +
                               (packed ? " packed sequences" : " rows"));
  Tensor ids = Tensor::zeros({rows, tokens}, DType::i32);
  Tensor pos = Tensor::zeros({rows, tokens}, DType::i32);
  Tensor index = packed ? Tensor::zeros({rows, tokens}, DType::i32) : Tensor();
  Tensor table = Tensor::zeros({capacity, MB}, DType::i32);
  Tensor slots = step.shape.state_slots ? Tensor::zeros({rows, 2}, DType::i32) : Tensor();
  std::fill_n(pos.data<int32_t>(), pos.numel(), -1);
  if (slots.defined()) std::fill_n(slots.data<int32_t>(), slots.numel(), -1);
  int64_t total = 0;
  for (size_t r = 0; r < seqs.size(); ++r) {
    const SequenceChunk& c = seqs[r];
    const int64_t n = int64_t(c.tokens.size());
    total += n;
    if (n == 0 || n > tokens || int64_t(c.blocks.size()) > MB)
      throw InvalidArgumentError(
          "run_paged: sequence " + std::to_string(r) + " has " + std::to_string(n) +
          " new tokens and " + std::to_string(c.blocks.size()) +
          " blocks, but this step takes 1 to " + std::to_string(tokens) + " tokens and at most " +
          std::to_string(MB) + " blocks per sequence");
    std::copy(c.blocks.begin(), c.blocks.end(), table.data<int32_t>() + int64_t(r) * MB);
    if (slots.defined()) {
      const int32_t read = c.read_slot < 0 ? c.state_slot : c.read_slot;
      if (c.state_slot < 0 || c.state_slot >= step.shape.state_slots ||
          read >= step.shape.state_slots)
        throw InvalidArgumentError("run_paged: sequence " + std::to_string(r) +
                                   " has state slots " + std::to_string(read) + " and " +
                                   std::to_string(c.state_slot) + ", outside the pools' " +
                                   std::to_string(step.shape.state_slots));
      slots.data<int32_t>()[2 * r] = read;
      slots.data<int32_t>()[2 * r + 1] = c.state_slot;
    }
  }
  if (packed && total > tokens)
    throw InvalidArgumentError("run_paged: " + std::to_string(total) +
                               " new tokens do not fit a packed step of " + std::to_string(tokens));
  auto place = [&](int64_t at, size_t r, int64_t t) {
    ids.data<int32_t>()[at] = seqs[r].tokens[size_t(t)];
    pos.data<int32_t>()[at] = int32_t(seqs[r].position + t);
    if (packed) index.data<int32_t>()[at] = int32_t(r);
  };
  if (!packed) {
    for (size_t r = 0; r < seqs.size(); ++r) {
      const int64_t n = int64_t(seqs[r].tokens.size());
      for (int64_t t = 0; t < n; ++t) place(int64_t(r) * tokens + (tokens - n) + t, r, t);
    }
  } else {
    // The row's last `packed` positions are the ones the graph keeps: sequence i's last token
    // goes to the i-th of them, the other tokens fill the rest of them and then the places
    // before, right-aligned; the rest is padding. A sequence's tokens need not lie together or
    // in order: each is written to its own position before any is attended to.
    for (size_t r = 0; r < seqs.size(); ++r)
      place(tokens - packed + int64_t(r), r, int64_t(seqs[r].tokens.size()) - 1);
    int64_t at = tokens - packed + int64_t(seqs.size());
    const int64_t body = total - int64_t(seqs.size());
    int64_t before = tokens - packed - std::max<int64_t>(0, body - (packed - int64_t(seqs.size())));
    for (size_t r = 0; r < seqs.size(); ++r)
      for (int64_t t = 0; t + 1 < int64_t(seqs[r].tokens.size()); ++t)
        place(at < tokens ? at++ : before++, r, t);
  }
  std::vector<Tensor*> inputs = {&ids, &pos, &table};
  if (packed) inputs.push_back(&index);
  if (slots.defined()) inputs.push_back(&slots);
  run_paged_inputs(step, inputs, logits);
}

void ModelRunner::run_paged_inputs(Step& step, std::span<Tensor* const> inputs, Tensor& logits) {
  if (leading_) {
    send(Call::kRunPaged, step.shape.batch, step.shape.new_tokens, step.shape.table_blocks,
         step.shape.sequences);
    for (Tensor* t : inputs) m_.tp->group().broadcast(t->raw(), int64_t(t->nbytes()), 0);
  }
  const std::vector<const Tensor*> in(inputs.begin(), inputs.end());
  Tensor* outputs[] = {&logits};
  m_.run(step, in, outputs);
}

ModelRunner::~ModelRunner() {
  if (!leading_) return;
  try {
    send(Call::kStop, 0, 0, 0);
  } catch (const std::exception& e) {
    // A destructor cannot throw; the followers then wait until the job ends.
    std::fprintf(stderr, "tformers: could not stop the other ranks' steps: %s\n", e.what());
  }
}

void ModelRunner::send(Call call, int64_t a, int64_t b, int64_t c, int64_t d) {
  if (!leading_) return;
  int64_t words[5] = {int64_t(call), a, b, c, d};
  m_.tp->group().broadcast(words, sizeof words, 0);
}

void ModelRunner::lead() {
  if (!m_.tp || m_.tp->rank() != 0)
    throw InvalidArgumentError(
        m_.tp ? "ModelRunner::lead: rank " + std::to_string(m_.tp->rank()) +
                    " follows; only rank 0 of the tensor-parallel group leads"
              : std::string("ModelRunner::lead: the model runs in one process; there is no one "
                            "to lead"));
  leading_ = true;
}

void ModelRunner::follow() {
  if (!m_.tp || m_.tp->rank() == 0)
    throw InvalidArgumentError(
        m_.tp ? std::string("ModelRunner::follow: rank 0 leads; the other ranks follow")
              : std::string("ModelRunner::follow: the model runs in one process; there is no "
                            "one to follow"));
  distributed::ProcessGroup& g = m_.tp->group();
  std::map<int64_t, Tensor> logits_by_rows;  // the logits are rank 0's to read
  for (;;) {
    int64_t words[5];
    g.broadcast(words, sizeof words, 0, distributed::ProcessGroup::Wait::kUnbounded);
    const auto [call, a, b, c, d] = words;
    try {
      switch (Call(call)) {
        case Call::kStop:
          return;
        case Call::kAllocatePool:
          m_.allocate_pool(a, b, c, d);
          break;
        case Call::kPreparePaged:
          prepare_paged(a, b, c);
          break;
        case Call::kRunPaged: {
          // (rows a, tokens b, table blocks c, packed sequences d), as run_paged sends them.
          const int64_t seqs = d ? d : a;
          Step& step = prepare_paged(a, b, d);
          Tensor ids = Tensor::zeros({a, b}, DType::i32), pos = Tensor::zeros({a, b}, DType::i32),
                 table = Tensor::zeros({seqs, c}, DType::i32),
                 index = d ? Tensor::zeros({a, b}, DType::i32) : Tensor(),
                 slots = step.shape.state_slots ? Tensor::zeros({a, 2}, DType::i32) : Tensor();
          std::vector<Tensor*> used = {&ids, &pos, &table};
          if (d) used.push_back(&index);
          if (slots.defined()) used.push_back(&slots);
          for (Tensor* t : used) g.broadcast(t->raw(), int64_t(t->nbytes()), 0);
          TF_CHECK(step.shape.table_blocks == c, "rank 0 runs steps of ", c,
                   " table blocks, this rank's pool takes ", step.shape.table_blocks);
          auto it = logits_by_rows.find(seqs);
          if (it == logits_by_rows.end())
            it = logits_by_rows.emplace(seqs, Tensor::zeros({seqs, 1, vocab_size()}, DType::f32))
                     .first;
          run_paged_inputs(step, used, it->second);
          break;
        }
        default:
          TF_CHECK(false, "unknown step call ", call, " from rank 0");
      }
    } catch (const InvalidArgumentError&) {
      // The same inputs failed the same checks on rank 0, which reports it; no collective ran.
    } catch (const std::exception& e) {
      distributed::write_fatal_line("tformers: rank %d: a step rank 0 sent failed here: %s\n",
                                    g.rank(), e.what());
      g.abort(1);
    }
  }
}

}  // namespace tformers::models
