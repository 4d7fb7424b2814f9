// labkit_cpp: a minimal c10d backend in C++, the way PyTorch's extension mechanism intends.
//
// Introduced in notebooks/04_custom_backend.ipynb. Built at run time by
// labkit/backends/cpp/__init__.py with torch.utils.cpp_extension.load and registered with
// torch.distributed.Backend.register_backend("labkit_cpp", creator, devices=["cpu"]).
//
// A backend is a subclass of c10d::Backend (torch/csrc/distributed/c10d/Backend.hpp) that
// overrides the collectives it supports; every collective returns a c10d::Work. The
// ProcessGroup that init_process_group builds dispatches each CPU collective to it.
//
// The data path is deliberately simple: every rank writes its bytes into the c10d Store that
// init_process_group hands the backend (a PrefixStore over the TCPStore, scoped to this
// group) and reads its peers' bytes back, under per-operation sequence keys. No transport of
// our own is needed. Production backends use the store only to bootstrap: gloo exchanges
// socket addresses through it and then runs ring/halving-doubling algorithms over direct TCP
// pairs on worker threads; NCCL exchanges a ncclUniqueId through it and then runs ring/tree
// kernels over NVLink / PCIe / InfiniBand on a CUDA stream. Both return a Work that completes
// later; this backend finishes each collective before returning, so its Work is born complete.

#include <torch/python.h>

#include <pybind11/chrono.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace labkit {

// The TCPStore drops the connection for values of 8 MiB and more: larger tensors go in chunks.
constexpr int64_t kChunkBytes = 4 << 20;

// A Work that is complete when constructed: the collective already ran in the caller's thread.
// DDP's reducer and `async_op=True` callers read the result through getFuture(), so the
// future must be completed with the output tensors (ProcessGroupGloo does the same on CPU).
class CompletedWork : public c10d::Work {
 public:
  CompletedWork(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, op_type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(outputs_));
    finish(); // Work's isCompleted(), isSuccess() and wait() now report success at once
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class StoreBackend : public c10d::Backend {
 public:
  StoreBackend(
      c10::intrusive_ptr<c10d::Store> store,
      int rank,
      int size,
      std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), store_(std::move(store)), timeout_(timeout) {}

  const std::string getBackendName() const override {
    return "labkit_cpp";
  }

  // Every rank publishes its tensor; every rank reads all of them and reduces them in rank
  // order 0, 1, ..., p-1, so all ranks compute the same bits (a fixed order matters for
  // floats: DDP replicas drift apart if ranks add in different orders).
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    at::Tensor& tensor = single(tensors, "allreduce");
    const auto op = opts.reduceOp.op_;
    checkReduceOp(op, tensor);
    const std::string key = nextKey("allreduce");
    at::Tensor local = tensor.contiguous();
    publish(key, rank_, local);
    at::Tensor acc = rank_ == 0 ? local.clone() : fetch(key, 0, local);
    for (int r = 1; r < size_; ++r) {
      at::Tensor peer = r == rank_ ? local : fetch(key, r, local);
      combine(acc, peer, op);
    }
    if (op == c10d::ReduceOp::AVG) {
      acc.div_(size_);
    }
    tensor.copy_(acc);
    release(key, size_, local.nbytes());
    return c10::make_intrusive<CompletedWork>(
        rank_, c10d::OpType::ALLREDUCE, tensors);
  }

  // The root publishes its tensor; every other rank reads it into its own.
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    at::Tensor& tensor = single(tensors, "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    TORCH_CHECK(root >= 0 && root < size_, "labkit_cpp broadcast: bad root ", root);
    const std::string key = nextKey("broadcast");
    if (rank_ == root) {
      publish(key, root, tensor.contiguous());
    } else {
      tensor.copy_(fetch(key, root, tensor.contiguous()));
    }
    release(key, 1, tensor.nbytes(), root);
    return c10::make_intrusive<CompletedWork>(
        rank_, c10d::OpType::BROADCAST, tensors);
  }

  // Every rank publishes its tensor and reads everyone's into outputs[0][r] (DDP needs this
  // to compare parameter shapes across ranks when it wraps a model).
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    at::Tensor& input = single(inputs, "allgather");
    TORCH_CHECK(
        outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
        "labkit_cpp allgather needs one list of ", size_, " output tensors");
    const std::string key = nextKey("allgather");
    at::Tensor local = input.contiguous();
    publish(key, rank_, local);
    for (int r = 0; r < size_; ++r) {
      outputs[0][r].copy_(r == rank_ ? local : fetch(key, r, local));
    }
    release(key, size_, local.nbytes());
    return c10::make_intrusive<CompletedWork>(
        rank_, c10d::OpType::ALLGATHER, outputs[0]);
  }

  // Every rank counts itself in; the last one to arrive opens the gate for all.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    const std::string key = nextKey("barrier");
    if (store_->add(key + "/arrived", 1) == size_) {
      store_->set(key + "/gate", std::vector<uint8_t>{1});
    }
    waitFor(key + "/gate", "every rank to reach the barrier");
    if (store_->add(key + "/left", 1) == size_) {
      for (const char* suffix : {"/arrived", "/gate", "/left"}) {
        store_->deleteKey(key + suffix);
      }
    }
    return c10::make_intrusive<CompletedWork>(
        rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  }

 private:
  static at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
    TORCH_CHECK(
        tensors.size() == 1, "labkit_cpp ", what, " takes one tensor, got ", tensors.size());
    at::Tensor& t = tensors[0];
    TORCH_CHECK(t.device().is_cpu(), "labkit_cpp ", what, " supports CPU tensors only");
    TORCH_CHECK(t.layout() == at::kStrided, "labkit_cpp ", what, " needs a dense tensor");
    return t;
  }

  static void checkReduceOp(c10d::ReduceOp::RedOpType op, const at::Tensor& t) {
    using R = c10d::ReduceOp;
    const bool bitwise = op == R::BAND || op == R::BOR || op == R::BXOR;
    TORCH_CHECK(
        op == R::SUM || op == R::AVG || op == R::PRODUCT || op == R::MIN || op == R::MAX ||
            bitwise,
        "labkit_cpp allreduce does not support this ReduceOp");
    TORCH_CHECK(
        op != R::AVG || at::isFloatingType(t.scalar_type()),
        "labkit_cpp allreduce: AVG needs a floating-point tensor, got ", t.scalar_type());
    TORCH_CHECK(
        !bitwise || !at::isFloatingType(t.scalar_type()),
        "labkit_cpp allreduce: bitwise ops need an integer tensor");
  }

  static void combine(at::Tensor& acc, const at::Tensor& x, c10d::ReduceOp::RedOpType op) {
    using R = c10d::ReduceOp;
    switch (op) {
      case R::SUM:
      case R::AVG:
        acc.add_(x);
        break;
      case R::PRODUCT:
        acc.mul_(x);
        break;
      case R::MIN:
        at::minimum_out(acc, acc, x);
        break;
      case R::MAX:
        at::maximum_out(acc, acc, x);
        break;
      case R::BAND:
        acc.bitwise_and_(x);
        break;
      case R::BOR:
        acc.bitwise_or_(x);
        break;
      case R::BXOR:
        acc.bitwise_xor_(x);
        break;
      default:
        TORCH_CHECK(false, "labkit_cpp: unsupported ReduceOp");
    }
  }

  // Collectives are issued in the same order on every rank (c10d's contract), so a counter
  // kept by each rank names the same operation everywhere.
  std::string nextKey(const char* what) {
    return std::string("labkit_cpp/") + std::to_string(seq_++) + "/" + what;
  }

  static int64_t numChunks(int64_t nbytes) {
    return std::max<int64_t>(1, (nbytes + kChunkBytes - 1) / kChunkBytes);
  }

  static std::string chunkKey(const std::string& key, int rank, int64_t chunk) {
    return key + "/r" + std::to_string(rank) + "/c" + std::to_string(chunk);
  }

  // A peer that never arrives (it crashed, or calls collectives in another order) ends the
  // wait after the group's timeout with a message that names what was awaited ("Timed out",
  // c10d's word, which callers and PyTorch's own tests match).
  void waitFor(const std::string& key, const std::string& what) {
    try {
      store_->wait({key}, timeout_);
    } catch (const c10::Error& e) {  // TCPStore: DistStoreError; FileStore: "Wait timeout"
      C10_THROW_ERROR(
          DistStoreError,
          c10::str(
              "labkit_cpp: Timed out after ", timeout_.count(), " ms waiting for ", what,
              " (", key, "); does every rank call the same collectives in the same order? ",
              e.what_without_backtrace()));
    }
  }

  // Writes the bytes of a contiguous tensor under key/r<rank>/c<i>.
  void publish(const std::string& key, int rank, const at::Tensor& t) {
    const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
    const int64_t nbytes = static_cast<int64_t>(t.nbytes());
    for (int64_t c = 0; c < numChunks(nbytes); ++c) {
      const int64_t begin = c * kChunkBytes;
      const int64_t end = std::min(nbytes, begin + kChunkBytes);
      store_->set(chunkKey(key, rank, c), std::vector<uint8_t>(bytes + begin, bytes + end));
    }
  }

  // Reads rank `rank`'s tensor, shaped like `like`, waiting up to the group's timeout.
  at::Tensor fetch(const std::string& key, int rank, const at::Tensor& like) {
    at::Tensor out = at::empty_like(like, at::MemoryFormat::Contiguous);
    auto* bytes = static_cast<uint8_t*>(out.data_ptr());
    const int64_t nbytes = static_cast<int64_t>(out.nbytes());
    for (int64_t c = 0; c < numChunks(nbytes); ++c) {
      const std::string k = chunkKey(key, rank, c);
      waitFor(k, c10::str("rank ", rank, " to send its tensor"));
      const std::vector<uint8_t> data = store_->get(k);
      const int64_t begin = c * kChunkBytes;
      const int64_t expected = std::min(nbytes, begin + kChunkBytes) - begin;
      TORCH_CHECK(
          static_cast<int64_t>(data.size()) == expected,
          "labkit_cpp: rank ", rank, " sent ", data.size(), " bytes where ", expected,
          " were expected: do all ranks pass tensors of the same shape and dtype?");
      if (expected > 0) {
        std::memcpy(bytes + begin, data.data(), expected);
      }
    }
    return out;
  }

  // Once every rank has read everything, the last one out deletes the keys of this operation
  // (`writers` ranks starting at `first` published), so the store does not grow without bound.
  void release(const std::string& key, int writers, size_t nbytes, int first = 0) {
    if (store_->add(key + "/done", 1) < size_) {
      return;
    }
    const int64_t chunks = numChunks(static_cast<int64_t>(nbytes));
    for (int w = 0; w < writers; ++w) {
      for (int64_t c = 0; c < chunks; ++c) {
        store_->deleteKey(chunkKey(key, first + w, c));
      }
    }
    store_->deleteKey(key + "/done");
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
};

c10::intrusive_ptr<c10d::Backend> createBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    const std::chrono::duration<float>& timeout) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "labkit_cpp: bad rank/size");
  const auto timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<StoreBackend>(store, rank, size, timeout_ms);
}

} // namespace labkit

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "labkit_cpp: a minimal c10d backend that exchanges tensors through the c10d Store";
  m.def(
      "create_backend",
      &labkit::createBackend,
      "Construct the backend for init_process_group: (store, rank, size, timeout)",
      py::arg("store"),
      py::arg("rank"),
      py::arg("size"),
      py::arg("timeout"));
}
