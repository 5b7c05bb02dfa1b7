/*
 * doca_compat.h - symbol attributes and the versioned-struct helpers of the DOCA SDK, as urom
 * plugins use them.
 *
 * DOCA stamps each versioned interface struct with the version of the headers it was built
 * with: the struct's first field is `size_t __doca_api_version` (DOCA_STRUCT_START) and
 * DOCA_STRUCT_CTOR(x) fills it in. With DOCA's own headers the word is DOCA_VERSION_EXACT,
 * `major << 24 | minor << 16 | patch` (0x0300003a for the 3.0.0058 release, 0x03010069 for
 * 3.1.0105). With these headers it is UROM_PLUGIN_IFACE_VERSION (1).
 *
 * A urom worker accepts the word 1 and the words of the DOCA releases whose plugin interface
 * has the layout of doca_urom_plugin.h: DOCA 2.9, 2.10, 3.0, 3.1, 3.2 and 3.3, whatever their
 * patch number (see README.md in this directory). Any other word is refused when the plugin
 * is loaded.
 */
#ifndef DOCA_COMPAT_H_
#define DOCA_COMPAT_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The interface version word of plugins built against these headers. */
#define UROM_PLUGIN_IFACE_VERSION 1

/* Symbol attributes. DOCA marks experimental and deprecated functions; using one warns
 * unless DOCA_ALLOW_EXPERIMENTAL_API / DOCA_ALLOW_DEPRECATED_API is defined. */
#if defined(__GNUC__) || defined(__clang__)
#define DOCA_USED __attribute__((used))
#define DOCA_STABLE __attribute__((visibility("default"))) DOCA_USED
#ifdef DOCA_ALLOW_EXPERIMENTAL_API
#define DOCA_EXPERIMENTAL DOCA_STABLE
#else
#define DOCA_EXPERIMENTAL __attribute__((deprecated("experimental DOCA symbol"))) DOCA_STABLE
#endif
#ifdef DOCA_ALLOW_DEPRECATED_API
#define DOCA_DEPRECATED DOCA_STABLE
#else
#define DOCA_DEPRECATED __attribute__((deprecated("deprecated DOCA symbol"))) DOCA_STABLE
#endif
#else
#define DOCA_USED
#define DOCA_STABLE
#define DOCA_EXPERIMENTAL
#define DOCA_DEPRECATED
#endif

/* Versioned structs. */

/* Declares the version word; the first member of every versioned struct. */
#define DOCA_STRUCT_START size_t __doca_api_version
/* The version word of the struct `_ptr` points to. */
#define DOCA_STRUCT_GET_VERSION(_ptr) ((_ptr)->__doca_api_version)
/* Stamps struct `_s` (an lvalue) with the version of these headers. */
#define DOCA_STRUCT_CTOR(_s) ((_s).__doca_api_version = UROM_PLUGIN_IFACE_VERSION)
/* Stamps the struct `_ptr` points to. */
#define DOCA_STRUCT_PTR_CTOR(_ptr) DOCA_STRUCT_CTOR(*(_ptr))
/* Zeroes struct `_s`, then stamps it. */
#define DOCA_STRUCT_MEMSET_CTOR(_s)                                         \
	do {                                                                \
		memset(&(_s), 0, sizeof(_s));                               \
		(_s).__doca_api_version = UROM_PLUGIN_IFACE_VERSION;        \
	} while (0)
/* Zeroes the struct `_ptr` points to, then stamps it. */
#define DOCA_STRUCT_PTR_MEMSET_CTOR(_ptr) DOCA_STRUCT_MEMSET_CTOR(*(_ptr))
/* The first designator of a stamped initializer: `{ DOCA_STRUCT_CTOR_LIST_START, .open = ... }`. */
#define DOCA_STRUCT_CTOR_LIST_START .__doca_api_version = UROM_PLUGIN_IFACE_VERSION
/* Defines `struct _tag _name`, stamped and otherwise zero. */
#define DOCA_STRUCT_DEF(_tag, _name) struct _tag _name = {DOCA_STRUCT_CTOR_LIST_START}

#ifdef __cplusplus
}
#endif

#endif /* DOCA_COMPAT_H_ */
