/* Per-phase step times (prof.h). Single-threaded by design: only the thread
 * that drives the step calls it, around kernels that may themselves run on
 * several threads. */
#include "base/prof.h"

#include <string.h>

#include "base/sys.h"

static bool enabled;
static double totals[PROF_PHASES];
static prof_phase diverted = PROF_PHASES;

static const char *const NAMES[PROF_PHASES] = {
    "forward linear",     "forward attention",  "forward norm",  "forward activation",  "forward loss",
    "backward linear",    "backward attention", "backward norm", "backward activation", "backward loss",
    "backward recompute", "optimizer",          "reduce wait",
};

void prof_enable(bool on) { enabled = on; }
double prof_start(void) { return enabled ? sys_seconds() : 0.0; }

void prof_add(prof_phase phase, double start) {
    if (enabled) totals[diverted < PROF_PHASES ? diverted : phase] += sys_seconds() - start;
}

void prof_divert(prof_phase phase) { diverted = phase; }

void prof_reset(void) { memset(totals, 0, sizeof totals); }
void prof_read(double seconds[PROF_PHASES]) { memcpy(seconds, totals, sizeof totals); }
const char *prof_phase_name(prof_phase phase) { return NAMES[phase]; }
