/*
 * doca_argp.h - the command line (or a JSON file) of a DOCA program.
 *
 * doca_argp_init(), then register flags (each with a callback that receives the value and the
 * program's configuration), then doca_argp_start(argc, argv): it parses, runs the callbacks in
 * command-line order and the validation callback, and returns DOCA_ERROR_NOT_SUPPORTED for an
 * unknown flag and DOCA_ERROR_INVALID_VALUE for a bad or missing value (with an SDK log line).
 * Every program also takes -h/--help (usage, exit), -v/--version (version, exit),
 * -l/--log-level, --sdk-log-level and -j/--json FILE (an object keyed by long names, flat or in
 * `doca_general_flags` / `doca_program_flags` sections; the command line wins over it).
 *
 * Values: DOCA_ARGP_TYPE_STRING passes a `char *`, _INT an `int *`, _BOOLEAN a `bool *` (true
 * when the flag is given without a value), _DOUBLE a `double *`; each is valid during its
 * callback only. Device and representor flags need hardware: registering one gives
 * DOCA_ERROR_NOT_SUPPORTED. Commands, DPDK flags and the logger callback are not offered.
 */
#ifndef DOCA_ARGP_H_
#define DOCA_ARGP_H_

#include <stdarg.h>

#include <doca_compat.h>
#include <doca_dev.h>
#include <doca_error.h>
#include <doca_log.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A flag's callback: its value, then the program's configuration. */
typedef doca_error_t (*doca_argp_param_cb_t)(void *, void *);

/* The program's validation callback: its configuration. */
typedef doca_error_t (*doca_argp_validation_cb_t)(void *);

/* Flag types. */
enum doca_argp_type {
	DOCA_ARGP_TYPE_UNKNOWN = 0,
	DOCA_ARGP_TYPE_STRING,
	DOCA_ARGP_TYPE_INT,
	DOCA_ARGP_TYPE_BOOLEAN,
	DOCA_ARGP_TYPE_DEVICE,	   /* not supported */
	DOCA_ARGP_TYPE_DEVICE_REP, /* not supported */
	DOCA_ARGP_TYPE_DOUBLE,
};

struct doca_argp_param;

/* Prints the usage text. */
DOCA_EXPERIMENTAL
void doca_argp_usage(void);

/* DOCA_ERROR_BAD_STATE when already initialized. */
DOCA_EXPERIMENTAL
doca_error_t doca_argp_init(const char *program_name, void *program_config);

/* The parser owns the flag from then on, whatever the outcome. A flag needs a name, a
 * description and a callback (DOCA_ERROR_INITIALIZATION otherwise); a name already taken gives
 * DOCA_ERROR_INVALID_VALUE. */
DOCA_EXPERIMENTAL
doca_error_t doca_argp_register_param(struct doca_argp_param *input_param);

DOCA_EXPERIMENTAL
doca_error_t doca_argp_register_version_callback(doca_argp_param_cb_t callback);

DOCA_EXPERIMENTAL
doca_error_t doca_argp_register_validation_callback(doca_argp_validation_cb_t callback);

DOCA_EXPERIMENTAL
doca_error_t doca_argp_start(int argc, char **argv);

DOCA_EXPERIMENTAL
doca_error_t doca_argp_destroy(void);

/* DOCA_ERROR_BAD_STATE before doca_argp_init(). */
DOCA_EXPERIMENTAL
doca_error_t doca_argp_param_create(struct doca_argp_param **param);

DOCA_EXPERIMENTAL
void doca_argp_param_set_short_name(struct doca_argp_param *param, const char *name);

DOCA_EXPERIMENTAL
void doca_argp_param_set_long_name(struct doca_argp_param *param, const char *name);

DOCA_EXPERIMENTAL
void doca_argp_param_set_arguments(struct doca_argp_param *param, const char *arguments);

DOCA_EXPERIMENTAL
void doca_argp_param_set_description(struct doca_argp_param *param, const char *description);

DOCA_EXPERIMENTAL
void doca_argp_param_set_callback(struct doca_argp_param *param, doca_argp_param_cb_t callback);

DOCA_EXPERIMENTAL
void doca_argp_param_set_type(struct doca_argp_param *param, enum doca_argp_type type);

DOCA_EXPERIMENTAL
void doca_argp_param_set_mandatory(struct doca_argp_param *param);

DOCA_EXPERIMENTAL
void doca_argp_param_set_cli_only(struct doca_argp_param *param);

DOCA_EXPERIMENTAL
void doca_argp_param_set_multiplicity(struct doca_argp_param *param);

/* Only a flag that was not registered. */
DOCA_EXPERIMENTAL
doca_error_t doca_argp_param_destroy(struct doca_argp_param *param);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_ARGP_H_ */
