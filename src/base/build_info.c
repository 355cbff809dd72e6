/* The version and revision come from cmake/version.cmake as compile
 * definitions of this file alone, so that a new revision recompiles one file. */
#include "base/build_info.h"

#ifndef MOMFMM_VERSION
#define MOMFMM_VERSION "0.0.0"
#endif
#ifndef MOMFMM_GIT_REVISION
#define MOMFMM_GIT_REVISION "unknown"
#endif

const char *build_version_number(void) { return MOMFMM_VERSION; }
const char *build_revision(void) { return MOMFMM_GIT_REVISION; }
const char *build_description(void) { return "momfmm " MOMFMM_VERSION " (git " MOMFMM_GIT_REVISION ")"; }
