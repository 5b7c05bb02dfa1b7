/*
 * doca_version.h - the DOCA version a program is built against, and the one it runs on.
 *
 * urom implements the DOCA UROM host API at the level of DOCA 3.3: the DOCA_VERSION_* macros
 * say 3.3.0, doca_version() is that string as compiled, doca_version_runtime() the string of the
 * libdoca_common the program runs with. urom's own version is UROM_VERSION_* (the libraries'
 * file names carry it: libdoca_urom.so.0 -> libdoca_urom.so.0.1.0), and urom_version_runtime()
 * returns the running library's.
 *
 * A DOCA version packs into one number as DOCA's does: major << 24 | minor << 16 | patch, an
 * official release's patch counting in thousands (DOCA_VERSION_CALC).
 */
#ifndef DOCA_VERSION_H_
#define DOCA_VERSION_H_

#include <stddef.h>

#include <doca_compat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The DOCA release whose API this urom implements. */
#define DOCA_VERSION_MAJOR 3
#define DOCA_VERSION_MINOR 3
#define DOCA_VERSION_PATCH 0
#define DOCA_VERSION_STRING "3.3.0000"

/* A version as one number, the patch as given. */
#define DOCA_VERSION_CALC_EXACT(major, minor, patch) ((size_t)((major) << 24 | (minor) << 16 | (patch)))
#define DOCA_VERSION_EXACT DOCA_VERSION_CALC_EXACT(DOCA_VERSION_MAJOR, DOCA_VERSION_MINOR, DOCA_VERSION_PATCH)

/* An official release's version as one number (its patch counts in thousands). */
#define DOCA_VERSION_CALC(major, minor, patch) ((size_t)((major) << 24 | (minor) << 16 | ((patch) * 1000)))
#define DOCA_VERSION_OFFICIAL DOCA_VERSION_CALC(DOCA_VERSION_MAJOR, DOCA_VERSION_MINOR, DOCA_VERSION_PATCH)

/* Whether the official release major.minor.patch is the one built against, or an earlier one. */
#define DOCA_VERSION_EQ_CURRENT(major, minor, patch) (DOCA_VERSION_CALC(major, minor, patch) == DOCA_VERSION_OFFICIAL)
#define DOCA_VERSION_LTE_CURRENT(major, minor, patch) (DOCA_VERSION_CALC(major, minor, patch) <= DOCA_VERSION_OFFICIAL)

/* urom's own version. */
#define UROM_VERSION_MAJOR 0
#define UROM_VERSION_MINOR 1
#define UROM_VERSION_PATCH 0
#define UROM_VERSION_STRING "0.1.0"

/* The DOCA version the program was compiled against ("major.minor.patch"). */
static inline const char *doca_version(void)
{
	return DOCA_VERSION_STRING;
}

/* The DOCA version of the libdoca_common the program runs with ("major.minor.patch"). */
DOCA_EXPERIMENTAL
const char *doca_version_runtime(void);

/* urom's version of the libdoca_common the program runs with ("major.minor.patch"). */
DOCA_STABLE
const char *urom_version_runtime(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DOCA_VERSION_H_ */
