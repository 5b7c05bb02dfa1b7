/*
 * check.h - the checks of urom's C API tests: a failed check names the file, line, condition
 * and what was seen, and ends the program with status 2.
 */
#ifndef UROM_TEST_CHECK_H_
#define UROM_TEST_CHECK_H_

#include <stdio.h>
#include <stdlib.h>

#include <doca_error.h>

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(2);                                                           \
		}                                                                          \
	} while (0)

/* The call returns DOCA_SUCCESS. */
#define OK(call)                                                                           \
	do {                                                                               \
		doca_error_t r_ = (call);                                                  \
		CHECK(r_ == DOCA_SUCCESS, "%s: %s", #call, doca_error_get_name(r_));       \
	} while (0)

/* The call returns `expected`. */
#define IS(expected, call)                                                                 \
	do {                                                                               \
		doca_error_t r_ = (call);                                                  \
		CHECK(r_ == (expected), "%s: %s, expected %s", #call, doca_error_get_name(r_), \
		      doca_error_get_name(expected));                                      \
	} while (0)

#endif /* UROM_TEST_CHECK_H_ */
