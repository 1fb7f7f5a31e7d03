// speclite's thread team: the calling thread and the pool's workers run a call's work together, each
// its share (team::share), meeting at the team's barrier (TeamBarrier).
//
// Why not OpenMP: between two calls libgomp's idle threads spin GOMP_SPINCOUNT pauses and then sleep
// in the kernel, and the next call waits for the wake-up: ~70 us a call on the 2-core Xeon VM, a
// seventh of a one-row step of the embedded pair, paid twice or more by every speculative iteration.
// Spinning longer in libgomp starves a busy neighbour process. Here an idle worker stays awake up to
// IDLE_NS after a call (spinning, then yielding): a call that follows within that time finds it
// awake. But only while the machine has a core to spare: a worker kept awake beside a busy process
// slowed the pair's speculative decoding to 0.7x. So the team's threads watch their share of the CPU
// during calls (Share); where one had to share its core, idle workers sleep at once, as libgomp's
// would, for a backoff that doubles while that goes on (benchmarks/RESULTS.md, "The team's own
// threads").
#pragma once

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

namespace team {

// Every wait inside a team (gemm.h's products, layer_ops' row loops and chains) spins BARRIER_SPIN
// pauses, then yields until the last thread arrives, never sleeping: a product's threads often
// finish more than a short spin apart, and a sleeper must be woken (whole int4 decode steps ran
// 1.13-1.16x faster on the AMX Xeon than with libgomp's barrier, and beside a busy process no
// slower: a yield hands the core to the thread the team waits for; yielding sooner measured
// 0.77-0.87x there). benchmarks/RESULTS.md, 2026-11-25.
constexpr int BARRIER_SPIN = 1000;
constexpr int64_t IDLE_NS = 2'000'000;  // an idle worker stays awake this long after a call
constexpr int64_t CONTENDED_NS = 50'000;  // a yield this long: another task runs on this core
constexpr int64_t BACKOFF_NS[2] = {5'000'000, 1'000'000'000};  // sleeping at once after contention: first, most
constexpr int64_t CONTENTION_WINDOW_NS = 2'000'000;  // calls' time over which a thread's share is judged
constexpr double CONTENTED_SHARE = 0.8;  // a thread that ran less than this of it shared its core

// Returns once done() holds: BARRIER_SPIN pauses, then yields, never sleeping.
template <class Done>
inline void spin_until(Done done) {
    for (int spins = 0; !done(); spins++)
        if (spins < BARRIER_SPIN) _mm_pause(); else sched_yield();
}

struct TeamBarrier {
    alignas(64) std::atomic<int> arrived{0};
    alignas(64) std::atomic<unsigned> generation{0};

    // Returns once all `threads` threads of the team have called it; what each wrote before is
    // visible to all after (the arrivals release, the last one's generation store publishes them).
    void wait(int threads) {
        const unsigned gen = generation.load(std::memory_order_acquire);
        if (arrived.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
            arrived.store(0, std::memory_order_relaxed);
            generation.store(gen + 1, std::memory_order_release);
            return;
        }
        spin_until([&] { return generation.load(std::memory_order_acquire) != gen; });
    }
};

inline thread_local int my_id = 0, my_size = 1;

inline int id() { return my_id; }      // this thread's place in its team, 0 outside one
inline int size() { return my_size; }  // its team's threads, 1 outside one

// This thread's share [begin, end) of n tasks: contiguous blocks, the first n % size() threads one
// task more (OpenMP's static schedule).
template <class I>
inline std::pair<I, I> share(I n) {
    const I t = my_id, q = n / my_size, r = n % my_size, begin = t * q + std::min(t, r);
    return {begin, begin + q + (t < r)};
}

struct Pool {
    std::mutex calls;  // one team at a time: callers on several threads take turns
    alignas(64) std::atomic<uint32_t> generation{0};  // one more per call; the sleepers' futex word
    alignas(64) std::atomic<int> pending{0};          // workers yet to finish the current call
    std::atomic<int> sleepers{0};
    std::atomic<int64_t> awake_from{0};  // idle workers stay awake only from this time on
    std::atomic<bool> contended{false};  // a worker found its core shared
    int64_t backoff = 0;                  // watch_contention's
    void (*job)(void *) = nullptr;
    void *arg = nullptr;
    int threads = 1;  // the current call's team, the caller included
    int workers = 0;  // started
};

inline int64_t clock_ns(clockid_t clock) {
    timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
}
inline int64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline int64_t cpu_ns() { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }  // the calling thread's CPU time

inline void futex(std::atomic<uint32_t> &word, int op, uint32_t value) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), op, value, nullptr, nullptr, 0);
}

// A thread's share of the CPU during its calls, judged over each CONTENTION_WINDOW_NS of calls.
struct Share {
    int64_t wall = 0, cpu = 0;

    // After a call of `w` ns in which the thread ran `c`: 1 if a window ended and found the core
    // shared, 0 if one ended and did not, -1 if the window goes on.
    int judge(int64_t w, int64_t c) {
        wall += w, cpu += c;
        if (wall < CONTENTION_WINDOW_NS) return -1;
        const bool shared = cpu < CONTENTED_SHARE * wall;
        wall = cpu = 0;
        return shared;
    }
};

inline thread_local Share my_share;

inline Pool &pool();

// Returns once the pool's generation differs from `seen`.
inline void await_call(Pool &p, uint32_t seen) {
    auto called = [&] { return p.generation.load(std::memory_order_seq_cst) != seen; };
    for (int i = 0; i < BARRIER_SPIN; i++) {
        if (called()) return;
        _mm_pause();
    }
    for (const int64_t until = now_ns() + (now_ns() >= p.awake_from.load(std::memory_order_relaxed) ? IDLE_NS : 0);;) {
        if (called()) return;
        const int64_t before = now_ns();
        if (before > until) break;
        sched_yield();
        if (now_ns() - before > CONTENDED_NS) break;
    }
    while (!called()) {
        p.sleepers.fetch_add(1, std::memory_order_seq_cst);
        if (!called()) futex(p.generation, FUTEX_WAIT_PRIVATE, seen);
        p.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
}

// Worker `index` (1..): waits for each call after generation `seen`, runs its share if the call's
// team has a place for it, and reports done.
inline void work(int index, uint32_t seen) {
    sigset_t all;  // signals are the Python thread's to take
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    Pool &p = pool();
    for (;;) {
        await_call(p, seen);
        seen = p.generation.load(std::memory_order_acquire);
        if (index < p.threads) {
            my_id = index, my_size = p.threads;
            const int64_t wall0 = now_ns(), cpu0 = cpu_ns();
            p.job(p.arg);
            if (my_share.judge(now_ns() - wall0, cpu_ns() - cpu0) == 1)
                p.contended.store(true, std::memory_order_relaxed);
            my_id = 0, my_size = 1;
        }
        p.pending.fetch_sub(1, std::memory_order_acq_rel);
    }
}

// The process's pool, never destroyed (its workers outlive static destructors at exit). A forked
// child has none of the parent's workers: it starts its own.
inline Pool &pool() {
    static Pool *p = [] {
        pthread_atfork(nullptr, nullptr, [] {
            Pool &q = pool();
            new (&q.calls) std::mutex;
            q.workers = 0, q.pending = 0, q.sleepers = 0;
        });
        return new Pool;
    }();
    return *p;
}

// After the caller's call (its share's verdict): where the caller or a worker shared its core, idle
// workers sleep at once for a backoff, doubling while that goes on (a worker kept awake meanwhile
// spends the CPU time the scheduler would otherwise credit it with when the next call wakes it); a
// clear window after the backoff has run out ends it.
inline void watch_contention(Pool &p, int verdict) {
    const bool shared = p.contended.exchange(false, std::memory_order_relaxed) || verdict == 1;
    const int64_t now = now_ns();
    if (shared) {
        p.backoff = std::clamp(2 * p.backoff, BACKOFF_NS[0], BACKOFF_NS[1]);
        p.awake_from.store(now + p.backoff, std::memory_order_relaxed);
    } else if (verdict == 0 && now >= p.awake_from.load(std::memory_order_relaxed)) {
        p.backoff = 0;
    }
}

// f() run by `threads` threads at once (the caller is thread 0; id() and size() tell each its place),
// returning when all are done. Not to be nested inside another run.
template <class F>
void run(int threads, F &&f) {
    if (threads <= 1) {
        f();
        return;
    }
    using Job = std::remove_reference_t<F>;
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.calls);
    const int64_t wall0 = now_ns(), cpu0 = cpu_ns();
    const uint32_t seen = p.generation.load(std::memory_order_relaxed);
    for (; p.workers < threads - 1; p.workers++) {
        try {
            std::thread(work, p.workers + 1, seen).detach();
        } catch (const std::system_error &) {  // no more threads to be had: a smaller team
            break;
        }
    }
    threads = std::min(threads, p.workers + 1);
    if (threads == 1) {
        f();
        return;
    }
    if (wall0 < p.awake_from.load(std::memory_order_relaxed)) {
        // A backoff after contention: the caller computes alone. A worker woken on a shared core
        // starts late, and every wait for it yields the caller's core to the neighbour for a whole
        // time slice (one-row steps of the embedded pair 8.7x slower beside two busy threads). Only
        // a team call can end the backoff (a clear window of the caller alone says nothing of the
        // other cores); a shared one of its own extends it.
        f();
        watch_contention(p, my_share.judge(now_ns() - wall0, cpu_ns() - cpu0) == 1 ? 1 : -1);
        return;
    }
    p.job = [](void *arg) { (*static_cast<Job *>(arg))(); };
    p.arg = (void *)&f;
    p.threads = threads;
    p.pending.store(p.workers, std::memory_order_relaxed);
    p.generation.fetch_add(1, std::memory_order_seq_cst);  // publishes the call
    if (p.sleepers.load(std::memory_order_seq_cst) > 0) futex(p.generation, FUTEX_WAKE_PRIVATE, INT_MAX);
    my_size = threads;
    f();
    my_size = 1;
    spin_until([&] { return p.pending.load(std::memory_order_acquire) == 0; });
    watch_contention(p, my_share.judge(now_ns() - wall0, cpu_ns() - cpu0));
}

}  // namespace team
