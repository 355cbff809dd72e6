/* Which momfmm this is (docs/cli.md §5): the version and git revision that
 * `momfmm --version` prints, the train start-up line shows and every
 * checkpoint records as its root attribute momfmm_version (docs/files.md §4). */
#ifndef MOMFMM_BUILD_INFO_H
#define MOMFMM_BUILD_INFO_H

/* "0.2.0" and "<git describe --always --dirty>" (or "unknown"). */
const char *build_version_number(void);
const char *build_revision(void);
/* "momfmm 0.2.0 (git <revision>)": the first line of `momfmm --version`. */
const char *build_description(void);
#endif
