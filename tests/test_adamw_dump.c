/* Runs the C AdamW (docs/model.md §1.4) for a few steps on a tiny model's parameter
 * layout with random gradients and writes inputs and results for
 * tests/reference/test_adamw.py, which replays them in torch.optim.AdamW.
 * Also checks the weight-decay mask: 2-D weights only. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands/cmd_common.h"
#include "model/model.h"
#include "parallel/dist.h"
#include "test_util.h"
#include "training/optimizer.h"

#define STEPS 6

/* write and attr return whether every HDF5 call succeeded: the reference
 * replays this file, so a dataset missing from it must fail here. */
static bool write(hid_t f, const char *name, hid_t type, int ndim, hsize_t d0, hsize_t d1, const void *data) {
    hsize_t dims[2] = {d0, d1};
    hid_t space = H5Screate_simple(ndim, dims, NULL);
    hid_t dset = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = space >= 0 && dset >= 0 && H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    ok &= H5Dclose(dset) >= 0;
    ok &= H5Sclose(space) >= 0;
    return ok;
}

static bool attr(hid_t f, const char *name, double value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = space >= 0 && a >= 0 && H5Awrite(a, H5T_NATIVE_DOUBLE, &value) >= 0;
    ok &= H5Aclose(a) >= 0;
    ok &= H5Sclose(space) >= 0;
    return ok;
}

static void check_decay_mask(const model *m) {
    int wrong = 0;
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        const char *leaf = strrchr(e->name, '/');
        bool expected = e->ndim == 2 && (strcmp(e->name, "tok_emb") == 0 || (leaf && strcmp(leaf, "/weight") == 0));
        if (expected != e->decay) {
            printf("decay mask wrong for %s\n", e->name);
            wrong++;
        }
    }
    test_check(wrong == 0, "weight decay on 2-D weights only", wrong ? "%d tensor(s) wrong" : NULL, wrong);
}

int main(int argc, char **argv) {
    cmd_dist_init(&argc, &argv);
    if (argc != 2) {
        fprintf(stderr, "usage: test_adamw_dump OUT.h5\n");
        return 2;
    }
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 7, cfg.d_model = 8, cfg.n_heads = 2, cfg.n_layers = 1, cfg.d_ff = 12;
    cfg.attention = ATTENTION_FMM, cfg.learn_gamma = true, cfg.gamma = 0.1;
    cfg.weight_decay = 0.1, cfg.warmup = 2, cfg.steps = STEPS, cfg.lr = 3e-2, cfg.min_lr = 1e-3;
    model m;
    status st;
    int rc = model_create(&m, &cfg, &st);
    if (!test_check(rc == 0, "model_create", rc ? "%s" : NULL, st.message)) {
        dist_finalize();
        return test_summary("test_adamw_dump");
    }
    model_init_parameters(&m);
    check_decay_mask(&m);
    size_t n = m.n_params;
    uint64_t state = 99;
    fd_fill(m.params, n, 1.0f, &state);
    float *params0 = malloc(sizeof(float) * n), *grads = malloc(sizeof(float) * n * STEPS);
    float *history = malloc(sizeof(float) * n * STEPS);
    signed char *mask = malloc(n);
    double lrs[STEPS];
    memcpy(params0, m.params, sizeof(float) * n);
    fd_fill(grads, n * STEPS, 0.5f, &state);
    for (int i = 0; i < m.n_entries; i++) memset(mask + m.entries[i].offset, m.entries[i].decay, m.entries[i].numel);
    for (int k = 0; k < STEPS; k++) {
        memcpy(m.grads, grads + (size_t)k * n, sizeof(float) * n);
        lrs[k] = optimizer_learning_rate(&cfg, k + 1);
        optimizer_settings s = {lrs[k], cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay, 1.0f};
        optimizer_step_model(&m, k + 1, &s);
        memcpy(history + (size_t)k * n, m.params, sizeof(float) * n);
    }
    hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    bool written = f >= 0;
    if (written) {
        written &= write(f, "/params0", H5T_NATIVE_FLOAT, 1, n, 0, params0);
        written &= write(f, "/grads", H5T_NATIVE_FLOAT, 2, STEPS, n, grads);
        written &= write(f, "/decay_mask", H5T_NATIVE_SCHAR, 1, n, 0, mask);
        written &= write(f, "/lr", H5T_NATIVE_DOUBLE, 1, STEPS, 0, lrs);
        written &= write(f, "/params", H5T_NATIVE_FLOAT, 2, STEPS, n, history);
        written &= write(f, "/m", H5T_NATIVE_FLOAT, 1, n, 0, m.adam_m);
        written &= write(f, "/v", H5T_NATIVE_FLOAT, 1, n, 0, m.adam_v);
        written &= attr(f, "beta1", cfg.beta1);
        written &= attr(f, "beta2", cfg.beta2);
        written &= attr(f, "eps", cfg.adam_eps);
        written &= attr(f, "weight_decay", cfg.weight_decay);
        written &= H5Fclose(f) >= 0;
    }
    test_check(written, "inputs and results written for the reference", "%s", argv[1]);
    /* schedule: warmup 2 steps then cosine to min_lr at the last step */
    int ok = fabs(lrs[0] - 0.015) < 1e-12 && fabs(lrs[1] - 0.03) < 1e-12 && fabs(lrs[STEPS - 1] - 1e-3) < 1e-12;
    test_check(ok, "schedule warmup + cosine", "%.4g %.4g ... %.4g", lrs[0], lrs[1], lrs[STEPS - 1]);
    model_free(&m);
    free(params0), free(grads), free(history), free(mask);
    int exit_status = test_summary("test_adamw_dump");
    dist_finalize();
    return exit_status;
}
