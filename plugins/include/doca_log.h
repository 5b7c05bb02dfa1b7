/*
 * doca_log.h - the logging macros of the DOCA SDK, for urom plugins.
 *
 * A source file names its log source once and logs with printf-style macros:
 *
 *   DOCA_LOG_REGISTER(MY_PLUGIN);
 *   ...
 *   DOCA_LOG_ERR("bad command type %lu", type);
 *
 * Each message is one line on the worker's standard error, which the daemon keeps in the
 * worker's log file (urom_worker_<pid>_dev.log):
 *
 *   [plugin MY_PLUGIN] ERROR worker_my.c:42 handle_cmd: bad command type 7
 *
 * (the source file's name without its directories, the line, the function).
 *
 * Messages up to the level in the environment variable UROM_PLUGIN_LOG_LEVEL (a number, as
 * the daemon's --sdk-log-level: 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70
 * trace) are written; the default is 50. A host sets it for its workers through the worker's
 * environment. DOCA_LOG_TRC compiles to nothing unless DOCA_LOGGING_ALLOW_TRACE is defined,
 * as with DOCA.
 *
 * Everything here is inline: a plugin needs no library for it at run time.
 */
#ifndef DOCA_LOG_H_
#define DOCA_LOG_H_

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_compat.h>
#include <doca_error.h>

#ifdef __cplusplus
extern "C" {
#endif

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

/* The environment variable that sets the most verbose level written. */
#define UROM_PLUGIN_LOG_LEVEL_ENV "UROM_PLUGIN_LOG_LEVEL"

#if defined(__GNUC__) || defined(__clang__)
#define UROM_DOCA_LOG_PRINTF_(_fmt, _args) __attribute__((format(printf, _fmt, _args)))
#define UROM_DOCA_LOG_UNUSED_ __attribute__((unused))
#else
#define UROM_DOCA_LOG_PRINTF_(_fmt, _args)
#define UROM_DOCA_LOG_UNUSED_
#endif

/* The most verbose level written: UROM_PLUGIN_LOG_LEVEL when it holds a level, else info.
 * Read once per source file. */
static inline int urom_doca_log_threshold_(void)
{
	static int threshold; /* 0 until read */
	int value = __atomic_load_n(&threshold, __ATOMIC_RELAXED);

	if (value == 0) {
		const char *text = getenv(UROM_PLUGIN_LOG_LEVEL_ENV);
		char *end = NULL;
		long parsed = text != NULL ? strtol(text, &end, 10) : 0;

		value = DOCA_LOG_LEVEL_INFO;
		if (text != NULL && end != text && *end == '\0' && parsed >= DOCA_LOG_LEVEL_DISABLE &&
		    parsed <= DOCA_LOG_LEVEL_TRACE)
			value = (int)parsed;
		__atomic_store_n(&threshold, value, __ATOMIC_RELAXED);
	}
	return value;
}

/* Whether a message of `level` is written. */
static inline int urom_doca_log_enabled_(int level)
{
	return level > DOCA_LOG_LEVEL_DISABLE && level <= urom_doca_log_threshold_();
}

static inline const char *urom_doca_log_level_name_(int level)
{
	switch (level) {
	case DOCA_LOG_LEVEL_CRIT:
		return "CRIT";
	case DOCA_LOG_LEVEL_ERROR:
		return "ERROR";
	case DOCA_LOG_LEVEL_WARNING:
		return "WARN";
	case DOCA_LOG_LEVEL_INFO:
		return "INFO";
	case DOCA_LOG_LEVEL_DEBUG:
		return "DEBUG";
	default:
		return "TRACE";
	}
}

/* Formats one message and writes it as a single line, so lines of concurrent writers do not
 * mix. A message longer than the line buffer is cut. */
UROM_DOCA_LOG_PRINTF_(6, 7)
static inline void urom_doca_log_(int level, const char *source, const char *file, int line,
				  const char *func, const char *format, ...)
{
	char buffer[1024];
	const char *base = strrchr(file, '/');
	int used;
	va_list args;

	if (!urom_doca_log_enabled_(level))
		return;
	used = snprintf(buffer, sizeof(buffer), "[plugin %s] %s %s:%d %s: ", source,
			urom_doca_log_level_name_(level), base != NULL ? base + 1 : file, line, func);
	if (used < 0)
		return;
	if ((size_t)used < sizeof(buffer) - 1) {
		int body;

		va_start(args, format);
		body = vsnprintf(buffer + used, sizeof(buffer) - 1 - (size_t)used, format, args);
		va_end(args);
		if (body > 0)
			used += body;
	}
	if ((size_t)used > sizeof(buffer) - 2)
		used = (int)sizeof(buffer) - 2;
	buffer[used] = '\n';
	fwrite(buffer, 1, (size_t)used + 1, stderr);
}

/* Names this source file's log source (DOCA writes it as `A::B::C`; any text will do). */
#define DOCA_LOG_REGISTER(_source) \
	static const char urom_doca_log_source_[] UROM_DOCA_LOG_UNUSED_ = #_source

/* Logs at `level` (an enum doca_log_level). */
#define DOCA_LOG(_level, ...) \
	urom_doca_log_((_level), urom_doca_log_source_, __FILE__, __LINE__, __func__, __VA_ARGS__)

#define DOCA_LOG_CRIT(...) DOCA_LOG(DOCA_LOG_LEVEL_CRIT, __VA_ARGS__)
#define DOCA_LOG_ERR(...) DOCA_LOG(DOCA_LOG_LEVEL_ERROR, __VA_ARGS__)
#define DOCA_LOG_WARN(...) DOCA_LOG(DOCA_LOG_LEVEL_WARNING, __VA_ARGS__)
#define DOCA_LOG_INFO(...) DOCA_LOG(DOCA_LOG_LEVEL_INFO, __VA_ARGS__)
#define DOCA_LOG_DBG(...) DOCA_LOG(DOCA_LOG_LEVEL_DEBUG, __VA_ARGS__)
#ifdef DOCA_LOGGING_ALLOW_TRACE
#define DOCA_LOG_TRC(...) DOCA_LOG(DOCA_LOG_LEVEL_TRACE, __VA_ARGS__)
#else
/* Compiled out; the arguments are still checked. */
#define DOCA_LOG_TRC(...)                                      \
	do {                                                   \
		if (0)                                         \
			DOCA_LOG(DOCA_LOG_LEVEL_TRACE, __VA_ARGS__); \
	} while (0)
#endif

#ifdef __cplusplus
}
#endif

#endif /* DOCA_LOG_H_ */
