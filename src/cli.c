/* Command line of SPEC 5: `momfmm <command> ...`. Usage errors exit 2. */
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/blas_core.h"
#include "momfmm/cmd_common.h"
#include "momfmm/commands.h"
#include "momfmm/common.h"
#include "momfmm/dist.h"
#include "momfmm/float_env.h"
#include "momfmm/store.h"

#define MAX_OVERRIDES 256

static const char *USAGE =
    "usage: momfmm <command> ...\n"
    "  train CONFIG.ini [--set section.key=value ...] [--resume auto|PATH]\n"
    "  init CONFIG.ini --out FILE.h5 [--set ...]\n"
    "  loss CKPT.h5 TOKENS.h5 [--grads OUT.h5]\n"
    "  bench CONFIG.ini [--set ...] [--steps N]\n"
    "  eval CKPT.h5 [--stream [--segment N]]\n"
    "  inspect CKPT.h5\n"
    "  generate CKPT.h5 --prompt TOKENS [--tokens N] [--temperature T] [--seed S]\n";

typedef struct {
    const char *positional[2];
    int n_positional;
    char *overrides[MAX_OVERRIDES];
    int n_overrides;
    const char *out, *grads, *resume, *prompt;
    int steps, segment, tokens;
    bool stream;
    double temperature;
    long long seed;
} arguments;

static int parse_positive(const char *flag, const char *value) {
    char *end;
    long v = strtol(value, &end, 10);
    if (*end || v <= 0 || v > 1 << 30) fail_all(EXIT_USAGE, "%s %s: expected a positive integer", flag, value);
    return (int)v;
}

static double parse_number(const char *flag, const char *value) {
    char *end;
    double v = strtod(value, &end);
    if (*end || end == value || !(v >= 0) || v > 1e15) fail_all(EXIT_USAGE, "%s %s: expected a number >= 0", flag, value);
    return v;
}

/* Options each command accepts: 's' --set, 'o' --out, 'g' --grads,
 * 'r' --resume, 'n' --steps, 'S' --stream, 'L' --segment, 'p' --prompt,
 * 'k' --tokens, 't' --temperature, 'e' --seed. */
static arguments parse_arguments(const char *command, int argc, char **argv, const char *allowed, int positional) {
    arguments a;
    memset(&a, 0, sizeof a);
    a.steps = 10, a.segment = 1, a.tokens = 32;
    static const struct { const char *flag; char option; bool takes_value; } options[] = {
        {"--set", 's', true}, {"--out", 'o', true}, {"--grads", 'g', true}, {"--resume", 'r', true},
        {"--steps", 'n', true}, {"--stream", 'S', false}, {"--segment", 'L', true}, {"--prompt", 'p', true},
        {"--tokens", 'k', true}, {"--temperature", 't', true}, {"--seed", 'e', true},
    };
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        char option = 0;
        bool takes_value = false;
        for (size_t o = 0; o < sizeof options / sizeof options[0]; o++)
            if (!strcmp(arg, options[o].flag)) option = options[o].option, takes_value = options[o].takes_value;
        if (option && !strchr(allowed, option)) fail_all(EXIT_USAGE, "%s: option %s is not accepted\n%s", command, arg, USAGE);
        if (option && takes_value && i + 1 >= argc) fail_all(EXIT_USAGE, "%s: option %s needs a value", command, arg);
        if (!option && arg[0] == '-' && arg[1]) fail_all(EXIT_USAGE, "%s: unknown option %s\n%s", command, arg, USAGE);
        switch (option) {
        case 's':
            if (a.n_overrides == MAX_OVERRIDES) fail_all(EXIT_USAGE, "%s: too many --set options", command);
            a.overrides[a.n_overrides++] = argv[++i];
            break;
        case 'o': a.out = argv[++i]; break;
        case 'g': a.grads = argv[++i]; break;
        case 'r': a.resume = argv[++i]; break;
        case 'n': a.steps = parse_positive("--steps", argv[++i]); break;
        case 'S': a.stream = true; break;
        case 'L': a.segment = parse_positive("--segment", argv[++i]); break;
        case 'p': a.prompt = argv[++i]; break;
        case 'k': a.tokens = parse_positive("--tokens", argv[++i]); break;
        case 't': a.temperature = parse_number("--temperature", argv[++i]); break;
        case 'e': a.seed = (long long)parse_number("--seed", argv[++i]); break;
        default:
            if (a.n_positional == positional) fail_all(EXIT_USAGE, "%s: unexpected argument '%s'\n%s", command, arg, USAGE);
            a.positional[a.n_positional++] = arg;
        }
    }
    if (a.n_positional != positional) fail_all(EXIT_USAGE, "%s: missing argument\n%s", command, USAGE);
    return a;
}

static int command_init(const arguments *a) {
    if (!a->out) fail_all(EXIT_USAGE, "init: --out FILE.h5 is required");
    config c = cmd_load_config(a->positional[0], a->n_overrides, a->overrides);
    model m;
    status err;
    if (model_create(&m, &c, &err) != 0) fail_all(err.code, "%s", err.message);
    model_init_parameters(&m);
    checkpoint_info info = {0, 0, process_count()};
    if (process_rank() == 0 && store_write_checkpoint(a->out, &m, &info, NULL, NULL, &err) != 0)
        fail(err.code, "%s", err.message);
    log_rank0("wrote %s: %zu parameters\n", a->out, m.n_params);
    model_free(&m);
    return 0;
}

static int command_loss(const arguments *a) {
    model m;
    batch b;
    status err;
    if (checkpoint_load_model(a->positional[0], &m, true, &err) != 0 || tokens_read(a->positional[1], &m, &b, &err) != 0)
        fail(err.code, "%s", err.message);
    model_forward(&m, b.inputs, b.targets, b.labels, b.B, b.T, false);
    long long count;
    double sum = model_loss_sum(&m, b.targets, b.B, b.T, &count);
    double loss = count > 0 ? sum / count : 0.0;
    log_rank0("loss %.9g\n", loss);
    if (a->grads) {
        model_zero_grads(&m);
        model_backward(&m, b.inputs, b.targets, b.labels, b.B, b.T, count > 0 ? (float)(1.0 / count) : 0.0f, NULL);
        if (process_rank() == 0 && store_write_grads(a->grads, &m, loss, &err) != 0) fail(err.code, "%s", err.message);
    }
    batch_free(&b);
    model_free(&m);
    return 0;
}

/* Stop signals (SIGTERM, SIGINT, SIGUSR1) stay blocked from the first
 * instruction until `train` has its handlers in place: a Slurm warning
 * signal that arrives during start-up (re-exec, MPI_Init, config) is then
 * held pending and handled as a stop request instead of killing the rank.
 * The blocked mask survives execv and is inherited by MPI's threads. */
static void block_stop_signals(bool block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    sigprocmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

int main(int argc, char **argv) {
    block_stop_signals(true);
    blas_core_select(argv); /* before MPI starts: it may re-execute the program */
    float_env_flush_denormals(); /* before MPI and HDF5 start threads, so they inherit it */
    H5dont_atexit();        /* see live_metrics_abandon */
    dist_init(&argc, &argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        if (argc < 2) fail_all(EXIT_USAGE, "no command given\n%s", USAGE);
        log_rank0("%s", USAGE);
        dist_finalize();
        return 0;
    }
    const char *command = argv[1];
    int rest_count = argc - 2;
    char **rest = argv + 2;
    int rc;
    if (strcmp(command, "train") != 0) block_stop_signals(false); /* default actions elsewhere */
    if (!strcmp(command, "train")) {
        arguments a = parse_arguments(command, rest_count, rest, "sr", 1);
        rc = command_train(a.positional[0], a.n_overrides, a.overrides, a.resume);
    } else if (!strcmp(command, "init")) {
        arguments a = parse_arguments(command, rest_count, rest, "so", 1);
        rc = command_init(&a);
    } else if (!strcmp(command, "loss")) {
        arguments a = parse_arguments(command, rest_count, rest, "g", 2);
        rc = command_loss(&a);
    } else if (!strcmp(command, "bench")) {
        arguments a = parse_arguments(command, rest_count, rest, "sn", 1);
        rc = command_bench(a.positional[0], a.n_overrides, a.overrides, a.steps);
    } else if (!strcmp(command, "eval")) {
        arguments a = parse_arguments(command, rest_count, rest, "SL", 1);
        rc = command_eval(a.positional[0], a.stream, a.segment);
    } else if (!strcmp(command, "inspect")) {
        arguments a = parse_arguments(command, rest_count, rest, "", 1);
        rc = command_inspect(a.positional[0]);
    } else if (!strcmp(command, "generate")) {
        arguments a = parse_arguments(command, rest_count, rest, "pkte", 1);
        if (!a.prompt) fail_all(EXIT_USAGE, "generate: --prompt TOKENS is required");
        rc = command_generate(a.positional[0], a.prompt, a.tokens, a.temperature, a.seed);
    } else {
        fail_all(EXIT_USAGE, "unknown command '%s'\n%s", command, USAGE);
    }
    dist_finalize();
    return rc;
}
