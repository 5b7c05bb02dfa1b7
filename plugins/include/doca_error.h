/*
 * doca_error.h - the status codes of the DOCA SDK, as urom uses them.
 *
 * The names and values are DOCA's, so a plugin written for DOCA UROM compiles unchanged; urom's
 * Rust side numbers its statuses the same way (urom-wire's Status).
 *
 * doca_error_get_name() and doca_error_get_descr() are defined here as weak functions, so a
 * plugin that calls them needs no library at run time; where a process provides its own
 * (DOCA's libdoca_common), that one is used instead.
 */
#ifndef DOCA_ERROR_H_
#define DOCA_ERROR_H_

#include <doca_compat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The outcome of an operation. */
typedef enum doca_error {
	DOCA_SUCCESS = 0,
	DOCA_ERROR_UNKNOWN = 1,
	DOCA_ERROR_NOT_PERMITTED = 2,
	DOCA_ERROR_IN_USE = 3,
	DOCA_ERROR_NOT_SUPPORTED = 4,
	DOCA_ERROR_AGAIN = 5,
	DOCA_ERROR_INVALID_VALUE = 6,
	DOCA_ERROR_NO_MEMORY = 7,
	DOCA_ERROR_INITIALIZATION = 8,
	DOCA_ERROR_TIME_OUT = 9,
	DOCA_ERROR_SHUTDOWN = 10,
	DOCA_ERROR_CONNECTION_RESET = 11,
	DOCA_ERROR_CONNECTION_ABORTED = 12,
	DOCA_ERROR_CONNECTION_INPROGRESS = 13,
	DOCA_ERROR_NOT_CONNECTED = 14,
	DOCA_ERROR_NO_LOCK = 15,
	DOCA_ERROR_NOT_FOUND = 16,
	DOCA_ERROR_IO_FAILED = 17,
	DOCA_ERROR_BAD_STATE = 18,
	DOCA_ERROR_UNSUPPORTED_VERSION = 19,
	DOCA_ERROR_OPERATING_SYSTEM = 20,
	DOCA_ERROR_DRIVER = 21,
	DOCA_ERROR_UNEXPECTED = 22,
	DOCA_ERROR_ALREADY_EXIST = 23,
	DOCA_ERROR_FULL = 24,
	DOCA_ERROR_EMPTY = 25,
	DOCA_ERROR_IN_PROGRESS = 26,
	DOCA_ERROR_TOO_BIG = 27,
	DOCA_ERROR_AUTHENTICATION = 28,
	DOCA_ERROR_BAD_CONFIG = 29,
	DOCA_ERROR_SKIPPED = 30,
	DOCA_ERROR_DEVICE_FATAL_ERROR = 31,
} doca_error_t;

/* Whether a status is an error. */
#define DOCA_IS_ERROR(_result) ((_result) != DOCA_SUCCESS)

/* Keeps the first error: sets `_result` to `_new_result` unless `_result` already holds one. */
#define DOCA_ERROR_PROPAGATE(_result, _new_result)          \
	do {                                                \
		if ((_result) == DOCA_SUCCESS)              \
			(_result) = (_new_result);          \
	} while (0)

/* The constant's name ("DOCA_ERROR_NOT_FOUND"); "DOCA_ERROR_UNRECOGNIZED" for other values. */
const char *doca_error_get_name(doca_error_t error);

/* A short description of the code. */
const char *doca_error_get_descr(doca_error_t error);

#if defined(__GNUC__) || defined(__clang__)
#define UROM_DOCA_WEAK_ __attribute__((weak))
#else
#define UROM_DOCA_WEAK_
#endif

/* Name and description of each code, indexed by value. */
#define UROM_DOCA_ERROR_TABLE_(_entry)                                                        \
	_entry(DOCA_SUCCESS, "Success")                                                       \
	_entry(DOCA_ERROR_UNKNOWN, "Unknown error")                                           \
	_entry(DOCA_ERROR_NOT_PERMITTED, "Operation not permitted")                           \
	_entry(DOCA_ERROR_IN_USE, "Resource in use")                                          \
	_entry(DOCA_ERROR_NOT_SUPPORTED, "Operation not supported")                           \
	_entry(DOCA_ERROR_AGAIN, "Resource temporarily unavailable, try again")               \
	_entry(DOCA_ERROR_INVALID_VALUE, "Invalid input")                                     \
	_entry(DOCA_ERROR_NO_MEMORY, "Out of memory")                                         \
	_entry(DOCA_ERROR_INITIALIZATION, "Initialization failed")                            \
	_entry(DOCA_ERROR_TIME_OUT, "Timed out")                                              \
	_entry(DOCA_ERROR_SHUTDOWN, "Shut down in progress")                                  \
	_entry(DOCA_ERROR_CONNECTION_RESET, "Connection reset by peer")                       \
	_entry(DOCA_ERROR_CONNECTION_ABORTED, "Connection aborted")                           \
	_entry(DOCA_ERROR_CONNECTION_INPROGRESS, "Connection in progress")                    \
	_entry(DOCA_ERROR_NOT_CONNECTED, "Not connected")                                     \
	_entry(DOCA_ERROR_NO_LOCK, "Could not take a lock")                                   \
	_entry(DOCA_ERROR_NOT_FOUND, "Not found")                                             \
	_entry(DOCA_ERROR_IO_FAILED, "Input/output operation failed")                         \
	_entry(DOCA_ERROR_BAD_STATE, "Not allowed in the current state")                      \
	_entry(DOCA_ERROR_UNSUPPORTED_VERSION, "Unsupported version")                         \
	_entry(DOCA_ERROR_OPERATING_SYSTEM, "Operating system call failed")                   \
	_entry(DOCA_ERROR_DRIVER, "Driver call failed")                                       \
	_entry(DOCA_ERROR_UNEXPECTED, "Unexpected condition")                                 \
	_entry(DOCA_ERROR_ALREADY_EXIST, "Already exists")                                    \
	_entry(DOCA_ERROR_FULL, "No more room")                                               \
	_entry(DOCA_ERROR_EMPTY, "Nothing available")                                         \
	_entry(DOCA_ERROR_IN_PROGRESS, "In progress")                                         \
	_entry(DOCA_ERROR_TOO_BIG, "Too big")                                                 \
	_entry(DOCA_ERROR_AUTHENTICATION, "Authentication failed")                            \
	_entry(DOCA_ERROR_BAD_CONFIG, "Invalid configuration")                                \
	_entry(DOCA_ERROR_SKIPPED, "Result valid, earlier output dropped")                    \
	_entry(DOCA_ERROR_DEVICE_FATAL_ERROR, "Device hit a fatal error")

#define UROM_DOCA_ERROR_NAME_(_code, _descr) #_code,
#define UROM_DOCA_ERROR_DESCR_(_code, _descr) _descr,

UROM_DOCA_WEAK_ const char *doca_error_get_name(doca_error_t error)
{
	static const char *const names[] = {UROM_DOCA_ERROR_TABLE_(UROM_DOCA_ERROR_NAME_)};

	if ((unsigned int)error >= sizeof(names) / sizeof(names[0]))
		return "DOCA_ERROR_UNRECOGNIZED";
	return names[error];
}

UROM_DOCA_WEAK_ const char *doca_error_get_descr(doca_error_t error)
{
	static const char *const descrs[] = {UROM_DOCA_ERROR_TABLE_(UROM_DOCA_ERROR_DESCR_)};

	if ((unsigned int)error >= sizeof(descrs) / sizeof(descrs[0]))
		return "Unrecognized error code";
	return descrs[error];
}

#undef UROM_DOCA_ERROR_NAME_
#undef UROM_DOCA_ERROR_DESCR_

#ifdef __cplusplus
}
#endif

#endif /* DOCA_ERROR_H_ */
