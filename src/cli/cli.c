/* Command line of docs/cli.md §5: `momfmm <command> ...`. One table of
 * commands and one of options drive parsing, defaults, the usage lines and
 * the help texts, so that what help prints is what the parser does. Usage
 * errors exit 2, with a "did you mean" when a word is close to a known one;
 * help and --version exit 0 without starting MPI. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/blas_core.h"
#include "base/build_info.h"
#include "base/float_env.h"
#include "base/log.h"
#include "base/status.h"
#include "base/suggest.h"
#include "base/sys.h"
#include "cli/version.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "commands/signals.h"
#include "parallel/context.h"
#include "parallel/dist.h"
#include "store/store.h"

#define MAX_OVERRIDES 256
#define MAX_COUNT (1 << 30)

/* An option: its letter in the commands' lists, the value's name (NULL for
 * a switch), the default as the text the option would take (applied by the
 * parser itself, so help and behaviour agree) and the help line. */
typedef struct {
    char letter;
    const char *flag, *metavar, *fallback, *help;
} option_spec;

static const option_spec OPTIONS[] = {
    {'s', "--set", "SECTION.KEY=VALUE", NULL, "override one config key after the file; repeatable (up to 256)"},
    {'r', "--resume", "auto|PATH", NULL,
     "continue from the newest loadable checkpoint in train.out_dir (auto) or from PATH; "
     "without it a run starts at step 0"},
    {'o', "--out", "FILE.h5", NULL, "the file to write (init: the checkpoint; logits: the logits)"},
    {'g', "--grads", "OUT.h5", NULL, "also write the gradient of the loss for every parameter; default: none"},
    {'n', "--steps", "N", "10", "timed steps, after two warm-up steps"},
    {'S', "--stream", NULL, NULL, "also run the batches through streaming inference and compare the logits"},
    {'L', "--segment", "N", "1", "tokens per segment of --stream"},
    {'p', "--prompt", "TOKENS", NULL, "token ids separated by commas and/or spaces"},
    {'k', "--tokens", "N", "32", "new tokens to generate"},
    {'t', "--temperature", "T", "0", "0 = greedy; T > 0 samples from softmax(z / T)"},
    {'e', "--seed", "S", "0", "seed of the sampling"},
    {'T', "--text", "TEXT", NULL, "a prompt of text, as bytes (byte-level models, vocab_size 256); prints text"},
    {'K', "--top-k", "K", "0", "sample among the K most likely tokens; 0 = all"},
    {'U', "--top-p", "P", "1", "sample among the fewest tokens holding probability P, in (0, 1]"},
    {'Z', "--stop", "BYTES", NULL, "stop once the output ends with these bytes (\\n, \\t, \\xNN escapes)"},
    {'I', "--init", "CKPT.h5", NULL,
     "start from a checkpoint's weights and buffers at step 0, with a fresh optimizer (fine-tuning)"},
    {'w', "--overwrite", NULL, NULL,
     "start at step 0 in a train.out_dir holding an earlier run: its checkpoints and metrics.h5 are removed first"},
    {'f', "--force", NULL, NULL, "replace an existing output file (never one of the command's inputs)"},
    {'B', "--batches", "N|all", NULL,
     "eval batches of train.batch_size rows; all = every window of seq_len tokens of the eval split once (text); "
     "default: the checkpoint's train.eval_batches"},
    {'P', "--precision", "fp32|bf16", NULL,
     "precision of the matrix products (docs/scale.md §7); default: the checkpoint's train.precision"},
    {'N', "--show", "N", "4", "samples to print, in the order a run takes them"},
    {'D', "--split", "train|eval|lengen", "train",
     "the samples of training, of the eval split or of the chain task's length-generalisation eval"},
};
#define N_OPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

typedef struct arguments arguments;

typedef struct {
    const char *name, *operands;
    int n_operands;
    const char *options, *required; /* option letters */
    const char *summary;
    int (*run)(const arguments *a);
    /* eval, generate, loss: the products run in the checkpoint's precision
     * (its train.precision, or --precision; docs/scale.md §7) */
    bool checkpoint_precision;
} command_spec;

static int run_train(const arguments *a);
static int run_init(const arguments *a);
static int run_loss(const arguments *a);
static int run_eval(const arguments *a);
static int run_inspect(const arguments *a);
static int run_generate(const arguments *a);
static int run_bench(const arguments *a);
static int run_data(const arguments *a);
static int run_logits(const arguments *a);

static const command_spec COMMANDS[] = {
    {"train", "CONFIG.ini", 1, "srIw", "",
     "Train the model of the config; train rows, eval rows, checkpoints and metrics.h5 go to train.out_dir.", run_train,
     false},
    {"init", "CONFIG.ini", 1, "sof", "o", "Write the step-0 checkpoint of the config (initial parameters).", run_init,
     false},
    {"loss", "CKPT.h5 TOKENS.h5", 2, "gfP", "", "Print the loss of the checkpoint's model on a token file.", run_loss,
     true},
    {"eval", "CKPT.h5|RUN_DIR", 1, "SLBsP", "",
     "Print the eval metrics of the checkpoint (a run directory's newest) on its config's eval split (--set: data "
     "keys, train.eval_batches, train.eval_readouts).",
     run_eval, true},
    {"inspect", "CKPT.h5|RUN_DIR", 1, "", "",
     "Print a checkpoint's (a run directory's newest) step, parameter counts, last metrics, momentum gains and "
     "config; given a metrics.h5, the latest rows of its run.",
     run_inspect, false},
    {"generate", "CKPT.h5|RUN_DIR", 1, "pTkteKUZP", "",
     "Continue a prompt (--prompt or --text) through streaming inference.", run_generate, true},
    {"logits", "CKPT.h5|RUN_DIR TOKENS.h5", 2, "ofP", "o",
     "Write the model's logits on the token ids of TOKENS.h5 (/tokens, [T] or [B, T]) to --out (/logits).", run_logits,
     true},
    {"bench", "CONFIG.ini", 1, "sn", "", "Time training steps and report tokens/s, ms/step and GFLOP/s.", run_bench,
     false},
    {"data", "CONFIG.ini", 1, "sND", "",
     "Print samples of the config's task: inputs and targets as token rows (- = not counted), each chain "
     "sample's period, each ListOps label.",
     run_data, false},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

static const suggest_alias COMMAND_ALIASES[] = {
    {"training", "train"},    {"fit", "train"},    {"evaluate", "eval"}, {"test", "eval"},       {"sample", "generate"},
    {"gen", "generate"},      {"show", "inspect"}, {"info", "inspect"},  {"benchmark", "bench"}, {"forward", "logits"},
    {"version", "--version"}, {"-v", "--version"}, {"samples", "data"},  {"dataset", "data"},    {NULL, NULL},
};

static const suggest_alias OPTION_ALIASES[] = {
    {"-o", "--out"},
    {"--output", "--out"},
    {"--temp", "--temperature"},
    {"--max-tokens", "--tokens"},
    {"--num-tokens", "--tokens"},
    {"--override", "--set"},
    {"-s", "--set"},
    {NULL, NULL},
};

static const command_spec *find_command(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(COMMANDS[i].name, name)) return &COMMANDS[i];
    return NULL;
}

static const option_spec *find_option(const char *flag) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!strcmp(OPTIONS[i].flag, flag)) return &OPTIONS[i];
    return NULL;
}

static bool accepts(const command_spec *cmd, const option_spec *o) { return strchr(cmd->options, o->letter) != NULL; }

/* "train CONFIG.ini [--set SECTION.KEY=VALUE ...] [--resume auto|PATH]" */
static void synopsis(const command_spec *cmd, char *out, size_t len) {
    size_t n = (size_t)snprintf(out, len, "%s %s", cmd->name, cmd->operands);
    for (size_t i = 0; i < N_OPTIONS && n < len; i++) {
        const option_spec *o = &OPTIONS[i];
        if (!accepts(cmd, o)) continue;
        bool required = strchr(cmd->required, o->letter) != NULL;
        n += (size_t)snprintf(out + n, len - n, " %s%s%s%s%s%s", required ? "" : "[", o->flag, o->metavar ? " " : "",
                              o->metavar ? o->metavar : "", o->letter == 's' ? " ..." : "", required ? "" : "]");
    }
}

/* The command's usage line and where its options are listed, for errors. */
static const char *usage_of(const command_spec *cmd) {
    static char text[512];
    char line[256];
    synopsis(cmd, line, sizeof line);
    snprintf(text, sizeof text, "usage: momfmm %s\n(momfmm help %s lists the options and their defaults)", line,
             cmd->name);
    return text;
}

static const char *usage_all(void) {
    static char text[2048];
    size_t n = (size_t)snprintf(text, sizeof text, "usage: momfmm <command> ...\n");
    for (size_t i = 0; i < N_COMMANDS && n < sizeof text; i++) {
        char line[256];
        synopsis(&COMMANDS[i], line, sizeof line);
        n += (size_t)snprintf(text + n, sizeof text - n, "  %s\n", line);
    }
    if (n < sizeof text) snprintf(text + n, sizeof text - n, "  help [COMMAND] | COMMAND --help | --version");
    return text;
}

static void print_overview(void) {
    printf("momfmm %s: transformers with momentum attention and FMM attention, trained data-parallel over MPI\n\n",
           build_version_number());
    printf("usage: momfmm <command> ARGUMENTS [OPTIONS]\n\ncommands:\n");
    int width = 0;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if ((int)strlen(COMMANDS[i].operands) > width) width = (int)strlen(COMMANDS[i].operands);
    for (size_t i = 0; i < N_COMMANDS; i++)
        printf("  %-9s %-*s %s\n", COMMANDS[i].name, width, COMMANDS[i].operands, COMMANDS[i].summary);
    printf("\n  momfmm help COMMAND, momfmm COMMAND --help   a command's options and their defaults\n"
           "  momfmm --version                             version, git revision, MPI, OpenBLAS and HDF5 versions\n"
           "\nexit codes: 0 success, 1 internal failure, 2 config or command-line error, 3 bad file,\n"
           "4 training diverged (train.on_nonfinite = stop), 5 a peer rank did not answer within dist.timeout,\n"
           "130 train ended at once by a second Ctrl-C.\n"
           "The commands are described in docs/cli.md, the config keys in docs/config.md.\n");
}

static void print_command_help(const command_spec *cmd) {
    char line[256];
    synopsis(cmd, line, sizeof line);
    printf("usage: momfmm %s\n\n%s\n\noptions:\n", line, cmd->summary);
    int width = (int)strlen("-h, --help");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option_spec *o = &OPTIONS[i];
        int w = (int)(strlen(o->flag) + (o->metavar ? 1 + strlen(o->metavar) : 0));
        if (accepts(cmd, o) && w > width) width = w;
    }
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option_spec *o = &OPTIONS[i];
        if (!accepts(cmd, o)) continue;
        char name[64], fallback[64] = "";
        snprintf(name, sizeof name, "%s%s%s", o->flag, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        if (strchr(cmd->required, o->letter)) snprintf(fallback, sizeof fallback, " (required)");
        else if (o->fallback) snprintf(fallback, sizeof fallback, " (default: %s)", o->fallback);
        else if (!o->metavar) snprintf(fallback, sizeof fallback, " (default: off)");
        printf("  %-*s  %s%s\n", width, name, o->help, fallback);
    }
    printf("  %-*s  %s\n", width, "-h, --help", "print this help and exit");
    if (strchr(cmd->options, 's')) printf("\nConfig keys, their defaults and limits: docs/config.md.\n");
}

/* "; did you mean train?" for an unknown command, or "". */
static void suggest_command(const char *word, char *out, size_t len) {
    const char *names[N_COMMANDS + 1];
    for (size_t i = 0; i < N_COMMANDS; i++) names[i] = COMMANDS[i].name;
    names[N_COMMANDS] = "help";
    const char *best = suggest_alias_lookup(COMMAND_ALIASES, word);
    if (!best) best = suggest_closest(word, names, N_COMMANDS + 1);
    if (best) snprintf(out, len, "; did you mean %s?", best);
    else out[0] = '\0';
}

/* "; did you mean --steps?" among the options the command takes (compared
 * without their dashes, which would make every pair look close), or "". */
static void suggest_option(const command_spec *cmd, const char *arg, char *out, size_t len) {
    const char *best = suggest_alias_lookup(OPTION_ALIASES, arg);
    if (best && !accepts(cmd, find_option(best))) best = NULL;
    const char *bare = arg + strspn(arg, "-");
    for (size_t i = 0; i < N_OPTIONS && !best; i++) {
        if (!accepts(cmd, &OPTIONS[i])) continue;
        const char *known = OPTIONS[i].flag + 2;
        if (suggest_is_close(bare, known, suggest_distance(bare, known, 2))) best = OPTIONS[i].flag;
    }
    if (!best && suggest_is_close(bare, "help", suggest_distance(bare, "help", 2))) best = "--help";
    if (best) snprintf(out, len, "; did you mean %s?", best);
    else out[0] = '\0';
}

struct arguments {
    const char *positional[2];
    int n_positional;
    char *overrides[MAX_OVERRIDES];
    int n_overrides;
    const char *out, *grads, *resume, *prompt;
    int steps, segment, tokens;
    int batches; /* eval --batches: 0 = the checkpoint's, -1 = all */
    bool stream, overwrite, force;
    double temperature;
    long long seed;
    const char *text, *stop, *init;
    int top_k;
    double top_p;
    const char *precision; /* --precision, NULL: the checkpoint's */
    int show;              /* data --show */
    const char *split;     /* data --split */
};

static int parse_count(const char *flag, const char *value) {
    char *end;
    long v = strtol(value, &end, 10);
    if (end == value || *end || v < 1 || v > MAX_COUNT)
        cmd_fail_all(EXIT_USAGE, "%s %s: expected an integer in [1, %d]", flag, value, MAX_COUNT);
    return (int)v;
}

static double parse_number(const char *flag, const char *value) {
    char *end;
    double v = strtod(value, &end);
    if (*end || end == value || !(v >= 0) || v > 1e15)
        cmd_fail_all(EXIT_USAGE, "%s %s: expected a number in [0, 1e15]", flag, value);
    return v;
}

static int parse_top_k(const char *flag, const char *value) {
    char *end;
    long v = strtol(value, &end, 10);
    if (end == value || *end || v < 0 || v > MAX_COUNT)
        cmd_fail_all(EXIT_USAGE, "%s %s: expected an integer in [0, %d] (0 = every token)", flag, value, MAX_COUNT);
    return (int)v;
}

static double parse_probability(const char *flag, const char *value) {
    char *end;
    double v = strtod(value, &end);
    if (*end || end == value || !(v > 0 && v <= 1))
        cmd_fail_all(EXIT_USAGE, "%s %s: expected a number in (0, 1]", flag, value);
    return v;
}

static void apply_option(arguments *a, const command_spec *cmd, const option_spec *o, char *value) {
    switch (o->letter) {
    case 's':
        if (a->n_overrides == MAX_OVERRIDES)
            cmd_fail_all(EXIT_USAGE, "%s: more than %d --set options", cmd->name, MAX_OVERRIDES);
        a->overrides[a->n_overrides++] = value;
        break;
    case 'o': a->out = value; break;
    case 'g': a->grads = value; break;
    case 'r': a->resume = value; break;
    case 'n': a->steps = parse_count(o->flag, value); break;
    case 'S': a->stream = true; break;
    case 'L': a->segment = parse_count(o->flag, value); break;
    case 'p': a->prompt = value; break;
    case 'k': a->tokens = parse_count(o->flag, value); break;
    case 't': a->temperature = parse_number(o->flag, value); break;
    case 'e': a->seed = (long long)parse_number(o->flag, value); break;
    case 'T': a->text = value; break;
    case 'K': a->top_k = parse_top_k(o->flag, value); break;
    case 'U': a->top_p = parse_probability(o->flag, value); break;
    case 'Z': a->stop = value; break;
    case 'I': a->init = value; break;
    case 'w': a->overwrite = true; break;
    case 'f': a->force = true; break;
    case 'P': a->precision = value; break;
    case 'N': a->show = parse_count(o->flag, value); break;
    case 'D': a->split = value; break;
    case 'B': a->batches = strcmp(value, "all") == 0 ? -1 : parse_count(o->flag, value); break;
    }
}

/* "bench" for --steps: the commands that take an option, for a message. */
static void commands_taking(const option_spec *o, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < N_COMMANDS && n < len; i++)
        if (accepts(&COMMANDS[i], o)) n += (size_t)snprintf(out + n, len - n, "%s%s", n ? ", " : "", COMMANDS[i].name);
}

/* Options that act only beside another: sampling's at temperature 0
 * (greedy), --segment without --stream, --overwrite with --resume (which
 * continues the run it would remove), --force with no output to replace.
 * Given a value other than its default there, one would be ignored without
 * a word, so it is refused, as a config key of another task is (docs/cli.md
 * §5); its default passes. */
static void refuse_idle_options(const command_spec *cmd, const arguments *a, const arguments *defaults) {
    const char *greedy = "when sampling, with --temperature T > 0 (at 0 generation is greedy)";
    const struct {
        bool idle;
        const char *flag, *needs;
    } options[] = {
        {!a->stream && a->segment != defaults->segment, "--segment", "with --stream"},
        {a->temperature <= 0 && a->top_k != defaults->top_k, "--top-k", greedy},
        {a->temperature <= 0 && a->top_p != defaults->top_p, "--top-p", greedy},
        {a->temperature <= 0 && a->seed != defaults->seed, "--seed", greedy},
        {a->overwrite && a->resume, "--overwrite",
         "without --resume (it starts at step 0, --resume continues the run)"},
        {a->force && !a->out && !a->grads, "--force", "with an output file to replace (--grads)"},
    };
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (options[i].idle)
            cmd_fail_all(EXIT_USAGE, "%s: %s acts only %s", cmd->name, options[i].flag, options[i].needs);
}

static arguments parse_arguments(const command_spec *cmd, int argc, char **argv) {
    arguments a;
    memset(&a, 0, sizeof a);
    for (size_t o = 0; o < N_OPTIONS; o++)
        if (OPTIONS[o].fallback && accepts(cmd, &OPTIONS[o]))
            apply_option(&a, cmd, &OPTIONS[o], (char *)OPTIONS[o].fallback);
    const arguments defaults = a;
    bool given[N_OPTIONS] = {false};
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        const option_spec *o = find_option(arg);
        char hint[128];
        if (o && !accepts(cmd, o)) {
            commands_taking(o, hint, sizeof hint);
            cmd_fail_all(EXIT_USAGE, "%s: option %s is not accepted (%s takes it)\n%s", cmd->name, arg, hint,
                         usage_of(cmd));
        }
        if (!o && arg[0] == '-' && arg[1]) {
            suggest_option(cmd, arg, hint, sizeof hint);
            cmd_fail_all(EXIT_USAGE, "%s: unknown option %s%s\n%s", cmd->name, arg, hint, usage_of(cmd));
        }
        if (!o) {
            if (a.n_positional == cmd->n_operands)
                cmd_fail_all(EXIT_USAGE, "%s: unexpected argument '%s'\n%s", cmd->name, arg, usage_of(cmd));
            a.positional[a.n_positional++] = arg;
            continue;
        }
        if (o->metavar && i + 1 >= argc)
            cmd_fail_all(EXIT_USAGE, "%s: option %s needs a value (%s)", cmd->name, arg, o->metavar);
        given[o - OPTIONS] = true;
        apply_option(&a, cmd, o, o->metavar ? argv[++i] : NULL);
    }
    if (a.n_positional != cmd->n_operands)
        cmd_fail_all(EXIT_USAGE, "%s: missing argument (%s)\n%s", cmd->name, cmd->operands, usage_of(cmd));
    for (size_t o = 0; o < N_OPTIONS; o++)
        if (strchr(cmd->required, OPTIONS[o].letter) && !given[o])
            cmd_fail_all(EXIT_USAGE, "%s: %s %s is required\n%s", cmd->name, OPTIONS[o].flag, OPTIONS[o].metavar,
                         usage_of(cmd));
    refuse_idle_options(cmd, &a, &defaults);
    return a;
}

/* Whether -h or --help stands among the arguments as an option (not as the
 * value of one, such as a --set). */
static bool asks_for_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
        const option_spec *o = find_option(argv[i]);
        if (o && o->metavar) i++;
    }
    return false;
}

/* --version, help [COMMAND] and COMMAND --help: answered before MPI starts,
 * so they work on a login node without a launcher. Returns false for
 * anything else. */
static bool answer_without_mpi(int argc, char **argv) {
    const char *first = argv[1];
    if (!strcmp(first, "--version") || !strcmp(first, "-V")) {
        version_print();
        return true;
    }
    bool help = !strcmp(first, "help") || !strcmp(first, "--help") || !strcmp(first, "-h");
    if (help && (argc == 2 || !strcmp(argv[2], "help"))) {
        print_overview();
        return true;
    }
    const char *name = help ? argv[2] : first;
    const command_spec *cmd = find_command(name);
    if (help && !cmd) {
        char hint[128];
        suggest_command(name, hint, sizeof hint);
        cmd_fail_all(EXIT_USAGE, "help: unknown command '%s'%s\n%s", name, hint, usage_all());
    }
    if (help && argc > 3)
        cmd_fail_all(EXIT_USAGE, "help: unexpected argument '%s' (usage: momfmm help [COMMAND])", argv[3]);
    if (!cmd || (!help && !asks_for_help(argc - 2, argv + 2))) return false;
    print_command_help(cmd);
    return true;
}

static int run_train(const arguments *a) {
    return command_train(a->positional[0], a->n_overrides, a->overrides, a->resume, a->init, a->overwrite);
}

static int run_init(const arguments *a) {
    return command_init(a->positional[0], a->n_overrides, a->overrides, a->out, a->force);
}

static int run_loss(const arguments *a) { return command_loss(a->positional[0], a->positional[1], a->grads, a->force); }
static int run_eval(const arguments *a) {
    return command_eval(a->positional[0], a->stream, a->segment, a->n_overrides, a->overrides, a->batches);
}
static int run_inspect(const arguments *a) { return command_inspect(a->positional[0]); }

static int run_generate(const arguments *a) {
    command_generate_options g = {.prompt = a->prompt,
                                  .text = a->text,
                                  .stop = a->stop,
                                  .n_tokens = a->tokens,
                                  .top_k = a->top_k,
                                  .temperature = a->temperature,
                                  .top_p = a->top_p,
                                  .seed = a->seed};
    return command_generate(a->positional[0], &g);
}

static int run_logits(const arguments *a) {
    return command_logits(a->positional[0], a->positional[1], a->out, a->force);
}

static int run_bench(const arguments *a) {
    return command_bench(a->positional[0], a->n_overrides, a->overrides, a->steps);
}

static int run_data(const arguments *a) {
    return command_data(a->positional[0], a->n_overrides, a->overrides, a->show, a->split);
}

/* Before main: as soon as the executable's own code runs (the libraries'
 * constructors, OpenBLAS starting its threads, run before it), so that a
 * stop signal during the rest of start-up is recorded or held, never
 * fatal (docs/design.md §8.7). */
__attribute__((constructor)) static void guard_stop_signals(void) { signals_guard_startup(); }

int main(int argc, char **argv) {
    cmd_guard_standard_streams(); /* before any file is opened: none may become stdout */
    blas_core_select(argv);       /* before MPI starts: it may re-execute the program */
    float_env_flush_denormals();  /* before MPI and HDF5 start threads, so they inherit it */
    cmd_bound_threads();          /* before any OpenMP region could start OMP_NUM_THREADS threads */
    H5dont_atexit();              /* see live_metrics_abandon */
    /* Started before MPI, parallel HDF5 does not hook MPI_Finalize to close
     * itself: that hook would close the files a failed write abandoned and
     * crash (HDFFV-11052, docs/scale.md §7); the operating system frees them. */
    H5open();
    if (argc >= 2 && answer_without_mpi(argc, argv)) return cmd_finish_output(0);
    cmd_dist_init(&argc, &argv);
    if (argc < 2) cmd_fail_all(EXIT_USAGE, "no command given\n%s", usage_all());
    const command_spec *cmd = find_command(argv[1]);
    if (!cmd) {
        char hint[128];
        suggest_command(argv[1], hint, sizeof hint);
        cmd_fail_all(EXIT_USAGE, "unknown command '%s'%s\n%s", argv[1], hint, usage_all());
    }
    if (strcmp(cmd->name, "train") != 0) signals_release(); /* default actions elsewhere */
    arguments a = parse_arguments(cmd, argc - 2, argv + 2);
    if (cmd->checkpoint_precision) cmd_use_checkpoint_precision(a.positional[0], a.precision);
    int rc = cmd_finish_output(cmd->run(&a)); /* a result lost on a full or closed stdout is a failure */
    context_free();
    dist_finalize();
    return rc;
}
