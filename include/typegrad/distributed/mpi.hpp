#pragma once
// Data-parallel training over MPI (PyTorch's DistributedDataParallel, on an existing engine).
// Needs MPI (link typegrad::mpi); typegrad.hpp never includes this header. docs/distributed.md.
//
//   auto step = tg::compile(loss, tg::wrt(W1, b1, W2, b2));   // params optionally hooked, below
//   tg::mpi::data_parallel dp(step, model, MPI_COMM_WORLD);   // handshake, then broadcast from rank 0
//   float l = dp.value_and_grad(grads, tg::bind(X, my_slice_x), tg::bind(y, my_slice_y));
//   opt.step(model, grads);                                   // grads: the average over the ranks
//
// Each call runs the step with tg::params(model) and tg::grads_into(grads) and averages every
// gradient over the ranks in buckets (options.bucket_bytes, default 25 MB as DDP), each one
// MPI_Iallreduce. A param hooked with the post-accumulate hook tg::mpi::allreduce_grad{} joins a
// bucket when that hook runs: the core runs it inside the backward, right after the plan step
// that finishes the param's gradient (and last reads the param), so buckets of the last layers
// start while the first layers' gradients are computed. A param used in the graph as
// tg::mpi::allreduce_in_backward(W) joins as soon as the plan has computed its total gradient (a
// tensor hook), before it is stored. A full bucket starts its collective at once; the remaining
// gradients follow in depth-first order of the parameter set; the call waits for every
// collective before it returns. The returned loss is the ranks' mean.
//
// Guarantees:
// - Every rank issues the same collectives in the same order (the hooks' order is part of the
//   graph's type; the rest is depth-first), each rank receives the same reduced buffer, and the
//   average is computed identically from it, so params stay bitwise equal across ranks given a
//   bitwise equal optimizer. MPI advises implementations to give every rank the same allreduce
//   result; Open MPI's algorithms do (reduced segments are distributed, and float addition is
//   commutative). tests/mpi checks it bitwise at 2 and 4 ranks; params_identical() checks it at
//   run time.
// - Set-up handshake: the step's graph type, the parameter layout (names, sizes, dtypes) and the
//   bucket size are hashed and gathered; any difference throws mismatch_error on every rank.
// - The communicator is a duplicate with MPI_ERRORS_RETURN: a failed MPI call throws mpi_error.
//   options.timeout_seconds > 0 bounds every wait (timeout_error); see docs/distributed.md for
//   what happens when a rank dies.
// - bf16/f16 gradients are reduced in f32, f32 in f32, f64 in f64.
//
// Gradient accumulation without communication (DDP's no_sync): calls inside a no_sync() scope add
// into grads locally; the next call outside it adds its own and averages the sum.
//
// Optimizer in the backward: hook each param with allreduce_grad{} then tg::optimizer_step{}
// (in that order) and call inside a tg::optimizer_in_backward scope: within such a scope
// allreduce_grad averages its param's gradient before returning, so the update that follows sees
// the average.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/core/half.hpp>
#include <typegrad/ops/hook.hpp>
#include <typegrad/train/optim.hpp>
#include <typegrad/train/params.hpp>

namespace typegrad::mpi {

// An MPI call returned an error (the message carries MPI_Error_string).
struct mpi_error : error {
    using error::error;
};
// The ranks disagree at set-up: graph, parameter layout or options.
struct mismatch_error : error {
    using error::error;
};
// A collective did not complete within options.timeout_seconds (a rank died or hangs).
struct timeout_error : error {
    using error::error;
};

// Settings of a data_parallel (PyTorch DDP's constructor arguments).
struct options {
    // Gradients are packed into buckets of about this many bytes, one all-reduce per bucket.
    std::size_t bucket_bytes = std::size_t(25) << 20;  // DDP's default bucket_cap_mb
    // A collective not done after this long throws timeout_error.
    double timeout_seconds = 0;                         // 0: wait as long as MPI does
};

namespace detail {

using typegrad::detail::message;

inline void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    typegrad::detail::fail<mpi_error>({"typegrad: mpi::data_parallel: ", what, " failed: ", std::string_view(text, std::size_t(len))});
}

// FNV-1a, 64 bits: the handshake compares fingerprints, not content.
inline void hash_bytes(std::uint64_t& h, const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
}
inline void hash_string(std::uint64_t& h, std::string_view s) {
    const std::uint64_t n = s.size();
    hash_bytes(h, &n, sizeof n);
    hash_bytes(h, s.data(), s.size());
}

enum class kind : std::uint8_t { f32, f64, bf16, f16 };
template <class T>
constexpr kind kind_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return kind::f32;
    else if constexpr (std::is_same_v<U, double>) return kind::f64;
    else if constexpr (std::is_same_v<U, bf16>) return kind::bf16;
    else if constexpr (std::is_same_v<U, f16>) return kind::f16;
    else {
        static_assert(!sizeof(U*), "typegrad: mpi::data_parallel averages float, double, bf16 and f16 gradients.");
        return kind::f32;
    }
}
constexpr std::size_t size_of(kind k) { return k == kind::f64 ? 8 : k == kind::f32 ? 4 : 2; }
// Reduced in f64 only when the gradient is f64; bf16/f16 in f32.
constexpr bool reduced_in_double(kind k) { return k == kind::f64; }

struct buffer_entry {
    std::string name;
    void* data;
    std::size_t size;
    kind k;
};

template <class S>
std::vector<buffer_entry> table_of(S& set) {
    std::vector<buffer_entry> t;
    for_each_param(set, [&](std::string_view name, auto& buf) {
        using T = std::remove_cv_t<std::ranges::range_value_t<std::remove_reference_t<decltype(buf)>>>;
        t.push_back({std::string(name), const_cast<T*>(std::ranges::data(buf)), std::size_t(std::ranges::size(buf)),
                     kind_of<T>()});
    });
    return t;
}

template <class R, class T>
void pack(R* dst, const void* src, std::size_t n) {
    const T* s = static_cast<const T*>(src);
    for (std::size_t i = 0; i < n; ++i) dst[i] = R(s[i]);
}
template <class R, class T>
void unpack(void* dst, const R* src, std::size_t n, R ranks) {
    T* d = static_cast<T*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = T(src[i] / ranks);
}
template <class R>
void pack_any(R* dst, const buffer_entry& e) {
    switch (e.k) {
    case kind::f32: pack<R, float>(dst, e.data, e.size); break;
    case kind::f64: pack<R, double>(dst, e.data, e.size); break;
    case kind::bf16: pack<R, bf16>(dst, e.data, e.size); break;
    case kind::f16: pack<R, f16>(dst, e.data, e.size); break;
    }
}
template <class R, class T>
void add_to(R* dst, const void* src, std::size_t n) {
    const T* s = static_cast<const T*>(src);
    for (std::size_t i = 0; i < n; ++i) dst[i] = R(s[i]) + dst[i];
}
template <class R>
void add_any(R* dst, const buffer_entry& e) {
    switch (e.k) {
    case kind::f32: add_to<R, float>(dst, e.data, e.size); break;
    case kind::f64: add_to<R, double>(dst, e.data, e.size); break;
    case kind::bf16: add_to<R, bf16>(dst, e.data, e.size); break;
    case kind::f16: add_to<R, f16>(dst, e.data, e.size); break;
    }
}
template <class R>
void unpack_any(const buffer_entry& e, const R* src, R ranks) {
    switch (e.k) {
    case kind::f32: unpack<R, float>(e.data, src, e.size, ranks); break;
    case kind::f64: unpack<R, double>(e.data, src, e.size, ranks); break;
    case kind::bf16: unpack<R, bf16>(e.data, src, e.size, ranks); break;
    case kind::f16: unpack<R, f16>(e.data, src, e.size, ranks); break;
    }
}

// One collective: gradients packed back to back in the reduction dtype.
struct bucket {
    bool in_double = false;
    std::vector<float> f;
    std::vector<double> d;
    std::vector<std::pair<std::size_t, std::size_t>> members;  // (entry, offset)
    std::size_t used = 0;
    std::size_t loss_offset = static_cast<std::size_t>(-1);
    MPI_Request request = MPI_REQUEST_NULL;

    void reset(bool dbl) {
        in_double = dbl;
        members.clear();
        used = 0;
        loss_offset = static_cast<std::size_t>(-1);
        request = MPI_REQUEST_NULL;
    }
    void reserve_more(std::size_t n) {
        if (in_double) { if (d.size() < used + n) d.resize(used + n); }
        else if (f.size() < used + n) f.resize(used + n);
    }
    std::size_t bytes() const { return used * (in_double ? 8 : 4); }
};

// The engine of one data_parallel object, reached by allreduce_grad through a thread-local.
class engine {
public:
    engine(MPI_Comm comm, options o) : opt_(o) {
        if (o.bucket_bytes < 8)
            throw error("typegrad: mpi::data_parallel: options.bucket_bytes must be at least 8");
        check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
        try {
            check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
            check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
            check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
        } catch (...) {
            MPI_Comm_free(&comm_);
            throw;
        }
    }
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;
    ~engine() {
        // Collectives still in flight write into our buckets: finish them before freeing. After
        // MPI_Finalize (an object outliving it) no MPI call is allowed, and none is needed.
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        abandon();
        MPI_Comm_free(&comm_);
    }

    int rank() const { return rank_; }
    int size() const { return size_; }
    MPI_Comm comm() const { return comm_; }

    // Waits for the requests, bounded by options.timeout_seconds when set.
    void wait(std::span<MPI_Request> reqs, const char* what) {
        if (reqs.empty()) return;
        if (opt_.timeout_seconds <= 0) {
            check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), what);
            return;
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.timeout_seconds);
        for (;;) {
            int done = 0;
            check(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what);
            if (done) return;
            if (std::chrono::steady_clock::now() > deadline) {
                broken_ = true;
                typegrad::detail::fail<timeout_error>({"typegrad: mpi::data_parallel: ", what, " did not complete within ",
                                                       std::to_string(opt_.timeout_seconds),
                                                       " s on rank ", std::to_string(rank_),
                                                       " (a rank died or stopped calling); the communicator is unusable"});
            }
            std::this_thread::yield();
        }
    }

    // Set-up: every rank's fingerprint against rank 0's, then the params from rank 0.
    void handshake(std::string_view graph, const std::vector<buffer_entry>& params) {
        std::uint64_t g = 0xcbf29ce484222325ull, layout = 0xcbf29ce484222325ull, total = 0;
        hash_string(g, graph);
        for (const auto& e : params) {
            hash_string(layout, e.name);
            hash_bytes(layout, &e.size, sizeof e.size);
            hash_bytes(layout, &e.k, sizeof e.k);
            total += e.size;
        }
        const std::uint64_t mine[5] = {g, layout, params.size(), total, opt_.bucket_bytes};
        std::vector<std::uint64_t> all(5 * std::size_t(size_));
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Iallgather(mine, 5, MPI_UINT64_T, all.data(), 5, MPI_UINT64_T, comm_, &r), "MPI_Iallgather (handshake)");
        wait(std::span(&r, 1), "the set-up handshake");
        for (int q = 1; q < size_; ++q) {
            const std::uint64_t* o = &all[5 * std::size_t(q)];
            const char* what = o[0] != all[0] ? "compiled step (graph type)"
                             : o[1] != all[1] ? "parameter layout (names, sizes, dtypes)"
                             : o[4] != all[4] ? "options.bucket_bytes" : nullptr;
            if (what)
                typegrad::detail::fail<mismatch_error>({"typegrad: mpi::data_parallel: rank ", std::to_string(q), "'s ", what,
                                                        " differs from rank 0's (rank ", std::to_string(q), ": ",
                                                        std::to_string(o[2]), " param buffers of ", std::to_string(o[3]),
                                                        " elements; rank 0: ", std::to_string(all[2]), " of ",
                                                        std::to_string(all[3]), ")"});
        }
        std::vector<MPI_Request> reqs;
        for (const auto& e : params)
            for (std::size_t off = 0, n = e.size * size_of(e.k); off < n;) {  // counts are int
                const std::size_t c = std::min<std::size_t>(n - off, std::size_t(1) << 30);
                reqs.push_back(MPI_REQUEST_NULL);
                check(MPI_Ibcast(static_cast<char*>(e.data) + off, int(c), MPI_BYTE, 0, comm_, &reqs.back()),
                      "MPI_Ibcast (initial params)");
                off += c;
            }
        wait(reqs, "the broadcast of the initial params");
    }

    // ---- one step ----
    void begin(std::vector<buffer_entry> grads, bool sync, bool blocking_hooks, bool accumulate) {
        grads_ = std::move(grads);
        done_.assign(grads_.size(), false);
        sync_ = sync;
        blocking_ = blocking_hooks;
        accumulate_ = accumulate;
        t_begin_ = std::chrono::steady_clock::now();
        first_start_ = -1;
        order_.clear();
        used_ = 0;
        open_[0] = open_[1] = no_bucket;
        hooked_ = 0;
    }

    // From allreduce_grad: the gradient at `data` is complete.
    void ready(const void* data, std::size_t n, kind k) {
        if (!sync_) return;  // no_sync: accumulate locally
        std::size_t i = 0;
        while (i < grads_.size() && grads_[i].data != data) ++i;
        if (i == grads_.size() || grads_[i].size != n || grads_[i].k != k)
            throw binding_error("typegrad: mpi::allreduce_grad: the hooked param's gradient is not a buffer of the "
                                "gradient struct given to data_parallel::value_and_grad");
        if (done_[i]) return;
        ++hooked_;
        if (blocking_) {
            // optimizer in the backward: the next hook updates the param, so finish this one now
            add(i);
            launch(open_[reduced_in_double(k)]);
            finish_launched();
            return;
        }
        add(i);
        progress();
    }

    // From allreduce_in_backward's tensor hook, in the middle of the backward: the total gradient
    // of the param named `name` is at `data` (scratch the backward reuses, so it is packed now),
    // before it is written (or, after no_sync calls, added) to its grad_into buffer.
    void ready_in_backward(std::string_view name, const void* data, std::size_t n, kind k) {
        // no_sync: nothing to send; optimizer in the backward: the post-accumulate hook reduces
        if (!sync_ || blocking_) return;
        std::size_t i = 0;
        while (i < grads_.size() && grads_[i].name != name) ++i;
        if (i == grads_.size() || grads_[i].size != n)
            typegrad::detail::fail<binding_error>({"typegrad: mpi::allreduce_in_backward: the param '", name,
                                                   "' has no gradient buffer of its size in the gradient struct"});
        if (done_[i]) return;
        ++hooked_;
        add(i, buffer_entry{std::string(), const_cast<void*>(data), n, k}, accumulate_);
        progress();
    }

    // After the backward: the gradients no hook reported, the loss, then wait and average.
    template <class L>
    L finish(L loss) {
        if (!sync_) return loss;
        for (std::size_t i = 0; i < grads_.size(); ++i)
            if (!done_[i]) add(i);
        constexpr bool dbl = std::is_same_v<L, double>;
        bucket& b = open_bucket(dbl);
        b.reserve_more(1);
        b.loss_offset = b.used;
        if (dbl) b.d[b.used++] = double(loss);
        else b.f[b.used++] = float(loss);
        for (int t = 0; t < 2; ++t) launch(open_[t]);
        return L(finish_launched());
    }

    // After an exception in the step: collectives already started must complete on every rank
    // before their buffers can be reused; the others are not started here either.
    void abandon() {
        if (broken_) {
            // After a timeout nothing more is waited for; a collective that completes later may
            // still write into the buckets, so their storage is left allocated on purpose.
            if (!buckets_.empty()) static_cast<void>(new std::vector<bucket>(std::move(buckets_)));
            buckets_.clear();
            used_ = 0;
            return;
        }
        for (std::size_t b = 0; b < used_; ++b)
            if (buckets_[b].request != MPI_REQUEST_NULL) {
                try { wait(std::span(&buckets_[b].request, 1), "MPI_Iallreduce"); } catch (...) {}
            }
        used_ = 0;
    }

    double first_start_seconds() const { return first_start_; }
    std::vector<std::string> packed_order() const {
        std::vector<std::string> names;
        for (std::size_t i : order_) names.push_back(grads_[i].name);
        return names;
    }
    double seconds_since_begin() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin_).count();
    }
    std::size_t buckets_last_step() const { return last_buckets_; }
    std::size_t hooked_last_step() const { return hooked_; }
    double wait_seconds_last_step() const { return last_wait_; }

    template <class T>
    void allreduce_average(std::span<T> data) {
        buffer_entry e{"", data.data(), data.size(), kind_of<T>()};
        const bool dbl = reduced_in_double(e.k);
        bucket b;
        b.reset(dbl);
        b.reserve_more(e.size);
        if (dbl) pack_any(b.d.data(), e);
        else pack_any(b.f.data(), e);
        b.used = e.size;
        start(b);
        wait(std::span(&b.request, 1), "MPI_Iallreduce");
        if (dbl) unpack_any(e, b.d.data(), double(size_));
        else unpack_any(e, b.f.data(), float(size_));
    }

private:
    static constexpr std::size_t no_bucket = static_cast<std::size_t>(-1);

    bucket& open_bucket(bool dbl) {
        std::size_t& o = open_[dbl];
        if (o == no_bucket) {
            if (used_ == buckets_.size()) buckets_.emplace_back();
            o = used_++;
            buckets_[o].reset(dbl);
        }
        return buckets_[o];
    }
    void add(std::size_t i) { add(i, grads_[i], false); }
    // Packs src as gradient i; plus_buffer: add what grads_[i] holds (earlier no_sync calls).
    void add(std::size_t i, const buffer_entry& src, bool plus_buffer) {
        const buffer_entry& e = grads_[i];
        const bool dbl = reduced_in_double(e.k);
        bucket& b = open_bucket(dbl);
        b.reserve_more(e.size);
        if (dbl) {
            pack_any(b.d.data() + b.used, src);
            if (plus_buffer) add_any(b.d.data() + b.used, e);
        } else {
            pack_any(b.f.data() + b.used, src);
            if (plus_buffer) add_any(b.f.data() + b.used, e);
        }
        b.members.emplace_back(i, b.used);
        order_.push_back(i);
        b.used += e.size;
        done_[i] = true;
        if (b.bytes() >= opt_.bucket_bytes) launch(open_[dbl]);
    }
    void start(bucket& b) {
        // counts are int: a bucket over 2^31 elements would need splitting; 25 MB buckets never are
        if (b.used > std::size_t(INT32_MAX))
            throw error("typegrad: mpi::data_parallel: a single gradient over 2^31 elements is not supported");
        if (first_start_ < 0)
            first_start_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin_).count();
        void* p = b.in_double ? static_cast<void*>(b.d.data()) : static_cast<void*>(b.f.data());
        check(MPI_Iallreduce(MPI_IN_PLACE, p, int(b.used), b.in_double ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, comm_,
                             &b.request),
              "MPI_Iallreduce");
    }
    void launch(std::size_t& o) {
        if (o == no_bucket) return;
        start(buckets_[o]);
        o = no_bucket;
    }
    // Lets the started collectives advance (Open MPI progresses non-blocking collectives only
    // inside MPI calls).
    void progress() {
        for (std::size_t b = 0; b < used_; ++b)
            if (buckets_[b].request != MPI_REQUEST_NULL) {
                int flag = 0;
                check(MPI_Test(&buckets_[b].request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
            }
    }
    // Waits for every started bucket and writes the averages back; returns the reduced loss / p
    // when a bucket carried it.
    double finish_launched() {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<MPI_Request> reqs;
        for (std::size_t b = 0; b < used_; ++b) reqs.push_back(buckets_[b].request);
        wait(reqs, "MPI_Iallreduce");
        last_wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double loss = 0;
        for (std::size_t k = 0; k < used_; ++k) {
            bucket& b = buckets_[k];
            b.request = MPI_REQUEST_NULL;
            for (const auto& [i, off] : b.members) {
                if (b.in_double) unpack_any(grads_[i], b.d.data() + off, double(size_));
                else unpack_any(grads_[i], b.f.data() + off, float(size_));
            }
            if (b.loss_offset != no_bucket)
                loss = b.in_double ? b.d[b.loss_offset] / double(size_) : double(b.f[b.loss_offset] / float(size_));
        }
        last_buckets_ += used_;
        used_ = 0;
        return loss;
    }

public:
    void reset_counters() {
        last_wait_ = 0;
        last_buckets_ = 0;
    }

private:
    options opt_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    std::vector<buffer_entry> grads_;
    std::vector<bool> done_;
    std::vector<bucket> buckets_;  // reused across steps
    std::size_t used_ = 0;
    std::size_t open_[2] = {no_bucket, no_bucket};  // [reduced in double]
    bool sync_ = true, blocking_ = false, broken_ = false, accumulate_ = false;
    std::size_t hooked_ = 0, last_buckets_ = 0;
    double last_wait_ = 0;
    std::vector<std::size_t> order_;  // gradients in the order they were packed
    std::chrono::steady_clock::time_point t_begin_{};
    double first_start_ = -1;  // seconds from begin() to the first collective of the step
};

inline engine*& current_engine() {
    thread_local engine* e = nullptr;
    return e;
}

}  // namespace detail

// The post-accumulate hook that hands a param's finished gradient to the running
// data_parallel::value_and_grad (tg::post_accumulate_grad_hook(W, tg::mpi::allreduce_grad{})).
struct allreduce_grad {
    // Hands `grad` to the running data_parallel::value_and_grad; throws binding_error outside one.
    template <class T>
    void operator()(grad_view<T>, grad_view<T> grad) const {
        detail::engine* e = detail::current_engine();
        if (e == nullptr)
            throw binding_error("typegrad: mpi::allreduce_grad ran outside tg::mpi::data_parallel::value_and_grad "
                                "(its gradient would not be averaged)");
        e->ready(grad.data, grad.size(), detail::kind_of<T>());
    }
};

namespace detail {
// The tensor hook behind allreduce_in_backward: one type per param, so that it knows the name.
template <class Leaf>
struct reduce_in_backward_hook {
    template <class T>
    void operator()(grad_view<T> grad) const {
        engine* e = current_engine();
        if (e == nullptr)
            throw binding_error("typegrad: mpi::allreduce_in_backward ran outside "
                                "tg::mpi::data_parallel::value_and_grad (its gradient would not be averaged)");
        e->ready_in_backward(Leaf::name(), grad.data, grad.size(), kind_of<T>());
    }
};
}  // namespace detail

// Starts p's all-reduce from inside the backward, as soon as the plan has computed p's total
// gradient (a tensor hook, tg::hook, which runs at its place in the backward plan and copies the
// gradient), a step or two before the post-accumulate hook allreduce_grad would, which runs
// after the loop that stores it. Use it in the graph in place of p:
// tg::linear(X, tg::mpi::allreduce_in_backward(W1), ...). Within tg::optimizer_in_backward it
// leaves the reduction to allreduce_grad.
template <expression P>
constexpr auto allreduce_in_backward(P p) {
    using L = typename P::node_type;
    static_assert(is_leaf_v<L> && typegrad::detail::is_param_leaf<L>(),
                  "typegrad: mpi::allreduce_in_backward(p) takes a tg::param (a leaf that requires grad).");
    return hook(p, detail::reduce_in_backward_hook<L>{});
}

// Data-parallel training over MPI, the C++ form of torch.nn.parallel.DistributedDataParallel:
// each rank runs the compiled step on its own batch, and the gradients are averaged over the
// ranks in buckets, overlapping the backward where the params carry allreduce_grad or
// allreduce_in_backward hooks. Errors: mismatch_error (ranks disagree), timeout_error,
// mpi_error. See docs/distributed.md.
template <class Step, class Params>
class data_parallel {
public:
    // Collective over comm: every rank constructs it with the same step type and layout, or all
    // of them throw mismatch_error. Then model holds rank 0's params on every rank.
    data_parallel(const Step& step, Params& model, MPI_Comm comm, options o = {})
        : step_(step), model_(model), engine_(comm, o) {
        static_assert(typegrad::detail::hana_struct<Params>,
                      "typegrad: mpi::data_parallel(step, model, comm): model must be a parameter struct "
                      "(BOOST_HANA_DEFINE_STRUCT).");
        engine_.handshake(typeid(Step).name(), detail::table_of(model_));
    }

    // This process's rank in the communicator.
    int rank() const { return engine_.rank(); }
    // The number of ranks.
    int size() const { return engine_.size(); }
    // The duplicated communicator (MPI_ERRORS_RETURN) the collectives use.
    MPI_Comm comm() const { return engine_.comm(); }

    // Forward and backward on this rank's bindings; grads receives the gradients averaged over
    // the ranks (summed with earlier no_sync calls first). Returns the ranks' mean loss (inside
    // no_sync: this rank's loss).
    template <class... Args>
    auto value_and_grad(Params& grads, const Args&... args) {
        const bool sync = no_sync_depth_ == 0;
        const bool blocking = typegrad::detail::current_backward_target() != nullptr;
        engine_.reset_counters();
        engine_.begin(detail::table_of(grads), sync, blocking, pending_);
        struct scope {
            detail::engine* previous;
            explicit scope(detail::engine* e) : previous(detail::current_engine()) { detail::current_engine() = e; }
            ~scope() { detail::current_engine() = previous; }
        } in_step(&engine_);
        try {
            auto loss = pending_ ? typegrad::value_and_grad(step_, args..., typegrad::params(model_),
                                                            typegrad::grads_into(grads, typegrad::accumulate))
                                 : typegrad::value_and_grad(step_, args..., typegrad::params(model_),
                                                            typegrad::grads_into(grads));
            pending_ = !sync;
            compute_seconds_ = engine_.seconds_since_begin();
            return engine_.finish(loss);
        } catch (...) {
            engine_.abandon();
            throw;
        }
    }

    // While alive, value_and_grad accumulates locally without communication.
    class no_sync_scope {
    public:
        // Enters no_sync (scopes nest).
        explicit no_sync_scope(data_parallel& dp) : dp_(dp) { ++dp_.no_sync_depth_; }
        no_sync_scope(const no_sync_scope&) = delete;
        no_sync_scope& operator=(const no_sync_scope&) = delete;
        ~no_sync_scope() { --dp_.no_sync_depth_; }

    private:
        data_parallel& dp_;
    };
    // A scope during which value_and_grad accumulates gradients locally, without communication
    // (DDP's no_sync(), for gradient accumulation over micro-batches).
    [[nodiscard]] no_sync_scope no_sync() { return no_sync_scope(*this); }

    // Averages any buffer of float, double, bf16 or f16 over the ranks in place (bf16/f16 in f32).
    template <class T>
    void allreduce_average(std::span<T> data) { engine_.allreduce_average(data); }

    // True on every rank when the params are bitwise equal on all ranks (a hash is gathered).
    bool params_identical() {
        std::uint64_t h = 0xcbf29ce484222325ull;
        for (const auto& e : detail::table_of(model_)) detail::hash_bytes(h, e.data, e.size * detail::size_of(e.k));
        std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
        MPI_Request r = MPI_REQUEST_NULL;
        detail::check(MPI_Iallgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm(), &r), "MPI_Iallgather");
        engine_.wait(std::span(&r, 1), "params_identical");
        for (std::uint64_t x : all)
            if (x != all[0]) return false;
        return true;
    }

    // Figures of the last value_and_grad: collectives issued, gradients handed over by hooks,
    // seconds spent waiting for collectives (the all-reduce time not hidden).
    std::size_t buckets_last_step() const { return engine_.buckets_last_step(); }
    // The gradients the hooks handed over during the last value_and_grad.
    std::size_t hooked_last_step() const { return engine_.hooked_last_step(); }
    // Seconds the last value_and_grad waited for collectives (the all-reduce time not hidden).
    double wait_seconds_last_step() const { return engine_.wait_seconds_last_step(); }
    // When, in seconds after the call began, the first collective started (-1: none), and when the
    // step's forward + backward (hooks included) returned: a first start before the return means
    // the all-reduce began inside the backward.
    double first_collective_seconds_last_step() const { return engine_.first_start_seconds(); }
    // Seconds after the last value_and_grad began at which its forward and backward returned.
    double backward_done_seconds_last_step() const { return compute_seconds_; }
    // The params' dotted names in the order their gradients went into buckets in the last call.
    std::vector<std::string> packed_order_last_step() const { return engine_.packed_order(); }

private:
    const Step& step_;
    Params& model_;
    detail::engine engine_;
    int no_sync_depth_ = 0;
    bool pending_ = false;
    double compute_seconds_ = 0;  // no_sync calls left gradients to add to
};

}  // namespace typegrad::mpi
