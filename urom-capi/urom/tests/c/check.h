/*
 * check.h - the checks of urom's C API tests: a failed check names the file, line, condition
 * and what was seen, and ends the program with status 2. With them, the checked copy of a
 * worker command's answer.
 */
#ifndef UROM_TEST_CHECK_H_
#define UROM_TEST_CHECK_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_buf.h>
#include <doca_error.h>
#include <doca_urom.h>

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

/* Copies the answer of a finished worker command, at most `room` bytes, into `into`; its length. */
static inline size_t copy_response(struct doca_urom_worker_cmd_task *task, void *into, size_t room)
{
	struct doca_buf *response = doca_urom_worker_cmd_task_get_response(task);
	void *data;
	size_t len;

	OK(doca_buf_get_data(response, &data));
	OK(doca_buf_get_data_len(response, &len));
	CHECK(len <= room, "an answer of %zu bytes where %zu fit", len, room);
	memcpy(into, data, len);
	return len;
}

#endif /* UROM_TEST_CHECK_H_ */
