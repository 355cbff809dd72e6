/* The `bench` command (docs/cli.md §5; docs/design.md §8.10): times training
 * steps after two warm-up steps and reports the median step (robust on a
 * shared machine, as tools/bench_torch.py does), its GFLOP/s as a fraction
 * of the cores' measured fp32 FMA peak, and where the median step's time
 * went, phase by phase (prof.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/blas_core.h"
#include "base/cpu.h"
#include "base/log.h"
#include "base/prof.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "parallel/context.h"
#include "parallel/dist.h"
#include "training/train.h"

/* The measured step times (wall and this process's CPU seconds) and their
 * phases, [steps] and [steps][PROF_PHASES]. */
typedef struct {
    int steps;
    double *times, *cpu_times, *phases, wait;
    double context_bytes, context_wait; /* sent by this rank and waited for, over the timed steps */
} bench_samples;

/* Index of the median step (the one whose time is the median). */
static int median_step(const bench_samples *b) {
    int *order = sys_calloc((size_t)b->steps, sizeof(int));
    for (int i = 0; i < b->steps; i++) order[i] = i;
    for (int i = 1; i < b->steps; i++) /* insertion sort: a few dozen steps */
        for (int j = i; j > 0 && b->times[order[j]] < b->times[order[j - 1]]; j--) {
            int swap = order[j];
            order[j] = order[j - 1], order[j - 1] = swap;
        }
    int median = order[b->steps / 2];
    free(order);
    return median;
}

static void run_steps(trainer *t, bench_samples *b) {
    train_step_result r;
    status err;
    for (int i = 0; i < 2; i++) /* warm-up: allocations, caches, oneDNN primitives */
        if (trainer_step(t, &r, &err) != 0) cmd_fail(err.code, "%s", err.message);
    prof_enable(true);
    double ignored[2];
    context_take_stats(&ignored[0], &ignored[1]);
    for (int i = 0; i < b->steps; i++) {
        dist_barrier();
        prof_reset();
        double start = sys_seconds(), cpu_start = sys_cpu_seconds();
        if (trainer_step(t, &r, &err) != 0) cmd_fail(err.code, "%s", err.message);
        b->wait += r.allreduce_wait_s;
        b->cpu_times[i] = sys_cpu_seconds() - cpu_start;
        dist_barrier();
        b->times[i] = sys_seconds() - start;
        prof_read(b->phases + (size_t)i * PROF_PHASES);
    }
    context_take_stats(&b->context_bytes, &b->context_wait);
    prof_enable(false);
}

/* The context group's traffic per step (docs/design.md §8.12): the most any
 * rank sent and waited, and how even the ranks' attention times are (ring
 * attention's zigzag is for that balance). */
static void print_context(const bench_samples *b, int median) {
    if (context_size() == 1) return;
    const double *p = b->phases + (size_t)median * PROF_PHASES;
    double attention = p[PROF_FORWARD_ATTENTION] + p[PROF_BACKWARD_ATTENTION], mean = attention;
    dist_sum_doubles(&mean, 1);
    mean /= dist_size();
    log_rank0("bench context=%d data_groups=%d context_sent_mb_per_step=%.3f context_wait_ms=%.3f "
              "attention_ms_mean=%.1f attention_ms_max=%.1f\n",
              context_size(), context_data_size(), dist_max_double(b->context_bytes / b->steps) / 1e6,
              1e3 * dist_max_double(b->context_wait / b->steps), 1e3 * mean, 1e3 * dist_max_double(attention));
}

/* "forward linear 123.4 ms (45.1%) | ...": rank 0's median step, and what
 * the phases leave out (data, zeroing, the reductions of loss and buffers,
 * MPI progress between kernels, the barrier) as "other". */
static void print_phases(const bench_samples *b, int median) {
    const double *p = b->phases + (size_t)median * PROF_PHASES, total = b->times[median];
    char line[2048];
    size_t used = 0;
    double covered = 0;
    for (int i = 0; i < PROF_PHASES; i++) {
        covered += p[i];
        used += (size_t)snprintf(line + used, sizeof line - used, "%s%s %.1f ms (%.1f%%)", i ? " | " : "",
                                 prof_phase_name((prof_phase)i), 1e3 * p[i], 100 * p[i] / total);
    }
    double other = total - covered;
    snprintf(line + used, sizeof line - used, " | other %.1f ms (%.1f%%)", 1e3 * other, 100 * other / total);
    log_rank0("bench phases of the median step (%.1f ms): %s\n", 1e3 * total, line);
}

/* The cores' fp32 FMA peak: every rank probes its threads at once, so that
 * ranks sharing a machine measure what they share (docs/design.md §8.10);
 * before and after the timed steps. */
static cpu_peak measure_peak(void) {
    dist_barrier();
    cpu_peak peak = cpu_measure_peak(blas_core_threads(), 0.3);
    double sums[2] = {peak.fp32_gflops, peak.bf16_gflops};
    dist_sum_doubles(sums, 2);
    peak.fp32_gflops = sums[0], peak.bf16_gflops = sums[1];
    return peak;
}

int command_bench(const char *config_path, int n_overrides, char *const *overrides, int steps) {
    config cfg = cmd_load_config(config_path, n_overrides, overrides);
    cmd_use_precision(&cfg);
    cfg.steps = steps + 2;
    cfg.eval_interval = 0, cfg.eval_at_start = false; /* bench never evaluates: no evaluator made or counted */
    cmd_print_banner();
    cmd_note_bf16_speed(&cfg);
    cpu_peak peak = measure_peak();
    trainer t;
    status err;
    if (trainer_create(&t, &cfg, TRAINER_FRESH, &err) != 0) cmd_fail_all(err.code, "%s", err.message);
    bench_samples b = {steps,
                       sys_calloc((size_t)steps, sizeof(double)),
                       sys_calloc((size_t)steps, sizeof(double)),
                       sys_calloc((size_t)steps * PROF_PHASES, sizeof(double)),
                       0,
                       0,
                       0};
    run_steps(&t, &b);
    /* once more after the steps, the higher counting: on a shared machine a
     * neighbour's burst during one probe would otherwise flatter the run */
    cpu_peak after = measure_peak();
    if (after.fp32_gflops > peak.fp32_gflops) peak = after;
    int median = median_step(&b);
    double seconds = b.times[median], tokens = (double)cfg.batch_size * cfg.seq_len;
    double gflops = model_flops_per_token(&t.model, cfg.seq_len) * tokens / seconds / 1e9;
    double fastest = b.times[0], slowest = b.times[0];
    for (int i = 1; i < steps; i++) fastest = b.times[i] < fastest ? b.times[i] : fastest;
    for (int i = 1; i < steps; i++) slowest = b.times[i] > slowest ? b.times[i] : slowest;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double max_rss_mb = dist_max_double(usage.ru_maxrss / 1024.0);
    log_rank0("bench: %s | batch %d x %d | %s attention | %d steps | step min %.1f ms, max %.1f ms\n",
              cmd_ranks_threads(), cfg.batch_size, cfg.seq_len, cfg.attention == ATTENTION_FMM ? "fmm" : "softmax",
              steps, 1e3 * fastest, 1e3 * slowest);
    log_rank0("bench precision %s\n", cmd_precision_description());
    /* CPU time of the median step on rank 0: where other processes share
     * the cores, wall time includes the waits for one and CPU time does not
     * (docs/cli.md §5) */
    log_rank0("bench tokens_per_s=%.1f ms_per_step=%.3f gflops=%.3f allreduce_wait_ms=%.3f peak_rss_mb=%.1f "
              "cpu_ms_per_step=%.3f\n",
              tokens / seconds, 1e3 * seconds, gflops, 1e3 * b.wait / steps, max_rss_mb, 1e3 * b.cpu_times[median]);
    log_rank0("bench peak fp32_fma_gflops=%.1f (%s, %s, measured) fraction_of_peak=%.3f%s\n", peak.fp32_gflops,
              peak.isa, cmd_ranks_threads(), peak.fp32_gflops > 0 ? gflops / peak.fp32_gflops : 0.0,
              peak.bf16_gflops > 0 ? "" : " | bf16 peak: none");
    if (peak.bf16_gflops > 0)
        log_rank0("bench peak bf16_gflops=%.1f (vdpbf16ps, %.2f x fp32)\n", peak.bf16_gflops,
                  peak.bf16_gflops / peak.fp32_gflops);
    print_phases(&b, median);
    print_context(&b, median);
    train_memory_use u = trainer_memory(&t); /* rank 0's: the largest ZeRO-1 slice is at most one element more */
    log_rank0("bench memory param_bytes_per_param=%.3f grad_bytes_per_param=%.3f moment_bytes_per_param=%.3f "
              "activation_mb=%.3f\n",
              u.param_bytes, u.grad_bytes, u.moment_bytes, u.activation_bytes / 1e6);
    free(b.times);
    free(b.cpu_times);
    free(b.phases);
    trainer_free(&t);
    return 0;
}
