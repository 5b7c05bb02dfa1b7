/*
 * doca_log.h - logging for DOCA hosts: sources, backends, levels.
 *
 * A source file names its log source once and logs with printf-style macros:
 *
 *   DOCA_LOG_REGISTER(MY_APP::MAIN);
 *   ...
 *   DOCA_LOG_ERR("cannot open %s", path);
 *
 * Messages go to the program's backends: doca_log_backend_create_standard() writes info and
 * more verbose messages to stdout and warnings and more severe ones to stderr;
 * doca_log_backend_create_with_file() and _with_fd() write to a stream. A backend shows the
 * levels between its upper limit (most severe; default critical) and its lower limit (most
 * verbose; default info, doca_log_level_set_global_lower_limit() or -l on the command line).
 * SDK backends (_sdk functions) show urom's own messages up to their level; while none exists,
 * urom's errors go to stderr.
 *
 * A line reads `[HH:MM:SS:micro][pid][DOCA][LVL][file:line][function] message`.
 *
 * This is the host's doca_log.h; plugins include plugins/include/doca_log.h (same guard), whose
 * messages go to their worker's log.
 */
#ifndef DOCA_LOG_H_
#define DOCA_LOG_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <doca_compat.h>
#include <doca_error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a logger name, NUL included. */
#define DOCA_LOGGER_NAME_SIZE 256

/* Log levels, from quiet to verbose. */
enum doca_log_level {
	DOCA_LOG_LEVEL_DISABLE = 10,
	DOCA_LOG_LEVEL_CRIT = 20,
	DOCA_LOG_LEVEL_ERROR = 30,
	DOCA_LOG_LEVEL_WARNING = 40,
	DOCA_LOG_LEVEL_INFO = 50,
	DOCA_LOG_LEVEL_DEBUG = 60,
	DOCA_LOG_LEVEL_TRACE = 70,
};

struct doca_log_backend;

DOCA_EXPERIMENTAL
uint32_t doca_log_get_max_num_backends(void);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_set_level_lower_limit(struct doca_log_backend *backend, uint32_t level);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_set_level_upper_limit(struct doca_log_backend *backend, uint32_t upper_limit);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_set_level_lower_limit_strict(struct doca_log_backend *backend);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_set_level_upper_limit_strict(struct doca_log_backend *backend);

DOCA_EXPERIMENTAL
doca_error_t doca_log_level_set_global_lower_limit(uint32_t level);

DOCA_EXPERIMENTAL
doca_error_t doca_log_level_set_global_upper_limit(uint32_t upper_limit);

DOCA_EXPERIMENTAL
uint32_t doca_log_level_get_global_lower_limit(void);

DOCA_EXPERIMENTAL
uint32_t doca_log_level_get_global_upper_limit(void);

DOCA_EXPERIMENTAL
doca_error_t doca_log_register_source(const char *source_name, int *source);

DOCA_EXPERIMENTAL
doca_error_t doca_log_unregister_source(int source);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_create_with_file(FILE *fptr, struct doca_log_backend **backend);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_create_with_fd(int fd, struct doca_log_backend **backend);

DOCA_EXPERIMENTAL
uint32_t doca_log_get_max_num_backends_sdk(void);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_set_sdk_level(struct doca_log_backend *backend, uint32_t level);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_create_with_file_sdk(FILE *fptr, struct doca_log_backend **backend);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_create_with_fd_sdk(int fd, struct doca_log_backend **backend);

DOCA_EXPERIMENTAL
doca_error_t doca_log_level_set_global_sdk_limit(uint32_t level);

DOCA_EXPERIMENTAL
uint32_t doca_log_level_get_global_sdk_limit(void);

DOCA_EXPERIMENTAL
doca_error_t doca_log_backend_create_standard(void);

/* The library's entry points for doca_log() below: whether any backend shows `level`, and one
 * formatted message. */
DOCA_STABLE
int urom_doca_log_enabled(uint32_t level);

DOCA_STABLE
doca_error_t urom_doca_log_message(uint32_t level,
				   int source,
				   const char *fname,
				   int line,
				   const char *func,
				   const char *message);

#if defined(__GNUC__) || defined(__clang__)
#define UROM_DOCA_LOG_PRINTF_(_fmt, _args) __attribute__((format(printf, _fmt, _args)))
#else
#define UROM_DOCA_LOG_PRINTF_(_fmt, _args)
#endif

/* Logs a message of `level` from `source` (a registered source); prefer DOCA_LOG_*(). The message
 * is formatted here, in the caller, and cut at 2047 bytes. */
UROM_DOCA_LOG_PRINTF_(6, 7)
static inline doca_error_t doca_log(uint32_t level,
				    int source,
				    const char *fname,
				    int line,
				    const char *func,
				    const char *format,
				    ...)
{
	char message[2048];
	va_list args;

	if (!urom_doca_log_enabled(level))
		return DOCA_SUCCESS;
	va_start(args, format);
	vsnprintf(message, sizeof(message), format, args);
	va_end(args);
	return urom_doca_log_message(level, source, fname, line, func, message);
}

/* Logs at `level` (an enum doca_log_level) from this file's source. */
#define DOCA_LOG(level, format, ...) doca_log(level, log_source, __FILE__, __LINE__, __func__, format, ##__VA_ARGS__)

#define DOCA_LOG_CRIT(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_CRIT, format, ##__VA_ARGS__)
#define DOCA_LOG_ERR(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_ERROR, format, ##__VA_ARGS__)
#define DOCA_LOG_WARN(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_WARNING, format, ##__VA_ARGS__)
#define DOCA_LOG_INFO(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_INFO, format, ##__VA_ARGS__)
#define DOCA_LOG_DBG(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_DEBUG, format, ##__VA_ARGS__)
#ifdef DOCA_LOGGING_ALLOW_TRACE
#define DOCA_LOG_TRC(format, ...) DOCA_LOG(DOCA_LOG_LEVEL_TRACE, format, ##__VA_ARGS__)
#else
#define DOCA_LOG_TRC(format, ...) \
	do { \
	} while (0)
#endif

/* Registers this file's log source before main() runs (one per file). */
#define DOCA_LOG_REGISTER(source) \
	static int log_source; \
	static void __attribute__((constructor(101), used)) urom_doca_log_register_source_(void) \
	{ \
		doca_log_register_source(#source, &log_source); \
	}

#ifdef __cplusplus
}
#endif

#endif /* DOCA_LOG_H_ */
