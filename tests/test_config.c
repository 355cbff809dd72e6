/* Config errors come back as a status naming the file, line or key, with the
 * exit code of docs/design.md §8.7, instead of ending the process; and every
 * compiled-in default parses (config_defaults relies on it). */
#include <stdio.h>
#include <string.h>

#include "momfmm/common.h"
#include "momfmm/config.h"

static int failures;

static void expect(int rc, const status *st, int code, const char *message) {
    bool ok = rc == code && (code == 0 || (st->code == code && strcmp(st->message, message) == 0));
    if (!ok) {
        failures++;
        fprintf(stderr, "FAIL: expected %d '%s', got %d '%s'\n", code, message, rc, rc ? st->message : "");
    }
}

int main(void) {
    status st;
    status_clear(&st);
    expect(config_check_defaults(&st), &st, 0, "");
    config c;
    config_defaults(&c);
    expect(config_try_load_file(&c, "/nonexistent/x.ini", &st), &st, EXIT_USAGE,
           "/nonexistent/x.ini: cannot open config: No such file or directory");
    expect(config_try_apply_override(&c, "model.d_model=32", &st), &st, 0, "");
    if (c.d_model != 32) failures++, fprintf(stderr, "FAIL: override did not set model.d_model\n");
    expect(config_try_apply_override(&c, "d_model", &st), &st, EXIT_USAGE, "--set d_model: expected section.key=value");
    expect(config_try_apply_override(&c, "model.nope=1", &st), &st, EXIT_USAGE, "--set unknown key model.nope");
    expect(config_try_apply_override(&c, "model.d_model=abc", &st), &st, EXIT_USAGE,
           "--set model.d_model = 'abc': expected an integer");
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}
