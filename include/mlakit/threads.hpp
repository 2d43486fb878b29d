// Threads of the CPU backend. mlakit runs its CPU kernels on a thread pool of its own whose idle
// workers sleep (no spinning, no OpenMP threads): it needs no OMP_WAIT_POLICY and changes no
// process-wide setting of the host program (docs/perf-notes.md, "CPU threads").
#pragma once

namespace mlakit {

// Threads a CPU kernel uses, the calling thread included: MLAKIT_NUM_THREADS, else the first value
// of OMP_NUM_THREADS, else the CPUs this process may run on (its affinity mask). Read once, at the
// first call or the first CPU kernel. A variable that does not start with a count in [1, 65535]
// ("0", "-1", "abc", "99999999999") is ignored (the next source is used); the `mlakit` command
// warns about such a MLAKIT_NUM_THREADS on stderr.
int cpu_num_threads();

// The thread count a MLAKIT_NUM_THREADS or OMP_NUM_THREADS value sets: the integer at its start
// when in [1, 65535] ("4", "4,2"), else 0 (the variable is ignored). nullptr gives 0.
int thread_count_setting(const char* text);

}  // namespace mlakit
